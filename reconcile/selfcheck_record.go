package reconcile

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/ledgerkeeper/ledgerkeeper/alerts"
	"github.com/ledgerkeeper/ledgerkeeper/internal/safetext"
	"github.com/ledgerkeeper/ledgerkeeper/ledger"
	"github.com/ledgerkeeper/ledgerkeeper/probes"
	"github.com/ledgerkeeper/ledgerkeeper/store"
)

func fromRecord(rec store.SelfCheckRecord) CheckResult {
	r := CheckResult{Tool: rec.Tool, Outcome: rec.Outcome, Fingerprint: rec.Fingerprint, Summary: rec.Summary,
		Disagreements: rec.Disagreements, Actor: rec.Actor, CheckedAt: rec.CheckedAt, Cached: true}
	var ev checkEvidence
	if json.Unmarshal(rec.Evidence, &ev) == nil {
		r.Samples, r.Absent = ev.Samples, ev.Absent
	}
	r.PresentUnverified = !r.Witnessed()
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

// checkContext is what a check is recorded with besides its own result.
type checkContext struct {
	// opener is the trusted check before the batch this check closes (nil
	// for a check that opens one): what changed between the two goes into
	// the probe_untrusted alert.
	opener *CheckResult
	// batchUnanswered counts the batch's probes the downstream did not
	// answer: withheld when the closing check could not conclude, they
	// still count for the breaker.
	batchUnanswered int
	// heldNotFound counts the batch's not_found verdicts held for want of
	// a witness: a probe_unwitnessed alert is raised.
	heldNotFound int
}

// checkRecorded is what recording a check did.
type checkRecorded struct {
	br       breakerChange
	raised   int
	resolved int
}

// recordCheck stores a check, feeds its answers (and, for an inconclusive
// closing check, the batch's unanswered probes) to the circuit breaker, and
// raises or resolves the probe_untrusted and probe_unwitnessed alerts, in
// one transaction.
func (e *Engine) recordCheck(ctx context.Context, r CheckResult, cc checkContext) (checkRecorded, error) {
	var rec checkRecorded
	evidence, err := json.Marshal(checkEvidence{r.Samples, r.Absent})
	if err != nil {
		return rec, fmt.Errorf("encode self-check evidence: %w", err)
	}
	vc := verdictCount{tool: r.Tool}
	for _, s := range append([]SampleCheck{r.Absent}, r.Samples...) {
		switch {
		case s.Unreachable:
			vc.unknowns++
			vc.lastErr = s.Error
		case s.NotRendered:
			// Never sent: says nothing of the downstream.
		case s.Verdict != string(probes.Unknown):
			vc.conclusive = true
		}
	}
	if r.Outcome == CheckInconclusive && !r.Paused {
		vc.unknowns += cc.batchUnanswered
	}
	write := func(evidence []byte) error {
		rec = checkRecorded{}
		return pgx.BeginFunc(ctx, e.pool, func(tx pgx.Tx) error {
			err := store.PutSelfCheck(ctx, tx, store.SelfCheckRecord{Tool: r.Tool, Outcome: r.Outcome, Fingerprint: r.Fingerprint,
				Samples: len(r.Samples), PresentFailed: failedCount(r), AbsentVerdict: r.Absent.Verdict,
				Disagreements: r.Disagreements, Summary: r.Summary, Evidence: evidence, Actor: r.Actor})
			if err != nil {
				return err
			}
			if rec.br, err = e.countVerdicts(ctx, tx, vc); err != nil {
				return err
			}
			if rec.br.opened {
				rec.raised++
			}
			rec.resolved += rec.br.resolved
			raise := func(a alerts.Alert) error {
				ok, err := alerts.Raise(ctx, tx, a, e.cfg.RenotifyAfter)
				if ok {
					rec.raised++
				}
				return err
			}
			resolve := func(reason alerts.Reason, how string) error {
				n, err := alerts.ResolveToolReason(ctx, tx, r.Tool, reason, how)
				rec.resolved += n
				return err
			}
			switch r.Outcome {
			case CheckUntrusted:
				note := "self-check " + r.Summary
				if cc.opener != nil {
					note += "; " + changedSince(*cc.opener, r)
				}
				err = raise(alerts.Alert{Reason: alerts.ReasonProbeUntrusted, Tool: r.Tool,
					Details: alerts.Details{Note: safetext.Clip(note, 1500), LastError: safetext.Clip(r.evidenceText(), 1800)}})
			case CheckTrusted:
				err = resolve(alerts.ReasonProbeUntrusted, "the probe passed its self-check again")
			}
			if err != nil {
				return err
			}
			// Raised whenever not_found verdicts are held, even when this
			// check saw a witness and the batch's opener did not.
			switch {
			case r.Trusted() && cc.heldNotFound > 0:
				return raise(alerts.Alert{Reason: alerts.ReasonProbeUnwitnessed, Tool: r.Tool,
					Details: alerts.Details{Note: unwitnessedNote(r.Tool, cc.heldNotFound), LastError: safetext.Clip(r.evidenceText(), 1800)}})
			case r.Witnessed():
				return resolve(alerts.ReasonProbeUnwitnessed, "a present-side sample came back found: not_found verdicts are believed again")
			}
			return nil
		})
	}
	err = write(evidence)
	if err != nil && evidenceRefused(err) {
		// The evidence, not the check, is what the database refused: keep
		// the verdicts, drop the texts.
		err = write(droppedEvidence(err))
	}
	return rec, err
}

// unwitnessedNote says why not_found verdicts were held and what to do.
func unwitnessedNote(tool string, held int) string {
	return fmt.Sprintf("%d not_found verdict(s) held, keys left processing: no present-side sample came back found, "+
		"so nothing shows the probe can find an effect of %s (a typo'd path answers 404 for everything). "+
		"Add a canary, an effect known to exist downstream: `ledgerkeeper probe canary add KEY --tool %s --reason TEXT`, "+
		"or tools.%s.probe.self_check.canaries in the configuration", held, tool, tool, tool)
}

// changedSince says what changed between the trusted check that opened a
// batch and the check that closed it: each probe whose verdict moved.
func changedSince(before, after CheckResult) string {
	var b strings.Builder
	fmt.Fprintf(&b, "before the batch, at %s, it was %s; what changed: ", before.CheckedAt.UTC().Format(time.RFC3339), before.Outcome)
	var moved []string
	if before.Absent.Verdict != after.Absent.Verdict {
		moved = append(moved, fmt.Sprintf("the made-up key %s -> %s", before.Absent.Verdict, after.Absent.Verdict))
	}
	was := map[string]string{}
	for _, s := range before.Samples {
		was[s.Key] = s.Verdict
	}
	for _, s := range after.Samples {
		if v, ok := was[s.Key]; ok && v != s.Verdict {
			moved = append(moved, fmt.Sprintf("%s %s -> %s", s.Key, v, s.Verdict))
		}
	}
	if len(moved) == 0 {
		moved = append(moved, "no verdict moved; the stored values or the samples differ")
	}
	b.WriteString(strings.Join(moved, ", "))
	return b.String()
}

func failedCount(r CheckResult) int {
	n := 0
	for _, s := range r.Samples {
		if !s.Passed && !s.Unreachable && !s.NotRendered && !s.WitnessOnly {
			n++
		}
	}
	return n
}

// check runs a fresh self-check of the tool's probe (shape: a due key's
// request body, modelling the made-up key's when no sample has one),
// stores it (shared with replicas and `status`) unless this is a dry run,
// and tells the tool's breaker what it learnt. A stored check never
// vouches for a batch: every batch is bracketed by checks of its own.
func (t *toolRun) check(ctx context.Context, shape json.RawMessage, with func(CheckResult) checkContext) (CheckResult, error) {
	e := t.p.e
	if !t.sampled {
		// Drawn once per pass and reused by every check of the tool's
		// batches: the keys known to exist do not change mid-pass.
		s, err := e.drawSamples(ctx, t.tool, t.policy)
		if err != nil {
			return CheckResult{}, err
		}
		t.samples, t.sampled = s, true
	}
	r, err := e.runCheck(ctx, t.tool, t.policy, shape, t.samples)
	if err != nil || r.Paused {
		// Paused: a polite "come back later" vouches for nothing and
		// counts nothing; nothing is stored.
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
	rec, err := e.recordCheck(wctx, r, with(r))
	if err != nil {
		return r, err
	}
	t.p.countAlerts(rec.raised, rec.resolved)
	t.breakerChanged(rec.br)
	e.logger.Log(ctx, slogLevelFor(r.Outcome), "probe self-check", "tool", t.tool, "outcome", r.Outcome, "summary", r.Summary)
	return r, nil
}
