package ledger

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
)

// Outcome is what Claim found.
type Outcome int

const (
	// New: this caller owns the key (first claim, or a re-claim of a
	// failed_retryable key): do the work, then Complete.
	New Outcome = iota + 1
	// Replay: the key is completed; answer with the stored response.
	Replay
	// InFlight: another attempt is processing the key; answer 409.
	InFlight
	// FingerprintMismatch: the key was used with other arguments; answer 422.
	FingerprintMismatch
)

func (o Outcome) String() string {
	switch o {
	case New:
		return "new"
	case Replay:
		return "replay"
	case InFlight:
		return "in_flight"
	case FingerprintMismatch:
		return "fingerprint_mismatch"
	}
	return fmt.Sprintf("Outcome(%d)", int(o))
}

// DefaultTTL is how long a key is kept when ClaimParams.TTL is zero: a day
// covers a human restarting a crashed orchestrator the next morning.
const DefaultTTL = 24 * time.Hour

// ClaimParams describe one attempt at a tool call.
type ClaimParams struct {
	Key         string
	Tool        string
	RequestHash string          // hex SHA-256 of the canonical request (Fingerprint)
	RequestBody json.RawMessage // the approved arguments, for probes; may be nil
	// TTL sets expires_at = now() + TTL. Default DefaultTTL.
	TTL time.Duration
}

// ClaimResult is Claim's answer. Row is the key as it stands after the
// claim: for New, ClaimedAt identifies this attempt in Complete/Heartbeat.
type ClaimResult struct {
	Outcome Outcome
	Row     Key
}

// Claim claims a key atomically. Exactly one of any number of concurrent
// callers with the same key gets New; the others get InFlight, Replay or
// FingerprintMismatch according to the row they find.
//
// A claim refused by a node that no longer takes writes (NothingWritten:
// a read-only node after a role flip, a standby) is retried once on
// another connection; on a pool that follows the primary (FollowPrimary)
// that one is on the new primary. Any other failure is returned: when the
// connection broke under the statement, whether the claim committed is
// unknown, and the caller answers "try again" (Middleware: 503
// ledger-unavailable) without running the tool. The retry then finds the
// truth: the claim in flight (409) or none (a fresh claim).
func Claim(ctx context.Context, db DBTX, p ClaimParams) (ClaimResult, error) {
	return claimAs(ctx, db, p, claimFull)
}

// claimAs is Claim reading back shape's columns.
func claimAs(ctx context.Context, db DBTX, p ClaimParams, shape claimShape) (ClaimResult, error) {
	if err := validKey(p.Key, p.Tool); err != nil {
		return ClaimResult{}, err
	}
	if len(p.RequestHash) == 0 || len(p.RequestHash) > 64 {
		return ClaimResult{}, fmt.Errorf("%w: request hash must be 1 to 64 characters", ErrInvalid)
	}
	if err := validBody("request body", p.RequestBody); err != nil {
		return ClaimResult{}, err
	}
	ttl := p.TTL
	if ttl <= 0 {
		ttl = DefaultTTL
	}
	var res ClaimResult
	err := retryWrite(ctx, db, func() (err error) {
		res, err = claim(ctx, db, p, ttl, shape)
		return err
	})
	return res, err
}

// claimShape is what a claim reads back: the whole row (Claim), or only
// what the middleware uses (claimSlim: no request body echoed back, no
// timestamps it never reads; the Row's other fields stay zero), which
// saves scanning seven columns per call.
type claimShape struct {
	sql  string
	read pgx.RowToFunc[claimRow]
	// citusClaim and citusRead are the claim on Citus (UseCitusShapes).
	citusClaim, citusRead string
}

// claimRow is a row of the claim statement, read by column name: whether
// this call claimed the key, and the key as it stands.
type claimRow struct {
	Claimed bool `db:"claimed"`
	Key
}

var (
	claimFull = newClaimShape(KeyColumns, pgx.RowToStructByName[claimRow])
	// Lax: the Key's fields without a column here are left zero.
	claimSlim = newClaimShape(`request_hash, status, response_code, response_body, claimed_at`, pgx.RowToStructByNameLax[claimRow])
)

