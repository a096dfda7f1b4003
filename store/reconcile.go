package store

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgtype"
	"github.com/ledgerkeeper/ledgerkeeper/internal/backoff"
	"github.com/ledgerkeeper/ledgerkeeper/internal/engine"
	"github.com/ledgerkeeper/ledgerkeeper/ledger"
)

// LeaseParams select due keys of one tool.
type LeaseParams struct {
	Tool string
	// Window is processing_window + grace: a key claimed more recently is
	// in flight and never touched (invariant 1).
	Window time.Duration
	// HeartbeatTimeout: a key whose heartbeat is younger is in flight.
	HeartbeatTimeout time.Duration
	// Owner identifies this lease holder uniquely (replica id plus a nonce
	// per pass): the decision write is conditional on it.
	Owner string
	// Lease is how long the lease lasts.
	Lease time.Duration
	// Limit is the batch size.
	Limit int
	// Keys, when set, restricts the batch to these keys.
	Keys []string
	// IgnoreBackoff leases keys whose next probe time has not come yet
	// (an operator's `reconcile --key`). Never the processing window.
	IgnoreBackoff bool
	// ClaimedFrom, when set, leases only keys claimed at or after it: a
	// pass that leased up to some claim does not walk again over the keys
	// it still holds under lease (a batch waiting for its closing
	// self-check holds thousands). Zero: from the oldest.
	ClaimedFrom time.Time
}

// Leased is a key leased for one probe attempt, read by column name: the
// key's columns (ledger.KeyColumns) and those of the db tags here.
type Leased struct {
	ledger.Key
	// Attempts is the number of probe decisions already recorded for this
	// claim of the key.
	Attempts int `db:"attempts"`
	// FirstNotFoundAt is when a not_found awaiting confirmation was seen.
	FirstNotFoundAt *time.Time `db:"first_not_found_at"`
	// LeaseExpiresAt is when the lease lapses.
	LeaseExpiresAt time.Time `db:"lease_expires_at"`
	// Now is the database's clock when the key was leased: ages and waits
	// are measured against it, never against a replica's clock.
	Now time.Time `db:"now"`
}

// duePredicate says when key k (joined with its reconcile_state s) is due,
// with $1 tool, $2 window, $3 heartbeat timeout, $4 keys or null, $5 ignore
// back-off. LeaseDue and PeekDue share it, so a dry run shows exactly what a
// real pass would take.
const duePredicate = `k.status = 'processing'
	  AND k.tool = $1
	  AND k.claimed_at <= now() - $2::interval
	  AND (k.heartbeat_at IS NULL OR k.heartbeat_at <= now() - $3::interval)
	  AND ($4::text[] IS NULL OR k.key = ANY($4::text[]))
	  AND NOT EXISTS (SELECT 1 FROM key_holds h WHERE h.key = k.key)
	  AND (s.key IS NULL OR s.claimed_at <> k.claimed_at OR (
	        (s.lease_expires_at IS NULL OR s.lease_expires_at <= now())
	        AND ($5 OR s.next_probe_at IS NULL OR s.next_probe_at <= now())))`

// LeaseDue leases up to p.Limit due keys of p.Tool, oldest claim first, and
// commits (when db is a pool) before returning: no row lock is held while
// they are probed. A key is due when it is processing, claimed before
// now() - Window, without a fresh heartbeat, not on hold, not leased by
// anyone else, and its next probe time has come.
//
// The row locks (FOR NO KEY UPDATE SKIP LOCKED) keep concurrent leasers off
// each other's candidates; the upsert's WHERE, evaluated on the latest
// committed reconcile_state row, is what makes a lease exclusive.
func LeaseDue(ctx context.Context, db ledger.DBTX, p LeaseParams) ([]Leased, error) {
	out, _, err := LeaseDueDrained(ctx, db, p)
	return out, err
}

// LeaseDueDrained is LeaseDue that also says whether the tool's due keys
// ran out: drained is true when the statement found fewer due keys than
// p.Limit (after p.ClaimedFrom), so a lease right after would find none but
// the keys that became due meanwhile, which the next pass takes. Keys whose
// rows another leaser had locked were skipped: they are that leaser's. A
// pass that leased a short batch ends without asking again (one planned
// statement fewer per tool and pass: a fleet of quiet ledgers pays it on
// every ledger).
func LeaseDueDrained(ctx context.Context, db ledger.DBTX, p LeaseParams) (out []Leased, drained bool, err error) {
	if p.Limit <= 0 || p.Owner == "" || p.Lease <= 0 {
		panic("ledger: LeaseDue needs Limit, Owner and Lease")
	}
	engine.Ensure(ctx, db)
	var keys []string
	if len(p.Keys) > 0 {
		keys = p.Keys
	}
	// Planned with its parameters every time (an unnamed statement, its
	// description cached): the generic plan of a prepared statement, which
	// PostgreSQL may switch to after five executions, knows neither the
	// window nor the limit, and made some passes' leases 25-40x slower
	// (lkbench reconcile; BENCHMARKS.md, "the lease, sometimes").
	var from *time.Time
	if !p.ClaimedFrom.IsZero() {
		from = &p.ClaimedFrom
	}
	if engine.Citus() {
		out, drained, err = leaseDueCitus(ctx, db, p, keys, from)
	} else {
		var rows pgx.Rows
		rows, err = db.Query(ctx, leaseDue, pgx.QueryExecModeCacheDescribe, p.Tool, p.Window, p.HeartbeatTimeout, keys, p.IgnoreBackoff, p.Limit, p.Owner, p.Lease, from)
		if err == nil {
			var counted []countedLease
			counted, err = pgx.CollectRows(rows, pgx.RowToStructByName[countedLease])
			out = make([]Leased, len(counted))
			for i, c := range counted {
				out[i] = c.Leased
			}
			// No row: no candidate, or every one lost to a concurrent
			// leaser; the pass ends either way.
			drained = len(counted) == 0 || counted[0].Candidates < p.Limit
		}
	}
	// Shards that could not be read (Citus, a worker down): the keys of
	// the others are leased, and the error says which were left.
	unreached, isPartial := AsShardsUnreachable(err)
	if isPartial {
		err = nil
	}
	if err != nil || len(out) == 0 {
		if isPartial {
			return out, drained, unreached
		}
		return out, drained, wrap(fmt.Sprintf("lease due keys of tool %q", p.Tool), err)
	}
	// A hold committed while the statement ran is invisible to its
	// snapshot (PutHold locks the key row without changing it). PutHold and
	// the lease serialise on that row lock, so a fresh statement sees every
	// hold that could have been missed: give those leases back.
	leased := make([]string, len(out))
	for i, l := range out {
		leased[i] = l.Key.Key
	}
	// Driven by key_holds (a handful of rows), never by reconcile_state:
	// written as EXISTS, its plan scanned every lease this pass holds
	// (thousands while a batch waits for its closing self-check: 20 ms a
	// lease instead of 2; BENCHMARKS.md, "The self-check bracket").
	var heldKeys []string
	if isPartial {
		heldKeys, err = recheckHoldsOneByOne(ctx, db, leased, p.Owner)
	} else {
		var rows pgx.Rows
		rows, err = db.Query(ctx, `UPDATE reconcile_state s SET lease_owner = NULL, lease_expires_at = NULL
		FROM key_holds h
		WHERE h.key = ANY($1::text[]) AND s.key = h.key AND s.lease_owner = $2
		RETURNING s.key`, pgx.QueryExecModeCacheDescribe, leased, p.Owner)
		if err == nil {
			heldKeys, err = pgx.CollectRows(rows, pgx.RowTo[string])
		}
	}
	if err != nil {
		return nil, false, wrap("re-check holds of leased keys", err)
	}
	if len(heldKeys) > 0 {
		out = slices.DeleteFunc(out, func(l Leased) bool { return slices.Contains(heldKeys, l.Key.Key) })
	}
	if isPartial {
		return out, drained, unreached
	}
	return out, drained, nil
}

