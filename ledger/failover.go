package ledger

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
)

// Why a connection no longer reaches a writable primary: the values of
// FailoverReason, and of the reason label of the daemon's
// ledgerkeeper_database_reconnects_total.
const (
	// ReasonReadOnly: SQLSTATE 25006 read_only_sql_transaction. The node
	// refuses writes: it was demoted to a standby, or turned read-only in
	// place (default_transaction_read_only, as Aurora's old writer does
	// after a role flip) without closing its sockets.
	ReasonReadOnly = "read_only"
	// ReasonRecovery: SQLSTATE 0A000 "… during recovery": a standby.
	ReasonRecovery = "recovery"
	// ReasonShutdown: SQLSTATE 57P01 admin_shutdown, 57P02 crash_shutdown
	// or 57P03 cannot_connect_now: the node is going away or not up yet.
	ReasonShutdown = "shutdown"
	// ReasonConnection: SQLSTATE class 08 (connection exception), or the
	// connection broke under the statement (reset, EOF): the node died or
	// the network between us did.
	ReasonConnection = "connection"
	// ReasonNotWritable: a writability check (Follower.CheckWritable) found
	// the node read-only or in recovery before any write failed there.
	ReasonNotWritable = "not_writable"
)

// FailoverReason reports whether err says that the connection it came from
// no longer reaches a writable primary, and why (one of the Reason*
// constants): the errors a failover or a role flip produces. Such a
// connection is worth discarding, and every other connection to the same
// node with it. A caller's own cancellation or deadline is never one, nor
// is any other SQL error (a constraint, a syntax error, a serialization
// failure).
func FailoverReason(err error) (string, bool) {
	if err == nil || errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded) {
		return "", false
	}
	var pe *pgconn.PgError
	if errors.As(err, &pe) {
		switch {
		case pe.Code == "25006":
			return ReasonReadOnly, true
		case (pe.Code == "57P01" || pe.Code == "57P02" || pe.Code == "57P03") && pe.Severity != "ERROR":
			// FATAL: this server is shutting down, crashed or not up yet.
			// As an ERROR it comes over a session that still works,
			// relayed from a server this one talks to (a Citus worker
			// stopped under a statement): this node did not fail over.
			return ReasonShutdown, true
		case pe.Code == "0A000" && strings.Contains(pe.Message, "recovery"):
			return ReasonRecovery, true
		case strings.HasPrefix(pe.Code, "08") && pe.Severity != "ERROR":
			// FATAL: the server ends this session. An ERROR of class 08
			// comes over a session that still works: the server relays a
			// connection it failed to make itself (a Citus coordinator's
			// worker is down, a foreign server); this node did not fail
			// over, and leaving it would only reconnect every connection
			// to it again and again.
			return ReasonConnection, true
		}
		return "", false
	}
	var ne net.Error
	if errors.As(err, &ne) || errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) ||
		errors.Is(err, syscall.ECONNRESET) || errors.Is(err, syscall.ECONNREFUSED) || errors.Is(err, syscall.EPIPE) ||
		errors.Is(err, net.ErrClosed) || isConnClosed(err) {
		return ReasonConnection, true
	}
	return "", false
}

// isConnClosed: pgx's own error for a statement on a connection it already
// closed after an earlier failure.
func isConnClosed(err error) bool {
	return strings.Contains(err.Error(), "conn closed")
}

// NothingWritten reports whether err proves that the statement it came from
// changed nothing: the server refused it as a write on a read-only node or
// a standby, refused the connection, or pgx never sent it. Retrying such a
// statement on another connection cannot apply it twice. Any other failure
// of a write, a broken connection above all, leaves its commit unknown.
func NothingWritten(err error) bool {
	if err == nil {
		return false
	}
	if reason, ok := FailoverReason(err); ok {
		switch reason {
		case ReasonReadOnly, ReasonRecovery:
			return true
		}
	}
	var pe *pgconn.PgError
	if errors.As(err, &pe) && pe.Code == "57P03" {
		return true
	}
	return pgconn.SafeToRetry(err)
}

