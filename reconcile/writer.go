package reconcile

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"slices"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/ledgerkeeper/ledgerkeeper/alerts"
	"github.com/ledgerkeeper/ledgerkeeper/internal/backoff"
	"github.com/ledgerkeeper/ledgerkeeper/internal/safetext"
	"github.com/ledgerkeeper/ledgerkeeper/ledger"
	"github.com/ledgerkeeper/ledgerkeeper/store"
)

// decide turns a probe's answer into a plan for the writers (Decide does
// the deciding); a dry run reports it instead (nil plan).
func (t *toolRun) decide(_ context.Context, pr probed) *plan {
	p, cfg := t.p, t.p.e.cfg
	l, res := pr.l, pr.res
	in := Input{Leased: l, Result: res, Policy: t.policy, Rules: cfg.rules(),
		// The database's clock at lease time plus the time until the
		// answer came back (a monotonic local duration): no replica's wall
		// clock enters a decision, and a batch that waited for its closing
		// check is judged as of its answers (confirm_not_found_after
		// measures between probes, not between writes).
		Now:    l.Now.Add(pr.answeredAt.Sub(pr.leasedAt)),
		Jitter: backoff.Jitter(0.9, 1.1),
	}
	res.Evidence = cfg.Redactor.JSON(res.Evidence)
	in.Result = res
	if res.Err != nil {
		in.ErrText = safetext.Clip(cfg.Redactor.String(res.Err.Error()), maxErrorBytes)
	}
	pl := Decide(in)
	d := pl.Decision
	d.Owner, d.Actor = p.owner, cfg.Actor

	if p.opts.DryRun {
		switch d.Transition {
		case ledger.StatusCompleted:
			d.Action = ActionWouldComplete
		case ledger.StatusFailedRetryable:
			d.Action = ActionWouldRetry
		default:
			// Nothing was alerted: the real actions' names say it was.
			// The alerts a real pass would raise are in KeyResult.Alerts.
			if d.Action == ActionDuplicate || d.Action == ActionEscalatedDedup {
				d.Action = ActionWouldAlert
			}
		}
		var names []string
		for _, a := range pl.Raise {
			names = append(names, string(a.Reason))
		}
		p.add(KeyResult{Key: l.Key.Key, Tool: l.Tool, Verdict: d.Verdict, Action: d.Action, Attempts: l.Attempts,
			Error: d.Error, Evidence: d.Evidence, Alerts: names, AgeSecond: pl.Age.Seconds()})
		return nil
	}
	return &plan{t: t, l: l, d: d, raise: pl.Raise, resolveHow: pl.ResolveHow, conclusive: pl.Conclusive, age: pl.Age,
		resolve: pl.Resolve}
}

// plan is a decision ready to be written.
type plan struct {
	t          *toolRun
	l          store.Leased
	d          store.Decision
	raise      []alerts.Alert
	resolveHow string
	conclusive bool
	age        time.Duration
	// resolve: the key may have open alerts (it was decided before, or it
	// expired and purge alerted it). Otherwise resolving is skipped; the
	// sweep at the start of every pass catches anything it would miss.
	resolve bool

	out      store.DecideResult
	raised   []string
	resolved int           // alerts this plan's transaction resolved
	br       breakerChange // the tool's breaker after this plan's transaction
	// breakerReporter: the first plan of its tool in the transaction,
	// the one that reports what the transaction did to the breaker (an
	// opening is logged, counted and alerted once, whatever the group).
	breakerReporter bool
	// dropped: the evidence was replaced by a note because the database
	// refused it (see commitPlans).
	dropped bool
}

