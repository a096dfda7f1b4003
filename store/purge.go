package store

import (
	"context"
	"errors"
	"fmt"
	"sort"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgtype"
	"github.com/ledgerkeeper/ledgerkeeper/internal/engine"
	"github.com/ledgerkeeper/ledgerkeeper/ledger"
)

// This file holds the purge's SQL on the ledger's tables (package expiry
// drives it): expired keys, expired processing keys, the daemon's own tables
// that this package owns (reconcile_audit, ledgerkeeper_runs, orphaned
// reconcile_state), and the advisory lock that lets one purge run at a time.
// The alert tables are trimmed by package alerts (alerts.PurgeSent,
// alerts.TrimState).

// ErrBatchTimeout says a purge statement ran past its statement timeout: the
// batch was rolled back whole and the caller should shrink the next one.
var ErrBatchTimeout = errors.New("purge batch ran past its statement timeout")

// purgeLockID is the session advisory lock held for a whole purge pass: an
// arbitrary constant ("lkpurge" in ASCII), distinct from the migration lock;
// a ledger in a schema mixes the schema into it (ledger.LockKey), so the
// ledgers of one database purge side by side.
const purgeLockID int64 = 0x6c6b7075726765

// TryPurgeLock takes the purge lock without waiting and reports whether it
// got it. db must be one dedicated connection kept for the whole pass: a
// session lock belongs to its connection and dies with it, so a crashed
// purge never leaves the lock behind.
func TryPurgeLock(ctx context.Context, db ledger.DBTX) (bool, error) {
	var ok bool
	err := db.QueryRow(ctx, `SELECT pg_try_advisory_lock($1)`, ledger.LockKey(db, purgeLockID)).Scan(&ok)
	return ok, wrap("take purge lock", err)
}

// ReleasePurgeLock gives the purge lock back, on the connection that took it.
func ReleasePurgeLock(ctx context.Context, db ledger.DBTX) error {
	_, err := db.Exec(ctx, `SELECT pg_advisory_unlock($1)`, ledger.LockKey(db, purgeLockID))
	return wrap("release purge lock", err)
}