// batchSender is what of a pool or a transaction pipelines statements.
type batchSender interface {
	SendBatch(ctx context.Context, b *pgx.Batch) pgx.BatchResults
}

// leaseByShard makes leaseDueCitus take the shape it takes while a worker
// is down (the candidates read shard by shard, leased key by key) with
// every worker up: for the side-by-side measure of both shapes
// (BenchmarkCitusLeaseShapes).
var leaseByShard atomic.Bool

// recheckHoldsOneByOne is the holds' re-check of LeaseDueDrained key by
// key, each statement routed to its key's shard: while a worker is down
// (Citus runs the array form on every shard).
func recheckHoldsOneByOne(ctx context.Context, db ledger.DBTX, keys []string, owner string) ([]string, error) {
	var held []string
	for _, k := range keys {
		var got string
		err := db.QueryRow(ctx, `UPDATE reconcile_state s SET lease_owner = NULL, lease_expires_at = NULL
		WHERE s.key = $1 AND s.lease_owner = $2 AND EXISTS (SELECT 1 FROM key_holds h WHERE h.key = $1)
		RETURNING s.key`, pgx.QueryExecModeCacheDescribe, k, owner).Scan(&got)
		switch {
		case errors.Is(err, pgx.ErrNoRows):
		case err != nil:
			return nil, err
		default:
			held = append(held, got)
		}
	}
	return held, nil
}

// countedLease is a row of leaseDue: a key leased, and how many candidates
// the statement found.
type countedLease struct {
	Leased
	Candidates int `db:"candidates"`
}

// leaseTakeover is what both lease statements (PostgreSQL's leaseDue and
// Citus's leaseCandidatesCAS) set on a key's reconcile_state row they
// take: the lease, and the attempt's bookkeeping kept for the same claim,
// reset for a new one (a retry claimed the key again).
const leaseTakeover = `
	tool = excluded.tool,
	lease_owner = excluded.lease_owner,
	lease_expires_at = excluded.lease_expires_at,
	updated_at = excluded.updated_at,
	attempts = CASE WHEN s.claimed_at = excluded.claimed_at THEN s.attempts ELSE 0 END,
	next_probe_at = CASE WHEN s.claimed_at = excluded.claimed_at THEN s.next_probe_at END,
	first_not_found_at = CASE WHEN s.claimed_at = excluded.claimed_at THEN s.first_not_found_at END,
	last_verdict = CASE WHEN s.claimed_at = excluded.claimed_at THEN s.last_verdict END,
	last_error = CASE WHEN s.claimed_at = excluded.claimed_at THEN s.last_error END,
	last_probe_at = CASE WHEN s.claimed_at = excluded.claimed_at THEN s.last_probe_at END,
	claimed_at = excluded.claimed_at`

// leaseDue is LeaseDue's statement: $1-$5 as in duePredicate, $6 limit,
// $7 owner, $8 lease, $9 claimed from or null.
var leaseDue = `
WITH candidates AS (
	SELECT ` + keyColumnsOf("k") + `
	FROM idempotency_keys k
	LEFT JOIN reconcile_state s ON s.key = k.key
	WHERE ` + duePredicate + `
	  AND ($9::timestamptz IS NULL OR k.claimed_at >= $9)
	ORDER BY k.claimed_at
	LIMIT $6
	FOR NO KEY UPDATE OF k SKIP LOCKED
), leased AS (
	INSERT INTO reconcile_state AS s (key, tool, claimed_at, lease_owner, lease_expires_at, updated_at)
	SELECT key, tool, claimed_at, $7, now() + $8::interval, now() FROM candidates
	ON CONFLICT (key) DO UPDATE SET ` + leaseTakeover + `
	-- Evaluated on the latest committed row, not the statement's snapshot:
	-- a lease or back-off written since the snapshot still counts.
	WHERE s.claimed_at <> excluded.claimed_at OR (
	      (s.lease_expires_at IS NULL OR s.lease_expires_at <= now())
	      AND ($5 OR s.next_probe_at IS NULL OR s.next_probe_at <= now()))
	RETURNING s.key, s.attempts, s.first_not_found_at, s.lease_expires_at
)
SELECT ` + keyColumnsOf("c") + `,
       l.attempts, l.first_not_found_at, l.lease_expires_at, now() AS now,
       (SELECT count(*) FROM candidates) AS candidates
FROM leased l JOIN candidates c ON c.key = l.key
ORDER BY c.claimed_at`