// FollowOptions tune FollowPrimary. Every field is optional.
type FollowOptions struct {
	// OnFailover is called once each time the pool finds that its node
	// failed over (the first failing statement, or a failed writability
	// check, while the Follower held the database writable), with the
	// reason and the error that showed it: the place for one log line and
	// a counter per failover. It runs on the goroutine of
	// the statement that failed; keep it short.
	OnFailover func(reason string, err error)
	// OnWritable is called with true or false each time the writability the
	// Follower knows of changes (a failover makes it false; a successful
	// CheckWritable true again).
	OnWritable func(writable bool)
}

// Follower keeps a pgxpool.Pool on the writable primary across failovers.
// FollowPrimary installs it on a pool's configuration. Every connection
// carries the generation of the pool it was opened in; the first statement
// that fails with an error FailoverReason recognises (or a CheckWritable
// that finds the node read-only) starts a new generation, and from then on
// every connection of an older one is discarded instead of being handed out
// (pgxpool's PrepareConn; the acquire then takes or opens another). New
// connections go wherever the URL leads: with several hosts and
// target_session_attrs=read-write, to the one that accepts writes now.
//
// The check costs no round trip on the hot path: one atomic load per
// acquire, and a tracer call per statement. A node that turned read-only without closing its
// sockets is left at the first write it refuses (Claim and Complete retry
// such a write once on a fresh connection: NothingWritten) or at the next
// CheckWritable, whichever comes first.
type Follower struct {
	gen      atomic.Uint64
	writable atomic.Bool
	opts     FollowOptions
	mu       sync.Mutex // serialises OnWritable calls
}

// genKey and condemnedKey are the Follower's entries in a connection's
// pgconn.CustomData.
const (
	genKey       = "ledgerkeeper.generation"
	condemnedKey = "ledgerkeeper.condemned"
)

// FollowPrimary makes the pool built from pc follow the writable primary
// (see Follower) and returns the Follower. It keeps the hooks and tracer pc
// already has, calling them first (a hook before acquire must be
// PrepareConn: pgxpool ignores the deprecated BeforeAcquire once
// PrepareConn is set). When pc names several hosts and no
// target_session_attrs was given (pgx's default, "any", would settle on the
// first host that answers, a standby included), it sets read-write: a
// ledger's pool must be able to write.
func FollowPrimary(pc *pgxpool.Config, opts FollowOptions) *Follower {
	f := &Follower{opts: opts}
	f.writable.Store(true)
	f.Follow(pc)
	return f
}

// Follow makes one more pool, built from pc, follow the primary with f:
// several pools on one database (a process that keeps a pool per ledger of
// it) follow it together. A failover any of them sees starts a new
// generation for all, reported once; each leaves the old node at its next
// acquire.
func (f *Follower) Follow(pc *pgxpool.Config) {
	if len(pc.ConnConfig.Fallbacks) > 0 && pc.ConnConfig.ValidateConnect == nil &&
		!strings.Contains(pc.ConnString(), "target_session_attrs") {
		pc.ConnConfig.ValidateConnect = pgconn.ValidateConnectTargetSessionAttrsReadWrite
	}
	pc.ConnConfig.Tracer = &followTracer{f: f, inner: pc.ConnConfig.Tracer}

	afterConnect := pc.AfterConnect
	pc.AfterConnect = func(ctx context.Context, c *pgx.Conn) error {
		c.PgConn().CustomData()[genKey] = f.gen.Load()
		if afterConnect != nil {
			return afterConnect(ctx, c)
		}
		return nil
	}
	prepare := pc.PrepareConn
	pc.PrepareConn = func(ctx context.Context, c *pgx.Conn) (bool, error) {
		if f.stale(c) {
			return false, nil // destroyed; pgxpool acquires another
		}
		if prepare != nil {
			return prepare(ctx, c)
		}
		return true, nil
	}
	// No AfterRelease: pgxpool runs that hook on a goroutine of its own
	// per release (measured: +40% of the Go side's CPU per claim). A stale
	// connection waits idle until it is next acquired, and goes then.
}

