package ledger_test

// A tool server's pool across a failover, on real PostgreSQL clusters: a
// role flip between two clusters (the old primary turns read-only without
// closing its sockets, the other starts taking writes), and connections cut
// by a TCP proxy at the worst moments (after a claim's commit, before a
// Complete reached the server).

import (
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strconv"
	"sync"
	"syscall"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/ledgerkeeper/ledgerkeeper/ledger"
	"github.com/ledgerkeeper/ledgerkeeper/ledger/ledgertest"
	"github.com/ledgerkeeper/ledgerkeeper/ledger/ledgertest/pgembed"
	"github.com/ledgerkeeper/ledgerkeeper/ledger/ledgertest/testwait"
)

func TestFailoverReasonNamesTheErrorsOfAFailover(t *testing.T) {
	t.Parallel()
	pg := func(code, msg string) error {
		return fmt.Errorf("claim key: %w", &pgconn.PgError{Severity: "ERROR", Code: code, Message: msg})
	}
	pgFatal := func(code, msg string) error {
		return fmt.Errorf("claim key: %w", &pgconn.PgError{Severity: "FATAL", Code: code, Message: msg})
	}
	for _, c := range []struct {
		name           string
		err            error
		reason         string
		nothingWritten bool
	}{
		{"read-only transaction", pg("25006", "cannot execute INSERT in a read-only transaction"), ledger.ReasonReadOnly, true},
		{"admin shutdown", pgFatal("57P01", "terminating connection due to administrator command"), ledger.ReasonShutdown, false},
		{"crash shutdown", pgFatal("57P02", "terminating connection because of crash of another server process"), ledger.ReasonShutdown, false},
		{"cannot connect now", pgFatal("57P03", "the database system is starting up"), ledger.ReasonShutdown, true},
		{"a coordinator's worker stopped under a statement", pg("57P01", "terminating connection due to administrator command"), "", false},
		{"a coordinator's worker starting up", pg("57P03", "the database system is starting up"), "", true},
		{"during recovery", pg("0A000", "cannot execute LISTEN during recovery"), ledger.ReasonRecovery, true},
		{"connection exception", pgFatal("08006", "connection failure"), ledger.ReasonConnection, false},
		{"protocol violation", pgFatal("08P01", "invalid frontend message type"), ledger.ReasonConnection, false},
		{"a coordinator's worker unreachable", pg("08006", "connection to the remote node postgres@127.0.0.1:5433 failed with the following error: Connection refused"), "", false},
		{"connection reset", &net.OpError{Op: "read", Net: "tcp", Err: syscall.ECONNRESET}, ledger.ReasonConnection, false},
		{"unexpected EOF", fmt.Errorf("read: %w", io.ErrUnexpectedEOF), ledger.ReasonConnection, false},
		{"other 0A000", pg("0A000", "cannot use a set-returning function here"), "", false},
		{"unique violation", pg("23505", "duplicate key"), "", false},
		{"serialization failure", pg("40001", "could not serialize access"), "", false},
		{"caller cancelled", fmt.Errorf("claim key: %w", context.Canceled), "", false},
		{"caller deadline", fmt.Errorf("claim key: %w", context.DeadlineExceeded), "", false},
		{"not found", ledger.ErrNotFound, "", false},
		{"nil", nil, "", false},
	} {
		reason, ok := ledger.FailoverReason(c.err)
		if reason != c.reason || ok != (c.reason != "") {
			t.Errorf("%s: FailoverReason = %q, %v; want %q", c.name, reason, ok, c.reason)
		}
		if got := ledger.NothingWritten(c.err); got != c.nothingWritten {
			t.Errorf("%s: NothingWritten = %v, want %v", c.name, got, c.nothingWritten)
		}
	}
}

// flipPair is two clusters, each holding the ledger's table: a, writable,
// and b, read-only, until flip turns them round the way Aurora does: the
// old primary becomes read-only in place (its sessions stay open), the
// other takes writes.
type flipPair struct {
	a, b *pgembed.Server
	url  string // both hosts, target_session_attrs=read-write
}