// leaseDueCitus is LeaseDue's shape on Citus, which refuses a row lock
// across shards (FOR UPDATE over a distributed table without one key): in
// rounds until the limit is reached or no candidate is left,
//
//  1. a lock-free read of the oldest due keys after the last round's
//     (leaseCandidates: per shard, then merged), with their columns;
//  2. one compare-and-set upsert of their leases (leaseCandidatesCAS),
//     each key leased only if it is still as read (processing, the same
//     claim, the same heartbeat, no hold) and, on the latest committed
//     reconcile_state row, not leased by anyone else nor backing off.
//
// The upsert's ON CONFLICT re-check is what makes a lease exclusive, as in
// the PostgreSQL shape. Concurrent leasers read the same candidates (there
// is no SKIP LOCKED to keep them apart); the loser of each key waits for the
// winner's commit, finds the key leased and goes on to the next round's
// candidates: it skips the keys leased by others, after waiting once per
// contended batch instead of skipping row locks.
func leaseDueCitus(ctx context.Context, db ledger.DBTX, p LeaseParams, keys []string, from *time.Time) (out []Leased, drained bool, err error) {
	var afterAt any = pgtype.Timestamptz{InfinityModifier: pgtype.NegativeInfinity, Valid: true}
	afterKey := ""
	var faults []ShardFault
	byShard := leaseByShard.Load()
	for len(out) < p.Limit {
		want := p.Limit - len(out)
		var cands []ledger.Key
		var err error
		if !byShard {
			var rows pgx.Rows
			rows, err = db.Query(ctx, leaseCandidates, pgx.QueryExecModeCacheDescribe, p.Tool, p.Window, p.HeartbeatTimeout, keys, p.IgnoreBackoff, want, afterAt, afterKey, from)
			if err == nil {
				cands, err = pgx.CollectRows(rows, pgx.RowToStructByName[ledger.Key])
			}
			// A worker is down: the shards that answer, one by one, and
			// their keys leased one by one.
			byShard = err != nil && NodeUnreachable(err)
		}
		if byShard {
			cands, faults, err = leaseCandidatesByShard(ctx, db, p, keys, want, afterAt, afterKey, from)
		}
		if err != nil {
			return nil, false, err
		}
		if len(cands) == 0 {
			drained = true
			break
		}
		ck := make([]string, len(cands))
		cc := make([]time.Time, len(cands))
		ch := make([]*time.Time, len(cands))
		byKey := make(map[string]ledger.Key, len(cands))
		for i, c := range cands {
			ck[i], cc[i], ch[i] = c.Key, c.ClaimedAt, c.HeartbeatAt
			byKey[c.Key] = c
		}
		var l Leased
		var key string
		dest := []any{&key, &l.Attempts, &l.FirstNotFoundAt, &l.LeaseExpiresAt, &l.Now}
		keep := func() error {
			l.Key = byKey[key]
			out = append(out, l)
			l = Leased{}
			return nil
		}
		if !byShard {
			rows, err := db.Query(ctx, leaseCandidatesCAS, pgx.QueryExecModeCacheDescribe, p.Tool, p.Window, p.HeartbeatTimeout, ck, cc, ch, p.IgnoreBackoff, p.Owner, p.Lease)
			if err == nil {
				_, err = pgx.ForEachRow(rows, dest, keep)
			}
			if err != nil {
				return nil, false, err
			}
		} else if bd, ok := db.(batchSender); ok {
			// Key by key, pipelined: one round trip, one implicit
			// transaction (a pool's, as LeaseDue commits before it returns).
			batch := &pgx.Batch{}
			for i := range ck {
				batch.Queue(leaseOneCAS, p.Tool, p.Window, p.HeartbeatTimeout, ck[i], cc[i], ch[i], p.IgnoreBackoff, p.Owner, p.Lease).Query(func(rows pgx.Rows) error {
					_, err := pgx.ForEachRow(rows, dest, keep)
					return err
				})
			}
			if err := bd.SendBatch(ctx, batch).Close(); err != nil {
				return nil, false, err
			}
		} else {
			for i := range ck {
				rows, err := db.Query(ctx, leaseOneCAS, pgx.QueryExecModeCacheDescribe, p.Tool, p.Window, p.HeartbeatTimeout, ck[i], cc[i], ch[i], p.IgnoreBackoff, p.Owner, p.Lease)
				if err == nil {
					_, err = pgx.ForEachRow(rows, dest, keep)
				}
				if err != nil {
					return nil, false, err
				}
			}
		}
		last := cands[len(cands)-1]
		afterAt, afterKey = last.ClaimedAt, last.Key
		if len(cands) < want {
			drained = true
			break
		}
	}
	slices.SortFunc(out, func(a, b Leased) int {
		if c := a.ClaimedAt.Compare(b.ClaimedAt); c != 0 {
			return c
		}
		return strings.Compare(a.Key.Key, b.Key.Key)
	})
	return out, drained, partial(fmt.Sprintf("lease due keys of tool %q", p.Tool), faults)
}

// leaseCandidates is leaseDueCitus's read: $1-$5 as in duePredicate, $6
// limit, $7 and $8 the claimed_at and key of the last candidate of the
// previous round, $9 claimed from or null.
var leaseCandidates = `
SELECT ` + keyColumnsOf("k") + `
FROM idempotency_keys k
LEFT JOIN reconcile_state s ON s.key = k.key
WHERE ` + duePredicate + `
  AND ($9::timestamptz IS NULL OR k.claimed_at >= $9)
  AND (k.claimed_at, k.key) > ($7::timestamptz, $8::text)
ORDER BY k.claimed_at, k.key
LIMIT $6`

// leaseCandidatesCAS is leaseDueCitus's write: $1 tool, $2 window, $3
// heartbeat timeout, $4 the candidates' keys with $5 their claimed_at and
// $6 their heartbeat_at as read, $7 ignore back-off, $8 owner, $9 lease.
// An INSERT ... SELECT from idempotency_keys into the co-located
// reconcile_state: Citus runs it shard by shard. Its DO UPDATE reads the
// time from excluded.updated_at (the statement's now()): Citus refuses a
// function that is not IMMUTABLE there.
var leaseCandidatesCAS = leaseCAS(`k.key = ANY($4::text[])
  AND k.claimed_at = ($5::timestamptz[])[array_position($4::text[], k.key::text)]
  AND k.heartbeat_at IS NOT DISTINCT FROM ($6::timestamptz[])[array_position($4::text[], k.key::text)]`)