// NewPool opens a pool on the ledger database at connString (a URL or DSN;
// several hosts welcome: postgres://h1,h2/db?target_session_attrs=read-write)
// that follows the primary across failovers (FollowPrimary). Use it, or
// FollowPrimary on a configuration of your own, for the pool a tool server
// passes to Middleware, mcpkey or Run.
func NewPool(ctx context.Context, connString string, opts FollowOptions) (*pgxpool.Pool, *Follower, error) {
	pc, err := pgxpool.ParseConfig(connString)
	if err != nil {
		// pgx's parse errors may quote the string, password included.
		return nil, nil, errors.New("ledger: the database connection string is not a valid PostgreSQL URL or DSN")
	}
	f := FollowPrimary(pc, opts)
	pool, err := pgxpool.NewWithConfig(ctx, pc)
	if err != nil {
		return nil, nil, err
	}
	return pool, f, nil
}

// Writable is what the Follower knows: false from a failover until a
// CheckWritable succeeds, true otherwise.
func (f *Follower) Writable() bool { return f.writable.Load() }

// Generation counts the failovers the Follower has seen (0 at first).
func (f *Follower) Generation() uint64 { return f.gen.Load() }

// CheckWritable asks the node of one of db's connections whether it takes
// writes now (one round trip: not in recovery, not read-only). When it does
// not, the pool leaves that node (a new generation, as after a failed
// write) and CheckWritable returns an error naming why. Run it on a timer
// and from a readiness probe: it finds a node that turned read-only before
// any write is refused there.
func (f *Follower) CheckWritable(ctx context.Context, db *pgxpool.Pool) error {
	c, err := db.Acquire(ctx)
	if err != nil {
		if ctx.Err() == nil {
			// No node of the URL takes a connection (or a writable
			// one): the idle connections to the old node go too.
			f.gen.Add(1)
			f.down(ReasonConnection, err)
		}
		return fmt.Errorf("no connection to a writable primary: %w", err)
	}
	defer c.Release()
	var recovery bool
	var readOnly string
	err = c.QueryRow(ctx, `SELECT pg_is_in_recovery(), current_setting('transaction_read_only')`).Scan(&recovery, &readOnly)
	if err != nil {
		if _, ok := FailoverReason(err); !ok && ctx.Err() == nil {
			f.down(ReasonConnection, err)
		}
		return fmt.Errorf("writability check: %w", err)
	}
	if recovery || readOnly == "on" {
		why := "in recovery (a standby)"
		if !recovery {
			why = "read-only (transaction_read_only = on)"
		}
		err := fmt.Errorf("the database node is %s", why)
		f.condemn(c.Conn(), ReasonNotWritable, err)
		return err
	}
	f.setWritable(true)
	return nil
}

// stale: c was opened before the pool's current generation, or a statement
// on it showed its node failed over.
func (f *Follower) stale(c *pgx.Conn) bool {
	data := c.PgConn().CustomData()
	if _, bad := data[condemnedKey]; bad {
		return true
	}
	g, _ := data[genKey].(uint64)
	return g < f.gen.Load()
}

// condemn marks c for discarding and, if c belongs to the current
// generation, starts the next one: the first sign of a failover is
// reported, the echoes from other connections of the same node are not.
func (f *Follower) condemn(c *pgx.Conn, reason string, err error) {
	data := c.PgConn().CustomData()
	data[condemnedKey] = reason
	g, _ := data[genKey].(uint64)
	if !f.gen.CompareAndSwap(g, g+1) {
		return // an echo of a failover already seen
	}
	f.down(reason, err)
}

// down records that the database does not take writes. It is reported
// once per failover: while no writable primary has answered since the last
// one, a node found not writable again is the same failover going on.
func (f *Follower) down(reason string, err error) {
	f.mu.Lock()
	was := f.writable.Swap(false)
	if was && f.opts.OnWritable != nil {
		f.opts.OnWritable(false)
	}
	f.mu.Unlock()
	if was && f.opts.OnFailover != nil {
		f.opts.OnFailover(reason, err)
	}
}

func (f *Follower) setWritable(w bool) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.writable.Swap(w) != w && f.opts.OnWritable != nil {
		f.opts.OnWritable(w)
	}
}

// observe is every statement's end: a failover error condemns the
// connection.
func (f *Follower) observe(c *pgx.Conn, err error) {
	if c == nil || err == nil {
		return
	}
	if reason, ok := FailoverReason(err); ok {
		f.condemn(c, reason, err)
	}
}

// followTracer sees the end of every statement on the pool's connections
// (queries, batches, copies, prepares) and passes every call on to the
// tracer the configuration had before.
type followTracer struct {
	f     *Follower
	inner pgx.QueryTracer
}