func startFlipPair(t *testing.T) *flipPair {
	t.Helper()
	ctx := context.Background()
	var p flipPair
	for _, s := range []**pgembed.Server{&p.a, &p.b} {
		srv, err := pgembed.Start(ctx, pgembed.Options{})
		if err != nil {
			t.Fatalf("start PostgreSQL (needs its binaries: apt-get install postgresql): %v", err)
		}
		t.Cleanup(srv.Stop)
		adminExec(t, srv, ledgertest.Schema)
		*s = srv
	}
	setReadOnly(t, p.b, true)
	p.url = fmt.Sprintf("postgres://postgres@127.0.0.1:%d,127.0.0.1:%d/postgres?sslmode=disable&target_session_attrs=read-write", p.a.Port, p.b.Port)
	return &p
}

func adminExec(t *testing.T, s *pgembed.Server, sql string) {
	t.Helper()
	conn, err := pgx.Connect(context.Background(), s.URL)
	if err != nil {
		t.Fatalf("connect to %d: %v", s.Port, err)
	}
	defer conn.Close(context.Background())
	if _, err := conn.Exec(context.Background(), sql); err != nil {
		t.Fatalf("on %d: %s: %v", s.Port, sql, err)
	}
}

// setReadOnly turns a cluster read-only (or back) for every session,
// the open ones included: a configuration reload, no restart.
func setReadOnly(t *testing.T, s *pgembed.Server, on bool) {
	t.Helper()
	if on {
		adminExec(t, s, `ALTER SYSTEM SET default_transaction_read_only = on`)
	} else {
		adminExec(t, s, `ALTER SYSTEM RESET default_transaction_read_only`)
	}
	adminExec(t, s, `SELECT pg_reload_conf()`)
}

func (p *flipPair) flip(t *testing.T) {
	t.Helper()
	setReadOnly(t, p.a, true)
	setReadOnly(t, p.b, false)
}

func countOn(t *testing.T, s *pgembed.Server, where string, args ...any) int {
	t.Helper()
	conn, err := pgx.Connect(context.Background(), s.URL)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(context.Background())
	var n int
	if err := conn.QueryRow(context.Background(), `SELECT count(*) FROM idempotency_keys WHERE `+where, args...).Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
}

// failovers records a Follower's reports.
type failovers struct {
	mu      sync.Mutex
	reasons []string
}

func (f *failovers) options() ledger.FollowOptions {
	return ledger.FollowOptions{OnFailover: func(reason string, _ error) {
		f.mu.Lock()
		defer f.mu.Unlock()
		f.reasons = append(f.reasons, reason)
	}}
}

func (f *failovers) seen() []string {
	f.mu.Lock()
	defer f.mu.Unlock()
	return append([]string(nil), f.reasons...)
}

// warm opens n connections at once, so the pool holds n sessions on its
// node before the flip.
func warm(t *testing.T, pool *pgxpool.Pool, n int) {
	t.Helper()
	var conns []*pgxpool.Conn
	for range n {
		c, err := pool.Acquire(context.Background())
		if err != nil {
			t.Fatal(err)
		}
		conns = append(conns, c)
	}
	for _, c := range conns {
		c.Release()
	}
}

// The old primary turns read-only without closing a socket: the pool
// leaves it at the first write it refuses, every connection with it, and
// the write is retried on the new primary. Every call the middleware
// answers has its effect exactly once and its outcome in the ledger that
// takes writes; the failover is reported once.
func TestPoolFollowsThePrimaryThroughARoleFlip(t *testing.T) {
	t.Parallel()
	p := startFlipPair(t)
	var seen failovers
	pool, follower, err := ledger.NewPool(context.Background(), p.url, seen.options())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	warm(t, pool, 4)

	tool := &mwTool{effects: map[string]int{}, started: make(chan string, 100)}
	srv := httptest.NewServer(ledger.Middleware(ledger.MiddlewareConfig{DB: pool, Tool: "create_ticket"}, tool))
	t.Cleanup(srv.Close)
	b := &mwBundle{srv: srv, tool: tool}
	answer := func(key string) {
		t.Helper()
		a := b.mustCall(t, key, mwBody)
		if a.code != http.StatusCreated || a.env.IdempotentReplay {
			t.Fatalf("%s: %d %s, want 201, a fresh outcome", key, a.code, a.raw)
		}
		testwait.Recv(t, tool.started, testwait.Timeout)
	}
	for i := range 10 {
		answer(fmt.Sprintf("before-%d", i))
	}
	p.flip(t)
	for i := range 20 {
		answer(fmt.Sprintf("after-%d", i))
	}

	for key, n := range tool.effects {
		if n != 1 {
			t.Errorf("%s: %d effects, want 1", key, n)
		}
	}
	if n := countOn(t, p.a, `key LIKE 'before-%' AND status = 'completed'`); n != 10 {
		t.Errorf("old primary: %d keys from before the flip completed, want 10", n)
	}
	// A call that reached a session of the old primary before it took in
	// the reload may still have been written there; the others, at least
	// the last ten, are on the new primary.
	onA := countOn(t, p.a, `key LIKE 'after-%' AND status = 'completed'`)
	onB := countOn(t, p.b, `key LIKE 'after-%' AND status = 'completed'`)
	if onA+onB != 20 || countOn(t, p.b, `key IN ('after-10','after-11','after-12','after-13','after-14','after-15','after-16','after-17','after-18','after-19') AND status = 'completed'`) != 10 {
		t.Errorf("after the flip: %d completed on the old primary, %d on the new; want all 20, the last 10 on the new", onA, onB)
	}
	if got := seen.seen(); len(got) != 1 || got[0] != ledger.ReasonReadOnly {
		t.Errorf("failovers reported: %v, want one, %s", got, ledger.ReasonReadOnly)
	}
	if follower.Generation() != 1 {
		t.Errorf("generation = %d, want 1", follower.Generation())
	}
}