// leaseOneCAS is leaseCandidatesCAS for one key ($4, $5 and $6 its key,
// claimed_at and heartbeat_at): Citus routes it to the key's shard. While
// a worker is down the candidates' upsert is sent key by key in one batch,
// because Citus runs the array form on every shard (it does not prune an
// INSERT ... SELECT by = ANY), the unreachable ones too.
var leaseOneCAS = leaseCAS(`k.key = $4::text
  AND k.claimed_at = $5::timestamptz
  AND k.heartbeat_at IS NOT DISTINCT FROM $6::timestamptz`)

// leaseCAS is the compare-and-set upsert of leases on the candidates that
// match says.
func leaseCAS(match string) string {
	return `
INSERT INTO reconcile_state AS s (key, tool, claimed_at, lease_owner, lease_expires_at, updated_at)
SELECT k.key, k.tool, k.claimed_at, $8::text, now() + $9::interval, now()
FROM idempotency_keys k
WHERE ` + match + `
  AND k.status = 'processing'
  AND k.tool = $1::text
  AND k.claimed_at <= now() - $2::interval
  AND (k.heartbeat_at IS NULL OR k.heartbeat_at <= now() - $3::interval)
  AND NOT EXISTS (SELECT 1 FROM key_holds h WHERE h.key = k.key)
ON CONFLICT (key) DO UPDATE SET ` + leaseTakeover + `
WHERE s.claimed_at <> excluded.claimed_at OR (
      (s.lease_expires_at IS NULL OR s.lease_expires_at <= excluded.updated_at)
      AND ($7::bool OR s.next_probe_at IS NULL OR s.next_probe_at <= excluded.updated_at))
RETURNING s.key, s.attempts, s.first_not_found_at, s.lease_expires_at, s.updated_at`
}

// PeekDue lists due keys like LeaseDue but leases nothing and locks nothing:
// for dry runs. It pages by keyset: pass the last key of the previous page
// as after (the zero value starts at the beginning).
func PeekDue(ctx context.Context, db ledger.DBTX, p LeaseParams, after Leased) ([]Leased, error) {
	var keys []string
	if len(p.Keys) > 0 {
		keys = p.Keys
	}
	var afterAt any = pgtype.Timestamptz{InfinityModifier: pgtype.NegativeInfinity, Valid: true}
	if !after.ClaimedAt.IsZero() {
		afterAt = after.ClaimedAt
	}
	rows, err := db.Query(ctx, peekDue, p.Tool, p.Window, p.HeartbeatTimeout, keys, p.IgnoreBackoff, p.Limit, afterAt, after.Key.Key)
	var out []Leased
	if err == nil {
		// Lax: no lease, so LeaseExpiresAt has no column and stays zero.
		out, err = pgx.CollectRows(rows, pgx.RowToStructByNameLax[Leased])
	}
	if err != nil && engine.Citus() && NodeUnreachable(err) {
		return peekDueByShard(ctx, db, p, keys, afterAt, after.Key.Key)
	}
	return out, wrap(fmt.Sprintf("list due keys of tool %q", p.Tool), err)
}

// peekDue is PeekDue's statement: $1-$6 as in LeaseDue, $7 and $8 the
// claimed_at and key of the previous page's last key. It leases nothing, so
// it has no lease_expires_at column.
var peekDue = `
SELECT ` + keyColumnsOf("k") + `,
       CASE WHEN s.claimed_at = k.claimed_at THEN s.attempts ELSE 0 END AS attempts,
       CASE WHEN s.claimed_at = k.claimed_at THEN s.first_not_found_at END AS first_not_found_at,
       now() AS now
FROM idempotency_keys k
LEFT JOIN reconcile_state s ON s.key = k.key
WHERE ` + duePredicate + `
  AND (k.claimed_at, k.key) > ($7::timestamptz, $8::text)
ORDER BY k.claimed_at, k.key
LIMIT $6`

// ProcessingTools lists the tools that have processing keys. A loose index
// scan on the partial index: its cost grows with the number of tools, not
// of rows. Without a parameter, PostgreSQL plans it once per connection
// (with one, it planned it again on every call: in a fleet, on every
// ledger's every pass).
func ProcessingTools(ctx context.Context, db ledger.DBTX) ([]string, error) {
	engine.Ensure(ctx, db)
	const q = `
WITH RECURSIVE t AS (
	(SELECT tool FROM idempotency_keys WHERE status = 'processing' ORDER BY tool LIMIT 1)
	UNION ALL
	SELECT (SELECT tool FROM idempotency_keys WHERE status = 'processing' AND tool > t.tool ORDER BY tool LIMIT 1)
	FROM t WHERE t.tool IS NOT NULL
)
SELECT tool FROM t WHERE tool IS NOT NULL`
	// Citus runs a recursive CTE only within one shard: there, each shard
	// lists its own tools from the partial index and the coordinator
	// merges them (the cost grows with the processing keys, not the tools).
	const qCitus = `SELECT DISTINCT tool FROM idempotency_keys WHERE status = 'processing' ORDER BY tool`
	query := q
	if engine.Citus() {
		query = qCitus
	}
	rows, err := db.Query(ctx, query)
	var tools []string
	if err == nil {
		tools, err = pgx.CollectRows(rows, pgx.RowTo[string])
	}
	if err != nil && engine.Citus() && NodeUnreachable(err) {
		return processingToolsByShard(ctx, db)
	}
	return tools, wrap("list tools with processing keys", err)
}