func (t *followTracer) TraceQueryStart(ctx context.Context, c *pgx.Conn, d pgx.TraceQueryStartData) context.Context {
	if t.inner != nil {
		return t.inner.TraceQueryStart(ctx, c, d)
	}
	return ctx
}

func (t *followTracer) TraceQueryEnd(ctx context.Context, c *pgx.Conn, d pgx.TraceQueryEndData) {
	t.f.observe(c, d.Err)
	if t.inner != nil {
		t.inner.TraceQueryEnd(ctx, c, d)
	}
}

func (t *followTracer) TraceBatchStart(ctx context.Context, c *pgx.Conn, d pgx.TraceBatchStartData) context.Context {
	if bt, ok := t.inner.(pgx.BatchTracer); ok {
		return bt.TraceBatchStart(ctx, c, d)
	}
	return ctx
}

func (t *followTracer) TraceBatchQuery(ctx context.Context, c *pgx.Conn, d pgx.TraceBatchQueryData) {
	t.f.observe(c, d.Err)
	if bt, ok := t.inner.(pgx.BatchTracer); ok {
		bt.TraceBatchQuery(ctx, c, d)
	}
}

func (t *followTracer) TraceBatchEnd(ctx context.Context, c *pgx.Conn, d pgx.TraceBatchEndData) {
	t.f.observe(c, d.Err)
	if bt, ok := t.inner.(pgx.BatchTracer); ok {
		bt.TraceBatchEnd(ctx, c, d)
	}
}

func (t *followTracer) TraceCopyFromStart(ctx context.Context, c *pgx.Conn, d pgx.TraceCopyFromStartData) context.Context {
	if ct, ok := t.inner.(pgx.CopyFromTracer); ok {
		return ct.TraceCopyFromStart(ctx, c, d)
	}
	return ctx
}

func (t *followTracer) TraceCopyFromEnd(ctx context.Context, c *pgx.Conn, d pgx.TraceCopyFromEndData) {
	t.f.observe(c, d.Err)
	if ct, ok := t.inner.(pgx.CopyFromTracer); ok {
		ct.TraceCopyFromEnd(ctx, c, d)
	}
}

func (t *followTracer) TracePrepareStart(ctx context.Context, c *pgx.Conn, d pgx.TracePrepareStartData) context.Context {
	if pt, ok := t.inner.(pgx.PrepareTracer); ok {
		return pt.TracePrepareStart(ctx, c, d)
	}
	return ctx
}

func (t *followTracer) TracePrepareEnd(ctx context.Context, c *pgx.Conn, d pgx.TracePrepareEndData) {
	t.f.observe(c, d.Err)
	if pt, ok := t.inner.(pgx.PrepareTracer); ok {
		pt.TracePrepareEnd(ctx, c, d)
	}
}

func (t *followTracer) TraceConnectStart(ctx context.Context, d pgx.TraceConnectStartData) context.Context {
	if ct, ok := t.inner.(pgx.ConnectTracer); ok {
		return ct.TraceConnectStart(ctx, d)
	}
	return ctx
}

func (t *followTracer) TraceConnectEnd(ctx context.Context, d pgx.TraceConnectEndData) {
	if ct, ok := t.inner.(pgx.ConnectTracer); ok {
		ct.TraceConnectEnd(ctx, d)
	}
}

// retryWrite runs write, and once more when its first failure proves
// nothing was written (NothingWritten: a read-only node, a standby, a
// statement never sent): by then the pool has left the node, and the
// second try goes to whichever node takes writes now. Inside a
// transaction (db is a pgx.Tx) there is no second try: the transaction is
// lost with its connection.
func retryWrite(ctx context.Context, db DBTX, write func() error) error {
	err := write()
	if err == nil || !NothingWritten(err) {
		return err
	}
	if _, inTx := db.(pgx.Tx); inTx {
		return err
	}
	t := time.NewTimer(retryWriteDelay)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return err
	case <-t.C:
	}
	return write()
}

// retryWriteDelay is the pause before retryWrite's second try: long enough
// for the statements in flight on the old node to fail and leave it.
const retryWriteDelay = 50 * time.Millisecond
