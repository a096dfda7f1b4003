package store

import (
	"context"
	"encoding/json"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/ledgerkeeper/ledgerkeeper/internal/engine"
	"github.com/ledgerkeeper/ledgerkeeper/ledger"
)

// SelfCheckSamples returns up to limit keys of tool that are ground truth
// for a probe's self-check: completed, first claimed and last updated within
// maxAge, and whose outcome the tool server stored itself (no reconciler
// "completed" decision and no operator resolution in the audit trail; a key
// the original attempt completed while the reconciler probed it counts).
// Newest first claim first.
//
// Cost: a backward scan of the (tool, created_at) index that stops after
// limit matching rows, so a ledger of any size answers in a few reads.
func SelfCheckSamples(ctx context.Context, db ledger.DBTX, tool string, maxAge time.Duration, limit int) ([]ledger.Key, error) {
	const q = `SELECT ` + ledger.KeyColumns + `
FROM idempotency_keys k
WHERE k.tool = $1
  AND k.created_at > now() - $2::interval
  AND k.status = 'completed'
  AND k.updated_at > now() - $2::interval
  AND NOT EXISTS (SELECT 1 FROM reconcile_audit a
                  WHERE a.key = k.key AND a.action = ANY($4::text[]))
ORDER BY k.created_at DESC
LIMIT $3`
	// Planned with its parameters every time, as LeaseDue is: the generic
	// plan walks every completed key of the tool and looks each up in the
	// audit instead of stopping after limit rows (0.8 s a call in lkbench
	// reconcile; BENCHMARKS.md, "The self-check bracket").
	rows, err := db.Query(ctx, q, pgx.QueryExecModeCacheDescribe, tool, maxAge, limit, notGroundTruthActions)
	var out []ledger.Key
	if err == nil {
		out, err = pgx.CollectRows(rows, pgx.RowToStructByName[ledger.Key])
	}
	if err != nil && engine.Citus() && NodeUnreachable(err) {
		return selfCheckSamplesByShard(ctx, db, tool, maxAge, limit)
	}
	return out, wrap(fmt.Sprintf("draw self-check samples of tool %q", tool), err)
}

// notGroundTruthActions are the audit actions after which a completed key's
// outcome did not come from its tool server: the reconciler's own
// completion (its outcome came from the probe being checked) and an
// operator's resolution.
var notGroundTruthActions = []string{"completed", "operator_completed", "operator_marked_retryable"}

// SelfCheckRecord is a tool's latest probe self-check, as stored in
// probe_self_checks and shared by every replica.
type SelfCheckRecord struct {
	Tool          string
	Outcome       string
	Fingerprint   string
	Samples       int
	PresentFailed int
	AbsentVerdict string
	// Disagreements accumulates over the row's life (PutSelfCheck adds).
	Disagreements int
	Summary       string
	Evidence      json.RawMessage
	Actor         string
	CheckedAt     time.Time
	// Now is the database's clock when read.
	Now time.Time
}

const selfCheckColumns = `tool, outcome, fingerprint, samples, present_failed, absent_verdict, disagreements,
	summary, evidence, actor, checked_at, now()`

func scanSelfCheck(row pgx.Row) (SelfCheckRecord, error) {
	var r SelfCheckRecord
	err := row.Scan(&r.Tool, &r.Outcome, &r.Fingerprint, &r.Samples, &r.PresentFailed, &r.AbsentVerdict, &r.Disagreements,
		&r.Summary, &r.Evidence, &r.Actor, &r.CheckedAt, &r.Now)
	return r, err
}

// GetSelfCheck reads a tool's latest self-check (ErrNotFound if none).
func GetSelfCheck(ctx context.Context, db ledger.DBTX, tool string) (SelfCheckRecord, error) {
	r, err := scanSelfCheck(db.QueryRow(ctx, `SELECT `+selfCheckColumns+` FROM probe_self_checks WHERE tool = $1`, tool))
	return r, wrap(fmt.Sprintf("read self-check of tool %q", tool), err)
}

// SelfChecks lists every tool's latest self-check, in one statement.
func SelfChecks(ctx context.Context, db ledger.DBTX) ([]SelfCheckRecord, error) {
	rows, err := db.Query(ctx, `SELECT `+selfCheckColumns+` FROM probe_self_checks ORDER BY tool`)
	if err != nil {
		return nil, wrap("list self-checks", err)
	}
	out, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (SelfCheckRecord, error) { return scanSelfCheck(r) })
	return out, wrap("list self-checks", err)
}

// PutSelfCheck stores a tool's latest self-check (adding its disagreements
// to the row's count) inside tx.
func PutSelfCheck(ctx context.Context, tx pgx.Tx, r SelfCheckRecord) error {
	_, err := tx.Exec(ctx, `INSERT INTO probe_self_checks AS c (tool, outcome, fingerprint, samples, present_failed, absent_verdict,
			disagreements, summary, evidence, actor, checked_at)
		VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, now())
		ON CONFLICT (tool) DO UPDATE SET outcome = excluded.outcome, fingerprint = excluded.fingerprint,
			samples = excluded.samples, present_failed = excluded.present_failed, absent_verdict = excluded.absent_verdict,
			disagreements = c.disagreements + excluded.disagreements, summary = excluded.summary,
			evidence = excluded.evidence, actor = excluded.actor, checked_at = now()`,
		r.Tool, r.Outcome, r.Fingerprint, r.Samples, r.PresentFailed, r.AbsentVerdict, r.Disagreements,
		r.Summary, []byte(r.Evidence), r.Actor)
	return wrap(fmt.Sprintf("record self-check of tool %q", r.Tool), err)
}