// PurgeRunning reports whether some session holds the purge lock now, without
// taking it: a dry run says so instead of competing for the lock.
func PurgeRunning(ctx context.Context, db ledger.DBTX) (bool, error) {
	// A bigint advisory key is stored as classid = high half, objid = low
	// half, objsubid = 1: https://www.postgresql.org/docs/15/view-pg-locks.html
	var held bool
	err := db.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM pg_locks
		WHERE locktype = 'advisory' AND granted AND objsubid = 1
		  AND database = (SELECT oid FROM pg_database WHERE datname = current_database())
		  AND classid = ($1::bigint >> 32)::oid AND objid = ($1::bigint & 4294967295)::oid)`, ledger.LockKey(db, purgeLockID)).Scan(&held)
	return held, wrap("check purge lock", err)
}

// SetStatementTimeout bounds every later statement of db's session (the
// purge's dedicated connection): a batch stuck behind a lock or a slow disk
// is cancelled by the server, rolled back, and retried smaller. Zero turns
// the bound off.
func SetStatementTimeout(ctx context.Context, db ledger.DBTX, d time.Duration) error {
	_, err := db.Exec(ctx, `SELECT set_config('statement_timeout', $1, false)`, fmt.Sprintf("%dms", d.Milliseconds()))
	return wrap("set statement timeout", err)
}

// PurgePolicy is the retention floor: a key younger than its tool's floor (by
// created_at) is never purged, whatever its expires_at (invariant 5).
type PurgePolicy struct {
	// MinAge is the floor of every tool without an override. Must be > 0.
	MinAge time.Duration
	// ToolMinAge overrides MinAge per tool name.
	ToolMinAge map[string]time.Duration
}

// args returns the policy as SQL parameters: parallel arrays of tool names
// and floors, and the default floor.
func (p PurgePolicy) args() ([]string, []time.Duration, time.Duration) {
	if p.MinAge <= 0 {
		panic("ledger: PurgePolicy needs a positive MinAge")
	}
	tools := make([]string, 0, len(p.ToolMinAge))
	for t := range p.ToolMinAge {
		tools = append(tools, t)
	}
	sort.Strings(tools)
	floors := make([]time.Duration, len(tools))
	for i, t := range tools {
		floors[i] = p.ToolMinAge[t]
		if floors[i] <= 0 {
			panic(fmt.Sprintf("ledger: PurgePolicy floor of tool %q must be positive", t))
		}
	}
	return tools, floors, p.MinAge
}

// cutoffs returns the policy as cut-offs at now (the transaction's now():
// the instant its statements' now() stands for): keys created before a
// tool's cut-off are past its floor. Intervals bound from a time.Duration
// are microseconds, so now() - floor in SQL is the same instant.
func (p PurgePolicy) cutoffs(now time.Time) ([]string, []time.Time, time.Time) {
	tools, floors, def := p.args()
	cuts := make([]time.Time, len(floors))
	for i, f := range floors {
		cuts[i] = now.Add(-f)
	}
	return tools, cuts, now.Add(-def)
}

// purgeable is the predicate of a purgeable key k, with the floor arrays and
// default in $2, $3, $4. It is evaluated twice per batch: when candidates
// are chosen, and again in the DELETE on the rows as they are then (a ctid
// names a slot, not a key; and PostgreSQL re-checks a row updated
// concurrently against the DELETE's own quals, not against the TID list).
//
// Written for cost per row (it runs twice per row deleted): the tool's floor
// is an array lookup, not a subquery; holds are one hashed set per statement
// (key_holds.key is never null, so NOT IN means NOT EXISTS), not an index
// probe per row. Together 20% cheaper than the straightforward form.
//
// The floors arrive as cut-offs ($3 per tool, $4 the default: the
// transaction's now() minus each floor, cutoffs): Citus refuses date
// arithmetic on a column's value (now() - a floor looked up by k.tool) in
// a DELETE, and a bound cut-off is the same comparison on both engines.
const purgeable = purgeableUnheld + `
	  AND k.key NOT IN (SELECT h.key FROM key_holds h)`

// purgeableUnheld is purgeable without its hold check: the purge of one
// key chosen shard by shard (purgeChosenKey) checks that key's hold alone.
const purgeableUnheld = `k.expires_at < now()
	  AND k.status IN ('completed', 'failed_retryable')
	  AND k.created_at < coalesce(($3::timestamptz[])[array_position($2::text[], k.tool::text)], $4::timestamptz)`

// PurgeCursor is a keyset position in (expires_at, key) order. The zero
// value is the start. Paging by keyset means a batch never rescans the index
// entries of the rows earlier batches deleted (dead until vacuum) or kept.
type PurgeCursor struct {
	ExpiresAt time.Time `json:"expires_at"`
	Key       string    `json:"key"`
}

func (c PurgeCursor) args() (any, string) {
	if c.ExpiresAt.IsZero() {
		return pgtype.Timestamptz{InfinityModifier: pgtype.NegativeInfinity, Valid: true}, ""
	}
	return c.ExpiresAt, c.Key
}

// PurgeCount is a number of keys of one tool and status.
type PurgeCount struct {
	Tool   string `json:"tool"`
	Status string `json:"status"`
	Keys   int64  `json:"keys"`
	// OldestExpiresAt is the smallest expires_at among them.
	OldestExpiresAt time.Time `json:"oldest_expires_at"`
}

// PurgeBatchResult is what one batch did.
type PurgeBatchResult struct {
	// Candidates is how many rows the batch chose for deletion.
	Candidates int
	// Keys is how many idempotency_keys rows it deleted: Candidates minus
	// the rows that changed between the choice and the DELETE (PurgeByRange
	// can also delete a row of its range that became purgeable meanwhile).
	Keys int64
	// States is how many reconcile_state rows of those keys it deleted.
	States int64
	// ByToolStatus breaks Keys down.
	ByToolStatus []PurgeCount
	// Next is the cursor for the next batch.
	Next PurgeCursor
	// Done: fewer candidates than the limit were left; the pass is over.
	Done bool
	// HoldRaces counts attempts rolled back because an operator put one of
	// the batch's keys on hold while it ran (then retried without it).
	HoldRaces int
}

// errHoldRace: a key of the batch was put on hold while the batch ran.
var errHoldRace = errors.New("a key of the batch was put on hold meanwhile")

// PurgeExpiredBatch deletes up to limit purgeable keys after the cursor, and
// their reconcile_state rows, in one transaction of its own:
//
//  1. one statement chooses candidates through the expires_at index, in
//     keyset order, and deletes the purgeable rows of the keyset range they
//     span (DefaultPurgeShape; PurgeExpiredBatchBy has the ctid and
//     primary-key shapes), re-checking status, expiry and floor in the
//     DELETE's own WHERE: a row a writer changed after the statement's
//     snapshot (a retry re-claiming a failed_retryable key) is re-evaluated
//     on its new version, which no longer qualifies;
//  2. a second statement, under a fresh snapshot, looks for holds on the
//     deleted keys and deletes their reconcile_state rows.
//
// Why step 2 checks holds again: PutHold locks the key's row, then inserts
// the hold. A DELETE that waited on that row lock proceeds when PutHold
// commits (the row itself did not change) without seeing the hold, which
// committed after its snapshot; step 2 does see it, and the batch is rolled
// back and chosen again without the held key. A hold that comes later waits
// on the deleted row and finds the key gone. No row locks are taken before
// the DELETE: that would double the batch's WAL.
func PurgeExpiredBatch(ctx context.Context, db Beginner, p PurgePolicy, after PurgeCursor, limit int) (PurgeBatchResult, error) {
	return PurgeExpiredBatchBy(ctx, db, DefaultPurgeShape, p, after, limit)
}

// PurgeShape is how a purge batch names the rows it chose when it deletes
// them. Both shapes choose the same rows the same way (the expires_at index,
// keyset order) and re-check the same predicate in the DELETE; they differ
// in the lookup from a chosen row to the row deleted.
type PurgeShape string

const (
	// PurgeByCTID deletes the chosen rows by their physical address (a TID
	// scan): no index lookup per row, but ctid exists only in PostgreSQL.
	PurgeByCTID PurgeShape = "ctid"
	// PurgeByKey deletes the chosen rows by primary key (an index scan of
	// idempotency_keys_pkey per row): what an engine without ctid
	// (CockroachDB, YugabyteDB) can run.
	PurgeByKey PurgeShape = "key"
	// PurgeByRange deletes the purgeable rows of the keyset range the
	// chosen rows span, (cursor, last chosen], walking the expires_at index
	// again: no lookup per row, and no ctid. It may also delete a row of
	// the range that became purgeable after the choice (it is re-checked
	// like every other).
	PurgeByRange PurgeShape = "range"
)

// DefaultPurgeShape is the shape PurgeExpiredBatch uses: PurgeByRange,
// which needs no ctid, so the same statement runs on engines that have
// none. In the side-by-side run at full size (BENCHMARKS.md, "Portable
// purge") it purged within 5% of ctid's rows/s with a lower writer p99 and
// the same WAL per row; PurgeByKey's batch took 4.7x ctid's.
const DefaultPurgeShape = PurgeByRange

// Known reports whether s is one of the shapes above.
func (s PurgeShape) Known() bool {
	_, ok := purgeBatchSQL[s]
	return ok
}

// ErrShapeUnsupported: the purge shape cannot run on this engine.
var ErrShapeUnsupported = errors.New("purge shape not supported on this engine")

// Supported says whether the shape runs on the engine in use
// (internal/engine): PurgeByCTID needs PostgreSQL's ctid, which names a
// row of one table, and a Citus distributed table is many (Citus refuses
// the statement: "cannot perform distributed planning for the given
// modification").
func (s PurgeShape) Supported() error {
	if s == PurgeByCTID && engine.Citus() {
		return fmt.Errorf("%w: %q needs PostgreSQL's ctid, which a Citus distributed table does not have; use %q", ErrShapeUnsupported, s, PurgeByRange)
	}
	return nil
}

// PurgeExpiredBatchBy is PurgeExpiredBatch with the shape of its DELETE
// chosen by the caller (lkbench compares them; expiry.Config.BatchShape).
func PurgeExpiredBatchBy(ctx context.Context, db Beginner, shape PurgeShape, p PurgePolicy, after PurgeCursor, limit int) (PurgeBatchResult, error) {
	q, ok := purgeBatchSQL[shape]
	if !ok {
		panic(fmt.Sprintf("ledger: unknown purge shape %q", shape))
	}
	engine.Ensure(ctx, db)
	if err := shape.Supported(); err != nil {
		return PurgeBatchResult{}, err
	}
	if limit <= 0 {
		panic("ledger: PurgeExpiredBatch needs a positive limit")
	}
	p.args() // validates the policy before the transaction starts
	races := 0
	// byShard: a worker is down (Citus); the batch is chosen shard by
	// shard among those that answer, and deleted by key.
	byShard := false
	for {
		var res PurgeBatchResult
		var faults []ShardFault
		err := pgx.BeginFunc(ctx, db, func(tx pgx.Tx) error {
			var keys []string
			var err error
			if byShard {
				res, faults, err = deleteChosen(ctx, tx, p, after, limit)
				return err
			}
			res, keys, err = deletePurge(ctx, tx, q, p, after, limit)
			if err != nil || len(keys) == 0 {
				return err
			}
			res.States, err = checkHoldsAndStates(ctx, tx, keys)
			return err
		})
		if errors.Is(err, errHoldRace) && races < 3 {
			races++
			continue
		}
		if err != nil && !byShard && engine.Citus() && NodeUnreachable(err) {
			byShard = true
			continue
		}
		if err != nil {
			return PurgeBatchResult{}, wrapPurge("purge expired keys", err)
		}
		res.HoldRaces = races
		return res, partial("purge expired keys", faults)
	}
}

// purgeBatchSQL builds step 1 for each shape: choose up to $6 purgeable rows
// after the cursor ($1, $5) in keyset order, delete those still purgeable,
// and report the candidates, the new cursor and the deleted keys per tool
// and status.
var purgeBatchSQL = map[PurgeShape]string{
	PurgeByCTID: purgeBatch("k.ctid, k.expires_at, k.key", "k.ctid = ANY (ARRAY(SELECT ctid FROM chosen))"),
	PurgeByKey:  purgeBatch("k.expires_at, k.key", "k.key = ANY (ARRAY(SELECT key FROM chosen))"),
	PurgeByRange: purgeBatch("k.expires_at, k.key", `k.expires_at >= $1 AND k.expires_at <= (SELECT expires_at FROM last)
	  AND (k.expires_at, k.key) > ($1::timestamptz, $5::text)
	  AND (k.expires_at, k.key::text) <= (SELECT expires_at, key::text FROM last)`),
}

func purgeBatch(chosenCols, deleteWhere string) string {
	return `WITH chosen AS (
	SELECT ` + chosenCols + `
	FROM idempotency_keys k
	WHERE k.expires_at >= $1 AND (k.expires_at, k.key) > ($1::timestamptz, $5::text)
	  AND ` + purgeable + `
	ORDER BY k.expires_at, k.key
	LIMIT $6
), last AS (
	SELECT expires_at, key FROM chosen ORDER BY expires_at DESC, key DESC LIMIT 1
), gone AS (
	DELETE FROM idempotency_keys k
	WHERE ` + deleteWhere + `
	  AND ` + purgeable + `
	RETURNING k.key, k.tool, k.status, k.expires_at
)
SELECT (SELECT count(*) FROM chosen), (SELECT expires_at FROM last), (SELECT key FROM last),
       g.tool, g.status, count(g.key), min(g.expires_at), array_agg(g.key) FILTER (WHERE g.key IS NOT NULL)