// newClaimShape builds the one claim statement, reading back cols.
//
// One statement, so a replay (the common retry) costs one round trip:
// insert the key; else re-claim it when it failed_retryable with our
// hash (a retry of an attempt known not to have happened); else read
// the row as it stands. A re-claim's WHERE is re-evaluated on the
// latest row version, so of two concurrent retries only one wins.
// All three parts share the statement's snapshot (READ COMMITTED): a
// row another claim committed after it was taken is neither
// re-claimed nor read, and no row comes back. Then we go round again
// with a fresh snapshot, which sees the row that won (or, if it was
// purged meanwhile, none, and the insert wins).
//
// On Citus the statement is not one: the coordinator runs the insert, the
// re-claim and the read as separate statements on the key's shard, in one
// transaction, each with a snapshot of its own. A row another claim
// committed while ours waited on it is then read by the last part, which
// is the answer the round again would have found; the one-winner rule is
// the insert's ON CONFLICT and the re-claim's re-evaluated WHERE, as on
// PostgreSQL (the tool side's suite runs on Citus in CI).
func newClaimShape(cols string, read pgx.RowToFunc[claimRow]) claimShape {
	return claimShape{read: read, citusClaim: citusClaimSQL(cols), citusRead: `SELECT false AS claimed, ` + cols + `
		FROM idempotency_keys WHERE key = $1`, sql: `WITH ins AS (
		INSERT INTO idempotency_keys (key, tool, request_hash, request_body, expires_at)
		VALUES ($1, $2, $3, $4, now() + $5::interval)
		ON CONFLICT (key) DO NOTHING
		RETURNING ` + cols + `
	), re AS (
		UPDATE idempotency_keys
		SET status = 'processing', claimed_at = now(), updated_at = now(), heartbeat_at = NULL,
		    response_code = NULL, response_body = NULL,
		    expires_at = greatest(expires_at, now() + $5::interval)
		WHERE key = $1 AND status = 'failed_retryable' AND request_hash = $3
		RETURNING ` + cols + `
	)
	SELECT true AS claimed, ` + cols + ` FROM ins
	UNION ALL
	SELECT true, ` + cols + ` FROM re
	UNION ALL
	SELECT false, ` + cols + ` FROM idempotency_keys
	WHERE key = $1 AND NOT EXISTS (SELECT FROM ins) AND NOT EXISTS (SELECT FROM re)`}
}

// citusClaimSQL is the claim on Citus: one statement on the key's shard
// that inserts the key, or re-claims it when it is failed_retryable with
// our hash (the upsert's WHERE, evaluated on the latest row version under
// its lock: of two concurrent retries one wins), and returns the row only
// when this call claimed it. A key it did not claim is read by a second
// statement (citusRead). The three-part statement of PostgreSQL
// (newClaimShape) ran there as five executions per claim and completion,
// most of a claim's cost on the coordinator (BENCHMARKS.md, "Citus against
// PostgreSQL"). Not the PostgreSQL shape: there an upsert whose WHERE
// fails still locks the row, and a replay would cost two round trips.
// Citus refuses now() in DO UPDATE SET: the new claim's times come from
// excluded, the row proposed with the columns' defaults.
func citusClaimSQL(cols string) string {
	return `INSERT INTO idempotency_keys AS k (key, tool, request_hash, request_body, expires_at)
		VALUES ($1, $2, $3, $4, now() + $5::interval)
		ON CONFLICT (key) DO UPDATE
		SET status = 'processing', claimed_at = excluded.claimed_at, updated_at = excluded.updated_at,
		    heartbeat_at = NULL, response_code = NULL, response_body = NULL,
		    expires_at = greatest(k.expires_at, excluded.expires_at)
		WHERE k.status = 'failed_retryable' AND k.request_hash = excluded.request_hash
		RETURNING true AS claimed, ` + cols
}

// citusShapes: this process's ledger is on a Citus coordinator
// (UseCitusShapes).
var citusShapes atomic.Bool

// UseCitusShapes makes this process's claims take their Citus shape (one
// upsert on the key's shard, and a read for a key it did not claim), for a
// ledger distributed over Citus; off, the PostgreSQL shape (one statement
// for every outcome). Both are correct on both engines; each is the
// cheaper on its own. ledgerkeeper's daemon sets it from the database it
// connects to; a tool server on Citus calls it once at start, or lets
// DetectCitus do it.
func UseCitusShapes(on bool) { citusShapes.Store(on) }