// Decision is one reconciler decision about a leased key, written by Decide
// in one transaction with its audit row. An operator's decision by hand is
// an OperatorDecision (DecideOperator): it holds no lease.
type Decision struct {
	Key       string
	Tool      string
	ClaimedAt time.Time
	// Owner is the lease holder (LeaseParams.Owner); required: the write
	// is conditional on the lease still being Owner's.
	Owner string
	// Actor is recorded in the audit: the replica id.
	Actor string
	// Verdict is the probe's verdict.
	Verdict string
	// Transition is the ledger change: "" (none), StatusCompleted or
	// StatusFailedRetryable.
	Transition string
	// Outcome for a transition to completed.
	ResponseCode int
	ResponseBody json.RawMessage
	// Action names the decision in the audit trail ("completed",
	// "marked_retryable", "backoff", "awaiting_confirmation", ...).
	Action string
	// Evidence and Error are recorded in the audit.
	Evidence json.RawMessage
	Error    string
	// NextProbeIn schedules the next probe (bookkeeping only).
	NextProbeIn time.Duration
	// CountAttempt adds one to the key's attempts.
	CountAttempt bool
	// NotFoundSeen records the first not_found awaiting confirmation.
	NotFoundSeen bool
	// CheckHeartbeat makes the decision conditional on heartbeat_at being
	// what it was when the key was leased (LeasedHeartbeatAt): a heartbeat
	// that arrived while the probe ran means the attempt is alive, and
	// nothing is decided ("in_flight_again").
	CheckHeartbeat    bool
	LeasedHeartbeatAt *time.Time
}

// pending is one decision as the shared write path (decideMany,
// queueDecision) sees it: a reconciler's Decision as it is, or an
// OperatorDecision with the operator's guards.
type pending struct {
	Decision
	// operator: the decision holds no lease, so it is not conditional on
	// one, and it settles the claim (releasing whoever's lease).
	operator bool
	// requireIdle refuses a key claimed less than window ago or
	// heartbeating within heartbeatTimeout, by the database's clock
	// ("in_flight"; nothing written).
	requireIdle              bool
	window, heartbeatTimeout time.Duration
	// allowFailedRetryable lets a transition to completed apply to a
	// failed_retryable key not re-claimed since (same claimed_at).
	allowFailedRetryable bool
}

// Actions Decide and DecideOperator record instead of the decision's own
// (and ActionInFlight, in operator.go).
const (
	ActionResolvedByOriginal = "resolved_by_original"
	ActionHeld               = "held"
	ActionLeaseLost          = "lease_lost"
	ActionInFlightAgain      = "in_flight_again"
)

// DecideResult says what Decide did.
type DecideResult struct {
	// Applied: the transition (if any) and bookkeeping were written.
	Applied bool
	// Action is what the audit recorded: Decision.Action, or one of the
	// Action constants above.
	Action string
	// Attempts after this decision.
	Attempts int
	// Current is the key as it stands after the decision (zero if gone).
	Current ledger.Key
}

// Decide writes one decision inside tx: the compare-and-set transition of
// the key (conditional on status processing, the claimed_at that was
// probed, the lease, the absence of a hold and, with CheckHeartbeat, an
// unchanged heartbeat), the bookkeeping, and the audit row. When a
// condition fails it changes nothing in the ledger and records why instead:
// "resolved_by_original" when the attempt finished or was re-claimed
// meanwhile, "held" when an operator put it on hold, "in_flight_again" when
// it heartbeat meanwhile; "lease_lost" (another reconciler took the key
// over) writes nothing at all. A decision without an Owner is refused.
//
// Round trips: one locking read, one batch of writes.
func Decide(ctx context.Context, tx pgx.Tx, d Decision) (DecideResult, error) {
	res, err := DecideMany(ctx, tx, []Decision{d})
	if err != nil {
		return DecideResult{}, err
	}
	return res[0], nil
}

// decisionRow is what DecideMany reads about one key under its row lock.
type decisionRow struct {
	cur        ledger.Key
	attempts   int
	leaseOwner *string
	held       bool
	inFlight   bool
}

// DecideMany is Decide for several keys (each at most once) in one
// transaction: one locking read for all of them (in key order, so two
// writers never deadlock on each other's keys) and one batch of writes. The
// results are in the order of ds.
func DecideMany(ctx context.Context, tx pgx.Tx, ds []Decision) ([]DecideResult, error) {
	ps := make([]pending, len(ds))
	for i, d := range ds {
		if d.Owner == "" {
			return nil, fmt.Errorf("ledger: decision on key %q has no Owner (a reconciler decides only keys it leased; an operator's decision is DecideOperator's)", d.Key)
		}
		ps[i] = pending{Decision: d}
	}
	return decideMany(ctx, tx, ps)
}