FROM (SELECT 1) one LEFT JOIN gone g ON true
GROUP BY g.tool, g.status ORDER BY g.tool, g.status`
}

// deletePurge is step 1 (q, one of purgeBatchSQL): choose up to limit
// purgeable rows after the cursor and delete those still purgeable. It
// returns the deleted keys.
func deletePurge(ctx context.Context, tx pgx.Tx, q string, p PurgePolicy, after PurgeCursor, limit int) (PurgeBatchResult, []string, error) {
	now, err := TxNow(ctx, tx)
	if err != nil {
		return PurgeBatchResult{}, nil, err
	}
	tools, cuts, def := p.cutoffs(now)
	at, key := after.args()
	rows, err := tx.Query(ctx, q, at, tools, cuts, def, key, limit)
	if err != nil {
		return PurgeBatchResult{}, nil, err
	}
	res := PurgeBatchResult{Next: after}
	var keys []string
	var (
		chosen   int
		lastAt   *time.Time
		lastKey  *string
		tool     *string
		status   *string
		n        int64
		oldest   *time.Time
		someKeys []string
	)
	_, err = pgx.ForEachRow(rows, []any{&chosen, &lastAt, &lastKey, &tool, &status, &n, &oldest, &someKeys}, func() error {
		res.Candidates = chosen
		if lastAt != nil && lastKey != nil {
			res.Next = PurgeCursor{ExpiresAt: *lastAt, Key: *lastKey}
		}
		if tool == nil { // no row deleted: the LEFT JOIN's lone null group
			return nil
		}
		res.ByToolStatus = append(res.ByToolStatus, PurgeCount{Tool: *tool, Status: *status, Keys: n, OldestExpiresAt: *oldest})
		res.Keys += n
		keys = append(keys, someKeys...)
		return nil
	})
	res.Done = res.Candidates < limit
	return res, keys, err
}

// checkHoldsAndStates is step 2: errHoldRace if any deleted key is on hold
// under a fresh snapshot; otherwise it deletes their reconcile_state rows.
func checkHoldsAndStates(ctx context.Context, tx pgx.Tx, keys []string) (int64, error) {
	var held, states int64
	err := tx.QueryRow(ctx, `WITH held AS (
	SELECT key FROM key_holds WHERE key = ANY($1::text[])
), st AS (
	DELETE FROM reconcile_state WHERE key = ANY($1::text[]) AND NOT EXISTS (SELECT 1 FROM held) RETURNING 1
)
SELECT (SELECT count(*) FROM held), (SELECT count(*) FROM st)`, keys).Scan(&held, &states)
	if err != nil {
		return 0, err
	}
	if held > 0 {
		return 0, errHoldRace
	}
	return states, nil
}

// wrapPurge is wrap that also recognises a statement timeout.
func wrapPurge(op string, err error) error {
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) && pgErr.Code == "57014" { // query_canceled
		return fmt.Errorf("%s: %w (%s)", op, ErrBatchTimeout, pgErr.Message)
	}
	return wrap(op, err)
}

// AsBatchTimeout returns err, wrapped in ErrBatchTimeout if it is PostgreSQL
// cancelling a statement (its statement timeout): the purger applies it to
// the batches other packages run on its connection (the alert tables), so
// every batch that times out shrinks the next one the same way.
func AsBatchTimeout(err error) error {
	var pgErr *pgconn.PgError
	if errors.Is(err, ErrBatchTimeout) || !errors.As(err, &pgErr) || pgErr.Code != "57014" {
		return err
	}
	return fmt.Errorf("%w: %w", ErrBatchTimeout, err)
}

// ExpiredKey is a processing key past its expires_at: purge keeps it and
// asks a human for a decision.
type ExpiredKey struct {
	Key       string    `json:"key"`
	Tool      string    `json:"tool"`
	CreatedAt time.Time `json:"created_at"`
	ClaimedAt time.Time `json:"claimed_at"`
	ExpiresAt time.Time `json:"expires_at"`
}

// CountExpiredProcessing counts processing keys past expires_at: all of
// them, and those on hold. Through the partial index on processing keys, so
// its cost follows the number of processing keys, not the table's size.
func CountExpiredProcessing(ctx context.Context, db ledger.DBTX) (total, held int64, err error) {
	err = db.QueryRow(ctx, `SELECT count(*), count(h.key)
		FROM idempotency_keys k LEFT JOIN key_holds h ON h.key = k.key
		WHERE k.status = 'processing' AND k.expires_at < now()`).Scan(&total, &held)
	if err != nil && engine.Citus() && NodeUnreachable(err) {
		return countExpiredProcessingByShard(ctx, db)
	}
	return total, held, wrap("count expired processing keys", err)
}

// ExpiredProcessingPage lists up to limit processing keys past expires_at,
// not on hold (a hold is the operator's acknowledgement), after the cursor
// in (expires_at, key) order. Run it inside the transaction that raises
// their alerts.
func ExpiredProcessingPage(ctx context.Context, db ledger.DBTX, after PurgeCursor, limit int) ([]ExpiredKey, error) {
	if tx, ok := db.(pgx.Tx); ok && engine.Citus() {
		// Inside a savepoint: a statement that fails because a worker is
		// down would abort the caller's transaction, and the read shard by
		// shard that replaces it (and the alerts after) could not run.
		var out []ExpiredKey
		err := pgx.BeginFunc(ctx, tx, func(sp pgx.Tx) error {
			var err error
			out, err = expiredProcessingPage(ctx, sp, after, limit)
			return err
		})
		if err != nil && NodeUnreachable(err) {
			return expiredProcessingPageByShard(ctx, db, after, limit)
		}
		return out, wrap("list expired processing keys", err)
	}
	out, err := expiredProcessingPage(ctx, db, after, limit)
	if err != nil && engine.Citus() && NodeUnreachable(err) {
		return expiredProcessingPageByShard(ctx, db, after, limit)
	}
	return out, wrap("list expired processing keys", err)
}

func expiredProcessingPage(ctx context.Context, db ledger.DBTX, after PurgeCursor, limit int) ([]ExpiredKey, error) {
	at, key := after.args()
	rows, err := db.Query(ctx, `SELECT k.key, k.tool, k.created_at, k.claimed_at, k.expires_at
		FROM idempotency_keys k
		WHERE k.status = 'processing' AND k.expires_at < now()
		  AND (k.expires_at, k.key) > ($1::timestamptz, $2::text)
		  AND NOT EXISTS (SELECT 1 FROM key_holds h WHERE h.key = k.key)
		ORDER BY k.expires_at, k.key
		LIMIT $3`, at, key, limit)
	if err != nil {
		return nil, err
	}
	return pgx.CollectRows(rows, pgx.RowToStructByPos[ExpiredKey])
}

// PurgePreview is what a purge would do now: a dry run.
type PurgePreview struct {
	// Purgeable counts the keys a purge would delete, per tool and status.
	Purgeable []PurgeCount
	// UnderFloor counts expired completed/failed_retryable keys kept
	// because they are younger than their tool's retention floor.
	UnderFloor int64
	// Held counts expired keys (any status) kept because they are on hold.
	Held int64
	// ExpiredProcessing counts processing keys past expires_at, held or not:
	// kept and alerted.
	ExpiredProcessing int64
}

// PreviewPurge counts, in one read of the expired part of the ledger, what
// PurgeExpiredBatch would delete and what it would keep and why.
func PreviewPurge(ctx context.Context, db ledger.DBTX, p PurgePolicy) (PurgePreview, error) {
	tools, floors, def := p.args()
	rows, err := db.Query(ctx, `SELECT k.tool, k.status,
		k.created_at < now() - coalesce(($2::interval[])[array_position($1::text[], k.tool::text)], $3::interval) AS past_floor,
		h.key IS NOT NULL AS held,
		count(*), min(k.expires_at)
	FROM idempotency_keys k LEFT JOIN key_holds h ON h.key = k.key
	WHERE k.expires_at < now()
	GROUP BY 1, 2, 3, 4
	ORDER BY 1, 2`, tools, floors, def)
	if err != nil {
		return PurgePreview{}, wrap("preview purge", err)
	}
	var out PurgePreview
	var c PurgeCount
	var pastFloor, held bool
	_, err = pgx.ForEachRow(rows, []any{&c.Tool, &c.Status, &pastFloor, &held, &c.Keys, &c.OldestExpiresAt}, func() error {
		switch {
		case c.Status == ledger.StatusProcessing:
			out.ExpiredProcessing += c.Keys
			if held {
				out.Held += c.Keys
			}
		case held:
			out.Held += c.Keys
		case !pastFloor:
			out.UnderFloor += c.Keys
		default:
			out.Purgeable = append(out.Purgeable, c)
		}
		return nil
	})
	if err != nil {
		return PurgePreview{}, wrap("preview purge", err)
	}
	return out, nil
}

// DaemonTable names one of ledgerkeeper's own tables of this package that
// purge trims by retention.audit_max_age (the alert tables are package
// alerts').
type DaemonTable string

// The daemon's tables and what of them purge deletes.
const (
	// TableAudit: reconcile_audit rows older than the max age.
	TableAudit DaemonTable = "reconcile_audit"
	// TableRuns: ledgerkeeper_runs older than the max age, except the
	// newest run of each kind (`status` shows it, however old).
	TableRuns DaemonTable = "ledgerkeeper_runs"
	// TableOrphanState: reconcile_state rows whose key no longer exists,
	// whatever their age: they describe nothing.
	TableOrphanState DaemonTable = "reconcile_state"
)

// DaemonTables lists them in the order a pass trims them.
var DaemonTables = []DaemonTable{TableAudit, TableRuns, TableOrphanState}

// daemonPurge holds, per table, the one bounded DELETE (limit in $1, max age
// in $2 unless ageless; each re-checks its condition on the rows it deletes)
// and the count of what it would delete (max age in $1 unless ageless).
var daemonPurge = map[DaemonTable]struct {
	del, count string
	ageless    bool
}{
	TableAudit: {
		del: `DELETE FROM reconcile_audit WHERE id IN (
			SELECT id FROM reconcile_audit WHERE created_at < now() - $2::interval ORDER BY created_at LIMIT $1)
			AND created_at < now() - $2::interval`,
		count: `SELECT count(*) FROM reconcile_audit WHERE created_at < now() - $1::interval`,
	},
	TableRuns: {
		del: `DELETE FROM ledgerkeeper_runs r WHERE id IN (
			SELECT o.id FROM ledgerkeeper_runs o WHERE o.started_at < now() - $2::interval
			  AND EXISTS (SELECT 1 FROM ledgerkeeper_runs n WHERE n.kind = o.kind AND n.id > o.id)
			ORDER BY o.id LIMIT $1)`,
		count: `SELECT count(*) FROM ledgerkeeper_runs o WHERE o.started_at < now() - $1::interval
			AND EXISTS (SELECT 1 FROM ledgerkeeper_runs n WHERE n.kind = o.kind AND n.id > o.id)`,
	},
	TableOrphanState: {
		del: `DELETE FROM reconcile_state s WHERE s.key IN (
			SELECT o.key FROM reconcile_state o
			WHERE NOT EXISTS (SELECT 1 FROM idempotency_keys k WHERE k.key = o.key) LIMIT $1)
			AND NOT EXISTS (SELECT 1 FROM idempotency_keys k WHERE k.key = s.key)`,
		count: `SELECT count(*) FROM reconcile_state o
			WHERE NOT EXISTS (SELECT 1 FROM idempotency_keys k WHERE k.key = o.key)`,
		ageless: true,
	},
}

// PurgeDaemonBatch deletes up to limit rows of table older than maxAge (see
// each DaemonTable for what qualifies; orphaned reconcile_state rows go
// whatever their age), in one statement: its own transaction when db is a
// pool or a bare connection.
func PurgeDaemonBatch(ctx context.Context, db ledger.DBTX, table DaemonTable, maxAge time.Duration, limit int) (int64, error) {
	q, ok := daemonPurge[table]
	if !ok {
		panic("ledger: unknown daemon table " + string(table))
	}
	if limit <= 0 || maxAge <= 0 {
		panic("ledger: PurgeDaemonBatch needs a positive limit and max age")
	}
	args := []any{limit, maxAge}
	if q.ageless {
		args = args[:1]
	}
	tag, err := db.Exec(ctx, q.del, args...)
	if err != nil && engine.Citus() && NodeUnreachable(err) {
		// A worker is down: the trim of this distributed table waits for
		// it (its rows are days old; the ledger's own purge goes on shard
		// by shard). Say which shards.
		if faults, ferr := UnreachableShards(ctx, db); ferr == nil && len(faults) > 0 {
			return 0, &ShardsUnreachableError{Op: "purge " + string(table), Faults: faults}
		}
	}
	if err != nil {
		return 0, wrapPurge("purge "+string(table), err)
	}
	return tag.RowsAffected(), nil
}

// CountDaemonPurge counts what PurgeDaemonBatch would delete from table,
// all batches together.
func CountDaemonPurge(ctx context.Context, db ledger.DBTX, table DaemonTable, maxAge time.Duration) (int64, error) {
	q, ok := daemonPurge[table]
	if !ok {
		panic("ledger: unknown daemon table " + string(table))
	}
	args := []any{maxAge}
	if q.ageless {
		args = nil
	}
	var n int64
	if err := db.QueryRow(ctx, q.count, args...).Scan(&n); err != nil {
		return 0, wrap("count purgeable "+string(table), err)
	}
	return n, nil
}