// afterDecide writes, inside the decision's transaction, the alerts it
// raises or resolves (invariant 8: all commit together). Per-key
// probe_failing alerts are held back while the tool's breaker is open: the
// tool-wide downstream_unreachable alert covers them.
func (pl *plan) afterDecide(ctx context.Context, tx pgx.Tx) error {
	l, cfg := pl.l, pl.t.p.e.cfg
	pl.raised = pl.raised[:0]
	pl.resolved = 0
	if pl.br.opened && pl.breakerReporter {
		// One opening, one alert: listed on one key of the group only.
		pl.raised = append(pl.raised, string(alerts.ReasonDownstreamUnreachable))
	}
	if pl.breakerReporter {
		pl.resolved += pl.br.resolved
	}
	switch {
	case pl.out.Action == store.ActionResolvedByOriginal:
		// Only a key that is settled (not re-claimed) ends its alerts.
		if pl.out.Current.Key == "" || pl.out.Current.Status != ledger.StatusProcessing {
			n, err := alerts.ResolveKey(ctx, tx, l.Tool, l.Key.Key, "resolved by the original attempt")
			pl.resolved += n
			return err
		}
		return nil
	case !pl.out.Applied:
		return nil
	}
	if pl.resolveHow != "" && pl.resolve {
		n, err := alerts.ResolveKey(ctx, tx, l.Tool, l.Key.Key, pl.resolveHow)
		if err != nil {
			return err
		}
		pl.resolved += n
	}
	for _, a := range pl.raise {
		if a.Reason == alerts.ReasonProbeFailing && pl.br.open {
			continue
		}
		ok, err := alerts.Raise(ctx, tx, a, cfg.RenotifyAfter)
		if err != nil {
			return err
		}
		if ok {
			pl.raised = append(pl.raised, string(a.Reason))
		}
	}
	return nil
}

// finish reports a written plan (or its failure).
func (pl *plan) finish(err error) {
	t, l, d, p := pl.t, pl.l, pl.d, pl.t.p
	if err != nil {
		// Nothing was written: the lease lapses and the key is due again.
		p.e.logger.Error("record reconcile decision", "key", l.Key.Key, "tool", l.Tool, "verdict", d.Verdict, "err", err)
		p.add(KeyResult{Key: l.Key.Key, Tool: l.Tool, Verdict: d.Verdict, Action: "write_failed", Attempts: l.Attempts,
			Error: "decision not recorded: " + safetext.Clip(p.e.cfg.Redactor.String(err.Error()), maxErrorBytes), AgeSecond: pl.age.Seconds()})
		return
	}
	if pl.breakerReporter {
		t.breakerChanged(pl.br)
	}
	p.countAlerts(0, pl.resolved)
	out := pl.out
	p.add(KeyResult{Key: l.Key.Key, Tool: l.Tool, Verdict: d.Verdict, Action: out.Action, Attempts: out.Attempts,
		Error: d.Error, Evidence: d.Evidence, Alerts: slices.Clone(pl.raised), AgeSecond: pl.age.Seconds()})
	if pl.dropped {
		p.e.logger.Warn("decision recorded without its evidence: the database refused it", "key", l.Key.Key, "tool", l.Tool)
	}
	if out.Action != d.Action {
		p.e.logger.Info("decision not applied", "key", l.Key.Key, "tool", l.Tool, "verdict", d.Verdict, "action", out.Action)
	} else if d.Transition != "" {
		p.e.logger.Info("key resolved", "key", l.Key.Key, "tool", l.Tool, "verdict", d.Verdict, "action", out.Action)
	}
}

// breakerChanged notes, after a commit, what the transaction did to the
// tool's breaker.
func (t *toolRun) breakerChanged(ch breakerChange) {
	e := t.p.e
	t.mu.Lock()
	// Failures other writers and the self-check counted bring this pass's
	// own stop closer too.
	t.consecutive = max(t.consecutive, ch.count)
	t.mu.Unlock()
	switch {
	case ch.opened:
		t.mu.Lock()
		t.open = true
		t.openUntil = &ch.until
		t.note = fmt.Sprintf("circuit breaker opened after %d consecutive failed probes; paused until %s", ch.count, ch.until.UTC().Format(time.RFC3339))
		t.mu.Unlock()
		e.logger.Warn("circuit breaker opened", "tool", t.tool, "open_until", ch.until, "opens", ch.opens, "consecutive_failures", ch.count)
		if e.metrics != nil {
			e.metrics.breakerOpened(t.tool)
		}
	case ch.open:
		t.mu.Lock()
		t.open = true
		t.mu.Unlock()
	case ch.closed:
		t.mu.Lock()
		t.halfOpen = false
		t.mu.Unlock()
		e.logger.Info("circuit breaker closed", "tool", t.tool)
	}
}

// maxGroup bounds the decisions one writer commits together. A batch
// closed by its self-check reaches the writers all at once, and the pass
// ends only when they are written: groups of 64 instead of 16 drain it
// faster (lkbench reconcile: the bracketed pass 1,231 -> 1,308 keys/s, the
// unbracketed 1,386 -> 1,429; BENCHMARKS.md, "The self-check bracket"). A
// group that fails is retried one decision at a time.
const maxGroup = 64

// maxErrorBytes bounds a probe error stored in the audit trail.
const maxErrorBytes = 2000