// decideMany is the write path both kinds of decision share.
func decideMany(ctx context.Context, tx pgx.Tx, ds []pending) ([]DecideResult, error) {
	engine.Ensure(ctx, tx)
	const read = `SELECT d.i, k.key, k.tool, k.request_hash, k.request_body, k.status, k.response_code, k.response_body,
		k.created_at, k.claimed_at, k.updated_at, k.expires_at, k.heartbeat_at,
		coalesce(s.attempts, 0), s.lease_owner,
		EXISTS (SELECT 1 FROM key_holds h WHERE h.key = k.key),
		(k.claimed_at > now() - d.win OR coalesce(k.heartbeat_at > now() - d.hb, false))
	FROM unnest($1::text[], $2::timestamptz[], $3::interval[], $4::interval[]) WITH ORDINALITY AS d(key, claimed_at, win, hb, i)
	JOIN idempotency_keys k ON k.key = d.key
	LEFT JOIN reconcile_state s ON s.key = k.key AND s.claimed_at = d.claimed_at
	ORDER BY k.key
	FOR NO KEY UPDATE OF k`
	// readOne is read for one key ($2, its position $1): Citus's shape,
	// a single-shard query it can lock in. Every table is filtered by the
	// key itself (h.key = $2, not h.key = k.key): Citus routes a locking
	// read to one shard only when it can see that from each table.
	const readOne = `SELECT $1::bigint, k.key, k.tool, k.request_hash, k.request_body, k.status, k.response_code, k.response_body,
		k.created_at, k.claimed_at, k.updated_at, k.expires_at, k.heartbeat_at,
		coalesce(s.attempts, 0), s.lease_owner,
		EXISTS (SELECT 1 FROM key_holds h WHERE h.key = $2),
		(k.claimed_at > now() - $4::interval OR coalesce(k.heartbeat_at > now() - $5::interval, false))
	FROM idempotency_keys k
	LEFT JOIN reconcile_state s ON s.key = k.key AND s.claimed_at = $3
	WHERE k.key = $2
	FOR NO KEY UPDATE OF k`
	keys := make([]string, len(ds))
	claims := make([]time.Time, len(ds))
	wins := make([]time.Duration, len(ds))
	hbs := make([]time.Duration, len(ds))
	for i, d := range ds {
		keys[i], claims[i], wins[i], hbs[i] = d.Key, d.ClaimedAt, d.window, d.heartbeatTimeout
	}
	found := make([]decisionRow, len(ds))
	var i int64
	var r decisionRow
	dest := []any{&i, &r.cur.Key, &r.cur.Tool, &r.cur.RequestHash, &r.cur.RequestBody, &r.cur.Status,
		&r.cur.ResponseCode, &r.cur.ResponseBody, &r.cur.CreatedAt, &r.cur.ClaimedAt, &r.cur.UpdatedAt, &r.cur.ExpiresAt,
		&r.cur.HeartbeatAt, &r.attempts, &r.leaseOwner, &r.held, &r.inFlight}
	keep := func() error {
		found[i-1] = r
		r = decisionRow{}
		return nil
	}
	if engine.Citus() {
		// Citus refuses FOR UPDATE across shards: one locking read per
		// key, each on its key's shard, sent in key order in one batch.
		order := make([]int, len(ds))
		for n := range order {
			order[n] = n
		}
		slices.SortFunc(order, func(a, b int) int { return strings.Compare(keys[a], keys[b]) })
		batch := &pgx.Batch{}
		for _, n := range order {
			batch.Queue(readOne, n+1, keys[n], claims[n], wins[n], hbs[n]).Query(func(rows pgx.Rows) error {
				_, err := pgx.ForEachRow(rows, dest, keep)
				return err
			})
		}
		if err := tx.SendBatch(ctx, batch).Close(); err != nil {
			return nil, wrap("read keys for decision", err)
		}
	} else {
		rows, err := tx.Query(ctx, read, keys, claims, wins, hbs)
		if err != nil {
			return nil, wrap("read keys for decision", err)
		}
		if _, err = pgx.ForEachRow(rows, dest, keep); err != nil {
			return nil, wrap("read keys for decision", err)
		}
	}
	out := make([]DecideResult, len(ds))
	batch := &pgx.Batch{}
	for n, d := range ds {
		if err := queueDecision(batch, d, found[n], &out[n]); err != nil {
			return nil, err
		}
	}
	if batch.Len() > 0 {
		if err := tx.SendBatch(ctx, batch).Close(); err != nil {
			// A transition that found nothing to update is impossible
			// while we hold the row lock; report it, never guess.
			return nil, wrap("write decision", err)
		}
	}
	return out, nil
}

// queueDecision decides one key from what was read under its lock and
// queues its writes; res is filled when the batch runs.
func queueDecision(batch *pgx.Batch, d pending, r decisionRow, res *DecideResult) error {
	cur := r.cur
	attempts := r.attempts
	*res = DecideResult{Current: cur, Attempts: attempts}
	ours := d.operator || (r.leaseOwner != nil && *r.leaseOwner == d.Owner)
	sameClaim := cur.Key != "" && cur.ClaimedAt.Equal(d.ClaimedAt)
	statusOK := cur.Status == ledger.StatusProcessing ||
		(d.allowFailedRetryable && d.Transition == ledger.StatusCompleted && cur.Status == ledger.StatusFailedRetryable)
	switch {
	case !sameClaim || !statusOK:
		res.Action = ActionResolvedByOriginal
	case !ours:
		// Someone else holds the lease now: we write nothing at all, not
		// even an audit row in their name.
		res.Action = ActionLeaseLost
		return nil
	case r.held:
		res.Action = ActionHeld
	case d.CheckHeartbeat && !sameTime(cur.HeartbeatAt, d.LeasedHeartbeatAt):
		res.Action = ActionInFlightAgain
	case d.requireIdle && r.inFlight:
		res.Action = ActionInFlight
		return nil
	default:
		res.Action = d.Action
		res.Applied = true
	}

	var lastErr *string
	if d.Error != "" {
		lastErr = &d.Error
	}
	if !res.Applied {
		// Only our own lease of this claim is given back: a newer claim's
		// bookkeeping and another holder's lease are not ours to touch.
		if !d.operator {
			batch.Queue(`UPDATE reconcile_state SET lease_owner = NULL, lease_expires_at = NULL, updated_at = now()
				WHERE key = $1 AND claimed_at = $2 AND lease_owner = $3`, d.Key, d.ClaimedAt, d.Owner)
		}
	} else {
		scan := func(rows pgx.Rows) error {
			k, err := oneKey(rows, nil)
			res.Current = k
			return err
		}
		switch d.Transition {
		case "":
		case ledger.StatusCompleted:
			if err := validBody("response body", d.ResponseBody); err != nil {
				return err
			}
			batch.Queue(`UPDATE idempotency_keys SET status = 'completed', response_code = $3, response_body = $4, updated_at = now()
				WHERE key = $1 AND claimed_at = $2 AND status IN ('processing', 'failed_retryable')
				RETURNING `+ledger.KeyColumns, d.Key, d.ClaimedAt, d.ResponseCode, nullJSON(d.ResponseBody)).Query(scan)
		case ledger.StatusFailedRetryable:
			batch.Queue(`UPDATE idempotency_keys SET status = 'failed_retryable', updated_at = now()
				WHERE key = $1 AND claimed_at = $2 AND status = 'processing'
				RETURNING `+ledger.KeyColumns, d.Key, d.ClaimedAt).Query(scan)
		default:
			panic("ledger: unknown transition " + d.Transition)
		}
		if d.CountAttempt {
			attempts++
		}
		res.Attempts = attempts
		var next any
		if d.NextProbeIn > 0 {
			next = d.NextProbeIn
		}
		// Bookkeeping: release the lease (whoever holds it: we hold the
		// row lock, so for a lease decision it is ours, and an operator's
		// decision settles the claim), note the verdict, schedule the next
		// probe. The time in DO UPDATE comes from excluded (the VALUES'
		// now()): Citus refuses a function that is not IMMUTABLE there.
		keepNotFound := !d.NotFoundSeen && d.Verdict == "unknown"
		batch.Queue(`INSERT INTO reconcile_state AS s (key, tool, claimed_at, attempts, next_probe_at, last_verdict, last_error, last_probe_at, first_not_found_at, updated_at)
			VALUES ($1, $2, $3, $4, now() + $5::interval, $6, $7, now(), CASE WHEN $8 THEN now() END, now())
			ON CONFLICT (key) DO UPDATE SET
				tool = excluded.tool, claimed_at = excluded.claimed_at, attempts = excluded.attempts,
				next_probe_at = excluded.next_probe_at, last_verdict = excluded.last_verdict,
				last_error = excluded.last_error, last_probe_at = excluded.last_probe_at,
				first_not_found_at = CASE WHEN $8 THEN coalesce(CASE WHEN s.claimed_at = excluded.claimed_at THEN s.first_not_found_at END, excluded.first_not_found_at)
				                          WHEN $9 AND s.claimed_at = excluded.claimed_at THEN s.first_not_found_at END,
				lease_owner = NULL, lease_expires_at = NULL, updated_at = excluded.updated_at`,
			d.Key, d.Tool, d.ClaimedAt, attempts, next, d.Verdict, lastErr, d.NotFoundSeen, keepNotFound)
	}
	queueAudit(batch, AuditEntry{Key: d.Key, Tool: d.Tool, Attempt: res.Attempts, Verdict: d.Verdict, Action: res.Action,
		Evidence: d.Evidence, Error: d.Error, Actor: d.Actor})
	return nil
}