// A node that turned read-only is left by CheckWritable before any write
// fails there: its first call says not writable, and a later one finds the
// new primary; reads then come from it.
func TestCheckWritableLeavesAReadOnlyNodeBeforeAnyWrite(t *testing.T) {
	t.Parallel()
	p := startFlipPair(t)
	adminExec(t, p.b, `BEGIN READ WRITE; INSERT INTO idempotency_keys (key, tool, request_hash, expires_at) VALUES ('only-on-b', 't', 'h', now() + interval '1 day'); COMMIT`)
	var writable []bool
	var mu sync.Mutex
	pool, follower, err := ledger.NewPool(context.Background(), p.url, ledger.FollowOptions{OnWritable: func(w bool) {
		mu.Lock()
		defer mu.Unlock()
		writable = append(writable, w)
	}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	warm(t, pool, 3)
	ctx := context.Background()
	if err := follower.CheckWritable(ctx, pool); err != nil {
		t.Fatalf("before the flip: %v", err)
	}
	p.flip(t)
	testwait.Eventually(t, func() bool { return follower.CheckWritable(ctx, pool) != nil }, testwait.Timeout, "CheckWritable to see the old primary read-only")
	testwait.Eventually(t, func() bool { return follower.CheckWritable(ctx, pool) == nil }, testwait.Timeout, "CheckWritable to find the new primary")
	for range 3 { // every connection, not only the one checked
		if _, err := ledger.Get(ctx, pool, "only-on-b"); err != nil {
			t.Fatalf("read after the flip: %v (a connection still on the old primary?)", err)
		}
	}
	mu.Lock()
	defer mu.Unlock()
	if len(writable) != 2 || writable[0] || !writable[1] {
		t.Errorf("OnWritable calls: %v, want [false true]", writable)
	}
}

// proxied is a tool server whose ledger connections run through a cutProxy
// to a fresh database, one connection at a time (so each statement is
// prepared on it first).
func proxied(t *testing.T) (*mwBundle, *ledgertest.CutProxy, *ledgertest.DB) {
	t.Helper()
	db := ledgertest.New(t)
	cfg, err := pgx.ParseConfig(db.URL)
	if err != nil {
		t.Fatal(err)
	}
	proxy := ledgertest.StartCutProxy(t, net.JoinHostPort(cfg.Host, strconv.Itoa(int(cfg.Port))))
	pc, err := pgxpool.ParseConfig(fmt.Sprintf("postgres://%s@%s/%s?sslmode=disable&pool_max_conns=1", cfg.User, proxy.Addr(), cfg.Database))
	if err != nil {
		t.Fatal(err)
	}
	ledger.FollowPrimary(pc, ledger.FollowOptions{})
	pool, err := pgxpool.NewWithConfig(context.Background(), pc)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	tool := &mwTool{effects: map[string]int{}, started: make(chan string, 100)}
	srv := httptest.NewServer(ledger.Middleware(ledger.MiddlewareConfig{DB: pool, Tool: "create_ticket"}, tool))
	t.Cleanup(srv.Close)
	return &mwBundle{db: db, srv: srv, tool: tool}, proxy, db
}

// The claim commits and its answer is lost with the connection: the call
// is answered 503 ledger-unavailable without running the tool, and its
// retry finds the truth (the key in flight: 409), never a second claim.
func TestClaimWhoseCommitIsUnknownAnswers503AndTheRetryFindsTheClaim(t *testing.T) {
	t.Parallel()
	b, proxy, db := proxied(t)
	proxy.Arm("INSERT INTO idempotency_keys", true)
	a := b.mustCall(t, "lost-claim", mwBody)
	wantProblem(t, "claim whose answer was lost", a, http.StatusServiceUnavailable, ledger.ProblemLedgerUnavailable)
	if proxy.Cuts() != 1 {
		t.Fatalf("the proxy cut %d connections, want 1", proxy.Cuts())
	}
	if n := db.Count(t, `idempotency_keys WHERE key = 'lost-claim' AND status = 'processing'`); n != 1 {
		t.Fatalf("the claim's row: %d processing, want 1 (the commit happened)", n)
	}
	retry := b.mustCall(t, "lost-claim", mwBody)
	wantProblem(t, "retry", retry, http.StatusConflict, ledger.ProblemKeyInFlight)
	if n := b.tool.total(); n != 0 {
		t.Errorf("effects: %d, want 0 (the tool never ran)", n)
	}
}

// The effect happened and the Complete that records it never reached the
// server: the caller still gets the tool's answer, the key stays
// processing for the reconciler (whose probe will find the effect), and a
// retry meanwhile gets 409, not a second effect.
func TestCompleteLostAcrossAFailoverLeavesTheKeyProcessing(t *testing.T) {
	t.Parallel()
	b, proxy, db := proxied(t)
	proxy.Arm("SET status = 'completed'", false)
	a := b.mustCall(t, "lost-complete", mwBody)
	testwait.Recv(t, b.tool.started, testwait.Timeout)
	if a.code != http.StatusCreated {
		t.Fatalf("answer: %d %s, want the tool's 201", a.code, a.raw)
	}
	if proxy.Cuts() != 1 {
		t.Fatalf("the proxy cut %d connections, want 1", proxy.Cuts())
	}
	if n := db.Count(t, `idempotency_keys WHERE key = 'lost-complete' AND status = 'processing'`); n != 1 {
		t.Fatalf("%d processing rows for the key, want 1: left for the reconciler", n)
	}
	retry := b.mustCall(t, "lost-complete", mwBody)
	wantProblem(t, "retry", retry, http.StatusConflict, ledger.ProblemKeyInFlight)
	if n := b.tool.effectsOf("lost-complete"); n != 1 {
		t.Errorf("effects: %d, want 1", n)
	}
}

// Two pools on one database under one Follower (a process with a pool per
// ledger): the failover one of them finds is reported once, and the other
// leaves the old node too, at its next acquire, without a failed write of
// its own.
func TestPoolsOfOneFollowerLeaveTheOldPrimaryTogether(t *testing.T) {
	t.Parallel()
	p := startFlipPair(t)
	adminExec(t, p.b, `BEGIN READ WRITE; INSERT INTO idempotency_keys (key, tool, request_hash, expires_at) VALUES ('only-on-b', 't', 'h', now() + interval '1 day'); COMMIT`)
	var seen failovers
	ctx := context.Background()
	first, follower, err := ledger.NewPool(ctx, p.url, seen.options())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(first.Close)
	pc, err := pgxpool.ParseConfig(p.url)
	if err != nil {
		t.Fatal(err)
	}
	follower.Follow(pc)
	second, err := pgxpool.NewWithConfig(ctx, pc)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(second.Close)
	warm(t, first, 2)
	warm(t, second, 3)
	if _, err := ledger.Get(ctx, second, "only-on-b"); err == nil {
		t.Fatal("before the flip the second pool already reads the other node")
	}
	p.flip(t)
	testwait.Eventually(t, func() bool { return follower.CheckWritable(ctx, first) != nil }, testwait.Timeout, "the first pool's check to see the old primary read-only")
	for range 3 { // every connection of the second pool, none of which failed
		if _, err := ledger.Get(ctx, second, "only-on-b"); err != nil {
			t.Fatalf("second pool after the flip: %v (a connection still on the old primary?)", err)
		}
	}
	if got := seen.seen(); len(got) != 1 || got[0] != ledger.ReasonNotWritable {
		t.Errorf("failovers reported: %v, want one, %s", got, ledger.ReasonNotWritable)
	}
}
