package reconcile

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/ledgerkeeper/ledgerkeeper/alerts"
	"github.com/ledgerkeeper/ledgerkeeper/internal/safetext"
	"github.com/ledgerkeeper/ledgerkeeper/ledger"
	"github.com/ledgerkeeper/ledgerkeeper/ledger/store"
	"github.com/ledgerkeeper/ledgerkeeper/probes"
)

// storedCheck reads the latest check of tool.
func storedCheck(ctx context.Context, db ledger.DBTX, tool string) (CheckResult, time.Time, bool, error) {
	rec, err := store.GetSelfCheck(ctx, db, tool)
	if errors.Is(err, ledger.ErrNotFound) {
		return CheckResult{}, time.Time{}, false, nil
	}
	if err != nil {
		return CheckResult{}, time.Time{}, false, err
	}
	return fromRecord(rec), rec.Now, true, nil
}

func fromRecord(rec store.SelfCheckRecord) CheckResult {
	r := CheckResult{Tool: rec.Tool, Outcome: rec.Outcome, Fingerprint: rec.Fingerprint, Summary: rec.Summary,
		Disagreements: rec.Disagreements, Actor: rec.Actor, CheckedAt: rec.CheckedAt, Cached: true}
	var ev checkEvidence
	if json.Unmarshal(rec.Evidence, &ev) == nil {
		r.Samples, r.Absent = ev.Samples, ev.Absent
	}
	r.PresentUnverified = len(r.Samples) == 0
	return r
}

// checkEvidence is what probe_self_checks.evidence holds.
type checkEvidence struct {
	Samples []SampleCheck `json:"samples"`
	Absent  SampleCheck   `json:"absent"`
}

// StoredChecks lists every tool's latest self-check, for `status`.
func StoredChecks(ctx context.Context, db ledger.DBTX) ([]CheckResult, error) {
	recs, err := store.SelfChecks(ctx, db)
	if err != nil {
		return nil, err
	}
	out := make([]CheckResult, len(recs))
	for i, rec := range recs {
		out[i] = fromRecord(rec)
	}
	return out, nil
}

// recordCheck stores a check, feeds its answers to the circuit breaker and
// raises or resolves the probe_untrusted alert, in one transaction.
func (e *Engine) recordCheck(ctx context.Context, r CheckResult) (breakerChange, error) {
	var ch breakerChange
	evidence, err := json.Marshal(checkEvidence{r.Samples, r.Absent})
	if err != nil {
		return ch, fmt.Errorf("encode self-check evidence: %w", err)
	}
	vc := verdictCount{tool: r.Tool}
	for _, s := range append([]SampleCheck{r.Absent}, r.Samples...) {
		switch {
		case s.Unreachable:
			vc.unknowns++
			vc.lastErr = s.Error
		case s.Verdict != string(probes.Unknown):
			vc.conclusive = true
		}
	}
	write := func(evidence []byte) error {
		return pgx.BeginFunc(ctx, e.pool, func(tx pgx.Tx) error {
			err := store.PutSelfCheck(ctx, tx, store.SelfCheckRecord{Tool: r.Tool, Outcome: r.Outcome, Fingerprint: r.Fingerprint,
				Samples: len(r.Samples), PresentFailed: failedCount(r), AbsentVerdict: r.Absent.Verdict,
				Disagreements: r.Disagreements, Summary: r.Summary, Evidence: evidence, Actor: r.Actor})
			if err != nil {
				return err
			}
			if ch, err = e.countVerdicts(ctx, tx, vc); err != nil {
				return err
			}
			switch r.Outcome {
			case CheckUntrusted:
				_, err = alerts.Raise(ctx, tx, alerts.Alert{Reason: alerts.ReasonProbeUntrusted, Tool: r.Tool,
					Details: alerts.Details{Note: "self-check " + r.Summary, LastError: safetext.Clip(r.evidenceText(), 1800)}}, e.cfg.RenotifyAfter)
			case CheckTrusted:
				_, err = alerts.ResolveToolReason(ctx, tx, r.Tool, alerts.ReasonProbeUntrusted, "the probe passed its self-check again")
			}
			return err
		})
	}
	err = write(evidence)
	if err != nil && evidenceRefused(err) {
		// The evidence, not the check, is what the database refused: keep
		// the verdicts, drop the texts.
		err = write(droppedEvidence(err))
	}
	return ch, err
}

func failedCount(r CheckResult) int {
	n := 0
	for _, s := range r.Samples {
		if !s.Passed && !s.Unreachable {
			n++
		}
	}
	return n
}

// ensureTrusted tells whether the tool's verdicts may change the ledger in
// this pass: a stored trusted check made with the same probe configuration
// within SelfCheckInterval, or a new check (stored, shared with replicas,
// unless this is a dry run).
func (t *toolRun) ensureTrusted(ctx context.Context) (CheckResult, error) {
	e := t.p.e
	stored, now, ok, err := storedCheck(ctx, e.pool, t.tool)
	if err != nil {
		return CheckResult{}, err
	}
	if ok && stored.Trusted() && stored.Fingerprint == t.policy.ProbeFingerprint &&
		now.Sub(stored.CheckedAt) < e.cfg.SelfCheckInterval {
		return stored, nil
	}
	r, err := e.runCheck(ctx, t.tool, t.policy)
	if err != nil || r.Paused {
		// Paused: a polite "come back later" vouches for nothing and
		// counts nothing; nothing is stored, the next pass checks again.
		return r, err
	}
	if e.metrics != nil {
		e.metrics.observeCheck(r)
	}
	if t.p.opts.DryRun {
		return r, nil
	}
	wctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), writeTimeout)
	defer cancel()
	ch, err := e.recordCheck(wctx, r)
	if err != nil {
		return r, err
	}
	t.breakerChanged(ch)
	level := slogLevelFor(r.Outcome)
	e.logger.Log(ctx, level, "probe self-check", "tool", t.tool, "outcome", r.Outcome, "summary", r.Summary)
	return r, nil
}