func sameTime(a, b *time.Time) bool {
	if a == nil || b == nil {
		return a == nil && b == nil
	}
	return a.Equal(*b)
}

func getForUpdate(ctx context.Context, db ledger.DBTX, key string) (ledger.Key, error) {
	const q = `SELECT ` + ledger.KeyColumns + ` FROM idempotency_keys WHERE key = $1 FOR NO KEY UPDATE`
	k, err := oneKey(db.Query(ctx, q, key))
	return k, wrap("read key for update", err)
}

// ReleaseLease gives a lease back without a decision (a pass cancelled
// mid-probe, a dry run): the key is due again at once. A crash is not a
// failed attempt, so attempts are left alone.
func ReleaseLease(ctx context.Context, db ledger.DBTX, key, owner string) error {
	_, err := db.Exec(ctx, `UPDATE reconcile_state SET lease_owner = NULL, lease_expires_at = NULL, updated_at = now()
		WHERE key = $1 AND lease_owner = $2`, key, owner)
	return wrap("release lease", err)
}

// ReleaseLeases is ReleaseLease for several keys of one owner.
func ReleaseLeases(ctx context.Context, db ledger.DBTX, keys []string, owner string) error {
	_, err := db.Exec(ctx, `UPDATE reconcile_state SET lease_owner = NULL, lease_expires_at = NULL, updated_at = now()
		WHERE key = ANY($1::text[]) AND lease_owner = $2`, keys, owner)
	if err != nil && engine.Citus() && NodeUnreachable(err) {
		// A worker is down: key by key, each on its key's shard; the
		// leases on the unreachable worker lapse by themselves.
		for _, k := range keys {
			_, err := db.Exec(ctx, `UPDATE reconcile_state SET lease_owner = NULL, lease_expires_at = NULL, updated_at = now()
				WHERE key = $1 AND lease_owner = $2`, k, owner)
			if err != nil && !NodeUnreachable(err) {
				return wrap("release leases", err)
			}
		}
		return nil
	}
	return wrap("release leases", err)
}

// State is the reconciler's bookkeeping for one key.
type State struct {
	Key             string     `json:"key"`
	ClaimedAt       time.Time  `json:"claimed_at"`
	Attempts        int        `json:"attempts"`
	NextProbeAt     *time.Time `json:"next_probe_at,omitempty"`
	LeaseOwner      *string    `json:"lease_owner,omitempty"`
	LeaseExpiresAt  *time.Time `json:"lease_expires_at,omitempty"`
	LastVerdict     *string    `json:"last_verdict,omitempty"`
	LastError       *string    `json:"last_error,omitempty"`
	LastProbeAt     *time.Time `json:"last_probe_at,omitempty"`
	FirstNotFoundAt *time.Time `json:"first_not_found_at,omitempty"`
}

// GetState reads a key's bookkeeping (ErrNotFound if never reconciled).
func GetState(ctx context.Context, db ledger.DBTX, key string) (State, error) {
	var s State
	err := db.QueryRow(ctx, `SELECT key, claimed_at, attempts, next_probe_at, lease_owner, lease_expires_at,
		last_verdict, last_error, last_probe_at, first_not_found_at FROM reconcile_state WHERE key = $1`, key).
		Scan(&s.Key, &s.ClaimedAt, &s.Attempts, &s.NextProbeAt, &s.LeaseOwner, &s.LeaseExpiresAt,
			&s.LastVerdict, &s.LastError, &s.LastProbeAt, &s.FirstNotFoundAt)
	return s, wrap("get reconcile state", err)
}

// AuditEntry is one row of reconcile_audit.
type AuditEntry struct {
	ID        int64           `json:"id"`
	Key       string          `json:"key"`
	Tool      string          `json:"tool"`
	Attempt   int             `json:"attempt"`
	Verdict   string          `json:"verdict"`
	Action    string          `json:"action"`
	Evidence  json.RawMessage `json:"evidence,omitempty"`
	Error     string          `json:"error,omitempty"`
	Actor     string          `json:"actor"`
	CreatedAt time.Time       `json:"created_at"`
}

const insertAudit = `INSERT INTO reconcile_audit (key, tool, attempt, verdict, action, evidence, error, actor)
	VALUES ($1, $2, $3, $4, $5, $6, $7, $8)`

func auditArgs(e AuditEntry) []any {
	var errText *string
	if e.Error != "" {
		errText = &e.Error
	}
	return []any{e.Key, e.Tool, e.Attempt, e.Verdict, e.Action, nullJSON(e.Evidence), errText, e.Actor}
}