// DetectCitus reports whether db's database has the citus extension and
// sets UseCitusShapes accordingly.
func DetectCitus(ctx context.Context, db DBTX) (bool, error) {
	var on bool
	if err := db.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM pg_extension WHERE extname = 'citus')`).Scan(&on); err != nil {
		return false, wrap("look for the citus extension", err)
	}
	UseCitusShapes(on)
	return on, nil
}

// claim runs the claim statement of shape; p is valid, ttl > 0.
func claim(ctx context.Context, db DBTX, p ClaimParams, ttl time.Duration, shape claimShape) (ClaimResult, error) {
	for range 5 {
		var row claimRow
		var err error
		if citusShapes.Load() {
			row, err = claimOnCitus(ctx, db, p, ttl, shape)
		} else {
			var rows pgx.Rows
			rows, err = db.Query(ctx, shape.sql, p.Key, p.Tool, p.RequestHash, nullJSON(p.RequestBody), ttl)
			if err != nil {
				return ClaimResult{}, wrap("claim key", err)
			}
			row, err = pgx.CollectOneRow(rows, shape.read)
		}
		claimed, k := row.Claimed, row.Key
		if errors.Is(err, pgx.ErrNoRows) {
			continue // changed after our snapshot: look again
		}
		if err != nil {
			return ClaimResult{}, wrap("claim key", err)
		}
		switch {
		case claimed:
			return ClaimResult{Outcome: New, Row: k}, nil
		case k.RequestHash != p.RequestHash:
			return ClaimResult{Outcome: FingerprintMismatch, Row: k}, nil
		case k.Status == StatusCompleted:
			return ClaimResult{Outcome: Replay, Row: k}, nil
		case k.Status == StatusProcessing:
			return ClaimResult{Outcome: InFlight, Row: k}, nil
		}
		// failed_retryable with our hash, yet the re-claim lost: another
		// retry re-claimed it after our snapshot. Look again.
	}
	return ClaimResult{}, fmt.Errorf("claim key: the row kept changing under us")
}

// claimOnCitus is one round of the Citus claim: the upsert, and when it
// claimed nothing, the row as it stands (pgx.ErrNoRows if it was purged
// meanwhile: the caller goes round again).
func claimOnCitus(ctx context.Context, db DBTX, p ClaimParams, ttl time.Duration, shape claimShape) (claimRow, error) {
	rows, err := db.Query(ctx, shape.citusClaim, p.Key, p.Tool, p.RequestHash, nullJSON(p.RequestBody), ttl)
	if err != nil {
		return claimRow{}, err
	}
	row, err := pgx.CollectOneRow(rows, shape.read)
	if !errors.Is(err, pgx.ErrNoRows) {
		return row, err
	}
	rows, err = db.Query(ctx, shape.citusRead, p.Key)
	if err != nil {
		return claimRow{}, err
	}
	return pgx.CollectOneRow(rows, shape.read)
}

func nullJSON(b json.RawMessage) any {
	if b == nil {
		return nil
	}
	return string(b)
}

// Complete stores the definitive outcome of the attempt that claimed the key
// at claimedAt. It returns ErrConflict when that attempt no longer owns the
// key: the reconciler resolved it, or a retry re-claimed it.
//
// A key the reconciler marked failed_retryable while this attempt was still
// running (same claimed_at, not re-claimed since) is completed all the same:
// the effect happened, and storing it prevents the retry that would redo it.
//
// Like Claim, a Complete refused by a node that no longer takes writes is
// retried once on another connection. When it fails all the same (the
// connection broke across a failover), the key stays processing and the
// reconciler's probe finds the effect.
func Complete(ctx context.Context, db DBTX, key string, claimedAt time.Time, code int, body json.RawMessage) error {
	if err := validBody("response body", body); err != nil {
		return err
	}
	const q = `UPDATE idempotency_keys
		SET status = 'completed', response_code = $3, response_body = $4, updated_at = now()
		WHERE key = $1 AND claimed_at = $2 AND status IN ('processing', 'failed_retryable')`
	var tag pgconn.CommandTag
	err := retryWrite(ctx, db, func() (err error) {
		tag, err = db.Exec(ctx, q, key, claimedAt, code, nullJSON(body))
		return err
	})
	if err != nil {
		return wrap("complete key", err)
	}
	if tag.RowsAffected() == 0 {
		return fmt.Errorf("complete key %q: %w", key, ErrConflict)
	}
	return nil
}

// Heartbeat tells the reconciler that the attempt that claimed the key at
// claimedAt is still working: the key is left alone while heartbeat_at +
// heartbeat_timeout is in the future, whatever its processing window.
func Heartbeat(ctx context.Context, db DBTX, key string, claimedAt time.Time) error {
	const q = `UPDATE idempotency_keys SET heartbeat_at = now()
		WHERE key = $1 AND claimed_at = $2 AND status = 'processing'`
	tag, err := db.Exec(ctx, q, key, claimedAt)
	if err != nil {
		return wrap("heartbeat key", err)
	}
	if tag.RowsAffected() == 0 {
		return fmt.Errorf("heartbeat key %q: %w", key, ErrConflict)
	}
	return nil
}

// Abandon marks the attempt's key failed_retryable. Call it only when the
// handler knows the effect did not happen (it failed before touching the
// downstream); when in doubt, leave the key processing for the reconciler.
func Abandon(ctx context.Context, db DBTX, key string, claimedAt time.Time) error {
	const q = `UPDATE idempotency_keys SET status = 'failed_retryable', updated_at = now()
		WHERE key = $1 AND claimed_at = $2 AND status = 'processing'`
	tag, err := db.Exec(ctx, q, key, claimedAt)
	if err != nil {
		return wrap("abandon key", err)
	}
	if tag.RowsAffected() == 0 {
		return fmt.Errorf("abandon key %q: %w", key, ErrConflict)
	}
	return nil
}
