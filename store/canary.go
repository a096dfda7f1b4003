package store

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/ledgerkeeper/ledgerkeeper/ledger"
)

// This file holds the SQL of probe_canaries, the canaries operators mark
// with `ledgerkeeper probe canary add`, and NewestGroundTruth, the
// self-check's last present-side source. A probe's not_found verdicts are
// believed only when a present sample came back found; the samples are, in
// order: keys completed by their original attempt within self_check.max_age
// (SelfCheckSamples), canaries (declared in the configuration, or stored
// here), then the tool's newest such key at any age (NewestGroundTruth).
//
// probe_canaries is operator-maintained: no retention purges it, and it has
// no foreign key to idempotency_keys, so a canary outlives its key's row.

// ErrCanaryExists is AddCanary's refusal to add a canary the tool already
// has: the stored one is left as it is (its reason and actor are someone's
// word; remove it first to replace it).
var ErrCanaryExists = errors.New("canary already exists")

// Canary is an effect known to exist downstream, marked by an operator as a
// present-side witness for a tool's probe self-check: the probe must find it,
// so a probe that finds nothing (a typo'd path answering 404) is not believed
// when it says not_found.
type Canary struct {
	// Tool is the tool whose probe is asked about Key.
	Tool string `json:"tool"`
	// Key is the idempotency key as the probe addresses it downstream; it
	// need not be in the ledger.
	Key string `json:"key"`
	// RequestBody is what the probe's templates read ({request.…}); nil
	// when none was given and the ledger had none for the key.
	RequestBody json.RawMessage `json:"request_body,omitempty"`
	// Reason is why the operator trusts the effect to exist and stay.
	Reason string `json:"reason"`
	// Actor is who marked it.
	Actor string `json:"actor"`
	// CreatedAt is when it was marked, by the database's clock.
	CreatedAt time.Time `json:"created_at"`
}

const canaryColumns = `tool, key, request_body, reason, actor, created_at`

// Audit actions of canaries. A canary belongs to no attempt of its key (the
// key may not even be in the ledger), so its audit rows carry attempt 0.
const (
	auditCanaryAdded   = "canary_added"
	auditCanaryRemoved = "canary_removed"
)

// addCanary inserts the canary and its audit row in one statement (a
// data-modifying CTE runs whether or not the outer SELECT reads it), so
// neither is ever written without the other. ON CONFLICT DO NOTHING: an
// existing canary returns no row and nothing is written, its audit row
// included. A nil body ($3) takes the request_body of the key's ledger row
// of that tool, if any.
const addCanary = `WITH added AS (
	INSERT INTO probe_canaries (tool, key, request_body, reason, actor)
	SELECT $1::text, $2::text,
		coalesce($3::jsonb, (SELECT k.request_body FROM idempotency_keys k WHERE k.key = $2::text AND k.tool = $1::text)),
		$4::text, $5::text
	ON CONFLICT (tool, key) DO NOTHING
	RETURNING ` + canaryColumns + `
), audited AS (
	INSERT INTO reconcile_audit (key, tool, attempt, verdict, action, evidence, error, actor)
	SELECT key, tool, 0, 'operator', '` + auditCanaryAdded + `',
		jsonb_build_object('request_body', CASE WHEN $3::jsonb IS NOT NULL THEN 'given'
			WHEN request_body IS NOT NULL THEN 'from_ledger' ELSE 'none' END),
		reason, actor
	FROM added
)
SELECT ` + canaryColumns + ` FROM added`

// AddCanary stores an operator's canary and audits it (action canary_added,
// the reason in the audit row's error column, as holds keep theirs), in one
// statement. When c.RequestBody is nil and the key is in the ledger under
// c.Tool, the ledger row's request_body is stored. It returns the stored
// canary, CreatedAt by the database's clock.
//
// A canary the tool already has is refused with an error wrapping
// ErrCanaryExists and nothing changes; the Canary returned with it is the
// stored one, so the caller can say whose it is. ledger.ErrInvalid for an
// empty or over-long tool or key, a body that is not JSON, or no reason or
// actor.
func AddCanary(ctx context.Context, db ledger.DBTX, c Canary) (Canary, error) {
	if err := validCanary(c.Tool, c.Key, c.Actor, c.Reason); err != nil {
		return Canary{}, err
	}
	if err := validBody("canary request body", c.RequestBody); err != nil {
		return Canary{}, err
	}
	op := fmt.Sprintf("add canary %q of tool %q", c.Key, c.Tool)
	rows, err := db.Query(ctx, addCanary, c.Tool, c.Key, nullJSON(c.RequestBody), c.Reason, c.Actor)
	if err != nil {
		return Canary{}, wrap(op, err)
	}
	added, err := pgx.CollectExactlyOneRow(rows, pgx.RowToStructByName[Canary])
	if errors.Is(err, pgx.ErrNoRows) {
		existing, gerr := getCanary(ctx, db, c.Tool, c.Key)
		if gerr != nil && !errors.Is(gerr, ledger.ErrNotFound) {
			return Canary{}, gerr
		}
		return existing, fmt.Errorf("%s: %w", op, ErrCanaryExists)
	}
	return added, wrap(op, err)
}

// removeCanary deletes the canary and audits it in one statement; the
// audit row's evidence keeps what was removed (who added it, when, why).
const removeCanary = `WITH removed AS (
	DELETE FROM probe_canaries WHERE tool = $1 AND key = $2
	RETURNING ` + canaryColumns + `
), audited AS (
	INSERT INTO reconcile_audit (key, tool, attempt, verdict, action, evidence, error, actor)
	SELECT key, tool, 0, 'operator', '` + auditCanaryRemoved + `',
		jsonb_build_object('added_by', actor, 'added_at', created_at, 'added_because', reason),
		$4::text, $3::text
	FROM removed
)
SELECT ` + canaryColumns + ` FROM removed`