// InsertAudit records a decision (invariant 6).
func InsertAudit(ctx context.Context, db ledger.DBTX, e AuditEntry) error {
	_, err := db.Exec(ctx, insertAudit, auditArgs(e)...)
	return wrap("insert audit", err)
}

func queueAudit(b *pgx.Batch, e AuditEntry) {
	b.Queue(insertAudit, auditArgs(e)...)
}

// History returns a key's audit trail, oldest first (at most limit rows, the
// newest ones).
func History(ctx context.Context, db ledger.DBTX, key string, limit int) ([]AuditEntry, error) {
	rows, err := db.Query(ctx, `SELECT id, key, tool, attempt, verdict, action, evidence, coalesce(error, ''), actor, created_at
		FROM (SELECT * FROM reconcile_audit WHERE key = $1 ORDER BY id DESC LIMIT $2) a ORDER BY id`, key, limit)
	if err != nil {
		return nil, wrap("read history", err)
	}
	out, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (AuditEntry, error) {
		var e AuditEntry
		err := r.Scan(&e.ID, &e.Key, &e.Tool, &e.Attempt, &e.Verdict, &e.Action, &e.Evidence, &e.Error, &e.Actor, &e.CreatedAt)
		return e, err
	})
	return out, wrap("read history", err)
}

// TxNow is the database's now() inside tx: the transaction's start, the
// created_at of every audit row tx writes. A write whose COMMIT was
// interrupted is told applied or not by its audit rows at that instant
// (AuditedAt).
func TxNow(ctx context.Context, tx pgx.Tx) (time.Time, error) {
	var t time.Time
	err := tx.QueryRow(ctx, `SELECT now()`).Scan(&t)
	return t, wrap("read the transaction's time", err)
}

// TxAt runs fn in one transaction on db and commits it with commit (nil:
// tx.Commit; tests pass one that breaks the connection). at is the
// transaction's now(), the created_at of every audit row it writes;
// atCommit says the error came from a COMMIT that may have reached the
// server (its outcome unknown: read its audit rows back, AwaitAuditedAt).
// The reconciler's decisions and operators' acts both write this way.
//
// Its statements run with generic plans (plan_cache_mode =
// force_generic_plan, for this transaction only, set by the statement that
// reads its time), except on Citus. They are lookups by key, whose plan
// does not depend on the values; left to PostgreSQL, the locking read of a
// small group of decisions kept a custom plan, planned again on every
// call: in a fleet, whose ledgers decide in small groups, 0.19 plannings
// per key, the largest share of its planning (BENCHMARKS.md, "Many ledgers
// in one process").
func TxAt(ctx context.Context, db Beginner, commit func(pgx.Tx, context.Context) error, fn func(pgx.Tx) error) (at time.Time, atCommit bool, err error) {
	if commit == nil {
		commit = pgx.Tx.Commit
	}
	tx, err := db.Begin(ctx)
	if err != nil {
		return at, false, err
	}
	defer func() { _ = tx.Rollback(context.WithoutCancel(ctx)) }() // after a commit: nothing to roll back
	engine.Ensure(ctx, tx)
	if engine.Citus() {
		// Citus cannot plan its shape of the decisions' locking read
		// (readOne) generically: every decision failed with "could not
		// create distributed plan". There, PostgreSQL's own choice stands.
		at, err = TxNow(ctx, tx)
	} else {
		err = wrap("read the transaction's time",
			tx.QueryRow(ctx, `SELECT now(), set_config('plan_cache_mode', 'force_generic_plan', true)`).Scan(&at, nil))
	}
	if err != nil {
		return at, false, err
	}
	if err = fn(tx); err != nil {
		return at, false, err
	}
	if err = commit(tx, ctx); err != nil {
		return at, !ledger.NothingWritten(err), err
	}
	return at, false, nil
}

// AwaitAuditedAt is AuditedAt read through a failover: tried again, with
// FailoverBackoff, while the error is one (ledger.FailoverReason), until
// deadline.
func AwaitAuditedAt(ctx context.Context, db ledger.DBTX, keys []string, at, deadline time.Time) (map[string]string, error) {
	for n := 0; ; n++ {
		rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 10*time.Second)
		got, err := AuditedAt(rctx, db, keys, at)
		cancel()
		if err == nil {
			return got, nil
		}
		if _, failover := ledger.FailoverReason(err); !failover || !FailoverBackoff(ctx, n, deadline) {
			return nil, err
		}
	}
}

// FailoverBackoff waits before try n+1 of a statement a failover refused:
// 250 ms doubling to 2 s, jittered. false, without waiting, when the wait
// would end past deadline; false when ctx ends first.
func FailoverBackoff(ctx context.Context, n int, deadline time.Time) bool {
	wait := backoff.Delay(250*time.Millisecond, 2*time.Second, n, backoff.Jitter(0.9, 1.1))
	if time.Now().Add(wait).After(deadline) {
		return false
	}
	t := time.NewTimer(wait)
	defer t.Stop()
	select {
	case <-t.C:
		return true
	case <-ctx.Done():
		return false
	}
}

// AuditedAt returns, for each of keys with an audit row written at exactly
// at (a transaction's now(): TxNow), the action of its newest one: the
// decisions that transaction committed. Read after a COMMIT whose outcome
// is unknown (the connection broke under it), on another connection: a
// key present committed, absent did not (every decision and every
// operator act writes an audit row in its own transaction). It reads each
// key's own rows by reconcile_audit_key_idx.
func AuditedAt(ctx context.Context, db ledger.DBTX, keys []string, at time.Time) (map[string]string, error) {
	rows, err := db.Query(ctx, `SELECT DISTINCT ON (key) key, action FROM reconcile_audit
		WHERE key = ANY($1) AND created_at = $2 ORDER BY key, id DESC`, keys, at)
	if err != nil {
		return nil, wrap("read audit rows of an interrupted commit", err)
	}
	out := map[string]string{}
	var k, a string
	_, err = pgx.ForEachRow(rows, []any{&k, &a}, func() error { out[k] = a; return nil })
	return out, wrap("read audit rows of an interrupted commit", err)
}