// writeDecisions is one writer: it takes the decisions waiting in the
// channel (up to maxGroup) and commits them in one transaction, saving a
// BEGIN/COMMIT (and, on a durable server, a WAL flush) per key. If the group
// fails, each decision is retried alone, so one bad key cannot block the
// others.
func (p *pass) writeDecisions(ctx context.Context) {
	var group []probed
	for first := range p.decisions {
		group = append(group[:0], first)
	gather:
		for len(group) < maxGroup {
			select {
			case d, ok := <-p.decisions:
				if !ok {
					break gather
				}
				group = append(group, d)
			default:
				break gather
			}
		}
		var plans []*plan
		for _, pr := range group {
			if pl := pr.t.decide(ctx, pr); pl != nil {
				plans = append(plans, pl)
			}
		}
		p.commit(ctx, plans)
	}
}

// commit writes plans in one transaction. A group that fails is retried one
// plan at a time; a single plan that fails because the database refused
// its evidence (encoding, size, a NUL) is retried once with the evidence
// replaced by a note of what was dropped, so that no downstream answer can
// leave a key undecided, uncounted and unalerted.
func (p *pass) commit(ctx context.Context, plans []*plan) {
	if len(plans) == 0 {
		return
	}
	err := p.commitPlans(ctx, plans)
	if err != nil && len(plans) > 1 {
		for _, pl := range plans {
			p.commit(ctx, []*plan{pl})
		}
		return
	}
	if err != nil && evidenceRefused(err) && !plans[0].dropped {
		pl := plans[0]
		pl.dropped = true
		pl.d.Evidence = droppedEvidence(err)
		note := "[probe error dropped: the database refused it (" + refusedCode(err) + ")]"
		pl.d.Error = note
		for i := range pl.raise {
			pl.raise[i].Details.LastError = note
		}
		err = p.commitPlans(ctx, plans)
	}
	for _, pl := range plans {
		pl.finish(err)
	}
}

func (p *pass) commitPlans(ctx context.Context, plans []*plan) error {
	wctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), writeTimeout)
	defer cancel()
	return pgx.BeginFunc(wctx, p.e.pool, func(tx pgx.Tx) error {
		ds := make([]store.Decision, len(plans))
		for i, pl := range plans {
			ds[i] = pl.d
		}
		outs, err := store.DecideMany(wctx, tx, ds)
		if err != nil {
			return err
		}
		// The breakers, in tool order (two writers never wait on each
		// other's breaker rows in opposite orders), before the alerts,
		// which depend on whether the breaker is open.
		counts := map[string]*verdictCount{}
		for i, pl := range plans {
			pl.out = outs[i]
			if pl.t.policy.Probe == nil {
				continue
			}
			vc := counts[pl.l.Tool]
			if vc == nil {
				vc = &verdictCount{tool: pl.l.Tool}
				counts[pl.l.Tool] = vc
			}
			vc.add(pl.conclusive, pl.d.Error)
		}
		changes := map[string]breakerChange{}
		for _, tool := range slices.Sorted(maps.Keys(counts)) {
			ch, err := p.e.countVerdicts(wctx, tx, *counts[tool])
			if err != nil {
				return err
			}
			changes[tool] = ch
		}
		reported := map[string]bool{}
		for _, pl := range plans {
			pl.br = changes[pl.l.Tool]
			pl.breakerReporter = !reported[pl.l.Tool]
			reported[pl.l.Tool] = true
			if err := pl.afterDecide(wctx, tx); err != nil {
				return err
			}
		}
		return nil
	})
}

// evidenceRefused reports whether the database refused a write because of
// the text it carried: a character it cannot store (22021, 22P05: invalid
// UTF-8, NUL, \u0000 in jsonb), a text that is not what its column holds
// (22P02), one too long (22001) or a value too large (54000). Other errors
// are retried as they are.
func evidenceRefused(err error) bool {
	pe, ok := errors.AsType[*pgconn.PgError](err)
	if !ok {
		return false
	}
	switch pe.Code {
	case "22021", "22P05", "22P02", "22001", "54000":
		return true
	}
	return false
}

func refusedCode(err error) string {
	if pe, ok := errors.AsType[*pgconn.PgError](err); ok {
		return "SQLSTATE " + pe.Code
	}
	return "unknown error"
}

// droppedEvidence is the note stored instead of evidence the database
// refused.
func droppedEvidence(err error) json.RawMessage {
	b, _ := json.Marshal(map[string]any{"evidence_dropped": true, "reason": "the database refused it (" + refusedCode(err) + ")"})
	return b
}