// RemoveCanary deletes an operator's canary and audits it (action
// canary_removed, by actor, the reason in the error column), in one
// statement, and returns the canary removed. ledger.ErrNotFound when the
// tool has no such canary (nothing is written); ledger.ErrInvalid without
// an actor or a reason.
func RemoveCanary(ctx context.Context, db ledger.DBTX, tool, key, actor, reason string) (Canary, error) {
	if err := validCanary(tool, key, actor, reason); err != nil {
		return Canary{}, err
	}
	rows, err := db.Query(ctx, removeCanary, tool, key, actor, reason)
	if err != nil {
		return Canary{}, wrap(fmt.Sprintf("remove canary %q of tool %q", key, tool), err)
	}
	removed, err := pgx.CollectExactlyOneRow(rows, pgx.RowToStructByName[Canary])
	return removed, wrap(fmt.Sprintf("remove canary %q of tool %q", key, tool), err)
}

// Canaries lists a tool's stored canaries, newest first; tool "" lists
// every tool's, ordered by tool, then newest first. Unbounded on purpose:
// operators add canaries one by one, a handful per tool, and the
// self-check needs all of them.
func Canaries(ctx context.Context, db ledger.DBTX, tool string) ([]Canary, error) {
	rows, err := db.Query(ctx, `SELECT `+canaryColumns+` FROM probe_canaries
		WHERE $1::text = '' OR tool = $1::text
		ORDER BY tool, created_at DESC, key`, tool)
	if err != nil {
		return nil, wrap("list canaries", err)
	}
	out, err := pgx.CollectRows(rows, pgx.RowToStructByName[Canary])
	return out, wrap("list canaries", err)
}

func getCanary(ctx context.Context, db ledger.DBTX, tool, key string) (Canary, error) {
	rows, err := db.Query(ctx, `SELECT `+canaryColumns+` FROM probe_canaries WHERE tool = $1 AND key = $2`, tool, key)
	if err != nil {
		return Canary{}, wrap("read canary", err)
	}
	c, err := pgx.CollectExactlyOneRow(rows, pgx.RowToStructByName[Canary])
	return c, wrap("read canary", err)
}

// validCanary refuses what the table would store meaninglessly (an empty
// reason or actor) or refuse with a less useful error (too long).
func validCanary(tool, key, actor, reason string) error {
	switch {
	case tool == "":
		return fmt.Errorf("%w: canary without a tool", ledger.ErrInvalid)
	case len(tool) > ledger.MaxToolLength:
		return fmt.Errorf("%w: canary tool is %d bytes, at most %d", ledger.ErrInvalid, len(tool), ledger.MaxToolLength)
	case key == "":
		return fmt.Errorf("%w: canary without a key", ledger.ErrInvalid)
	case len(key) > ledger.MaxKeyLength:
		return fmt.Errorf("%w: canary key is %d bytes, at most %d", ledger.ErrInvalid, len(key), ledger.MaxKeyLength)
	case actor == "":
		return fmt.Errorf("%w: canary change without an actor", ledger.ErrInvalid)
	case reason == "":
		return fmt.Errorf("%w: canary change without a reason", ledger.ErrInvalid)
	}
	return nil
}

// newestGroundTruth is SelfCheckSamples' ground-truth rule without its age
// bound, newest first claim, one row.
//
// Plan (checked by TestNewestGroundTruthIsABackwardIndexScan): an Index
// Scan Backward on idempotency_keys_tool_created_idx from the tool's newest
// key, stopping at the first row that passes; each row it passes over costs
// a heap fetch and an index probe of reconcile_audit_key_idx. So the cost is
// the number of the tool's keys newer than the answer (processing,
// failed_retryable, reconciler- or operator-completed, excluded): a few on a
// live tool, and at worst the tool's whole range when it has no ground
// truth at all.
const newestGroundTruth = `SELECT ` + ledger.KeyColumns + `
FROM idempotency_keys k
WHERE k.tool = $1
  AND k.status = 'completed'
  AND NOT (k.key = ANY($2::text[]))
  AND NOT EXISTS (SELECT 1 FROM reconcile_audit a
                  WHERE a.key = k.key AND a.action = ANY($3::text[]))
ORDER BY k.created_at DESC
LIMIT 1`

// NewestGroundTruth returns the tool's newest key (by created_at) that is
// ground truth by SelfCheckSamples' rule, completed with an outcome its tool
// server stored itself, at any age, skipping the keys in exclude (the
// samples already drawn). It is the self-check's last present-side source,
// for a tool with no key completed within self_check.max_age and no canary.
// false when the tool has none.
//
// The rule reads the audit trail, which audit_max_age trims: a key the
// reconciler completed longer ago than that has lost the row that marks it
// and passes as ground truth.
func NewestGroundTruth(ctx context.Context, db ledger.DBTX, tool string, exclude []string) (ledger.Key, bool, error) {
	if exclude == nil {
		exclude = []string{} // NULL would make NOT (key = ANY(NULL)) null: no row at all
	}
	k, err := oneKey(db.Query(ctx, newestGroundTruth, tool, exclude, notGroundTruthActions))
	if errors.Is(err, pgx.ErrNoRows) {
		return ledger.Key{}, false, nil
	}
	if err != nil {
		return ledger.Key{}, false, wrap(fmt.Sprintf("find the newest ground-truth key of tool %q", tool), err)
	}
	return k, true, nil
}
