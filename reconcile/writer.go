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
		resolve: pl.Resolve, leasedAt: pr.leasedAt}
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
	// refused it (see commit).
	dropped bool
	// leasedAt: when the key was leased, on this process's clock: with
	// the lease's length, how long its decision may still be written.
	leasedAt time.Time
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
// leave a key undecided, uncounted and unalerted. A failover under a write
// is commitFollowing's.
func (p *pass) commit(ctx context.Context, plans []*plan) {
	if len(plans) == 0 {
		return
	}
	err := p.commitFollowing(ctx, plans)
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
		err = p.commitFollowing(ctx, plans)
	}
	for _, pl := range plans {
		pl.finish(err)
	}
}

// commitFollowing is commitPlans through a failover of the ledger's
// database. A write that failed because its connection no longer reaches
// a writable primary (ledger.FailoverReason: the node went down, was
// demoted, turned read-only) is written again on a fresh connection (the
// pool, following the primary, hands out no connection to the old node)
// for as long as every plan's lease holds, so that a decision made is
// recorded instead of its key being probed again after the lease lapses.
// A COMMIT that was sent but not answered has an unknown outcome: before
// anything else its audit rows are read back (store.AuditedAt, by the
// transaction's own now()); present, the decisions committed and are
// reported as written, never written twice (one audit row, one outbox
// entry); absent, nothing committed and the write is tried again.
func (p *pass) commitFollowing(ctx context.Context, plans []*plan) error {
	deadline := writeDeadline(plans)
	for n := 0; ; n++ {
		at, atCommit, err := p.commitPlans(ctx, plans)
		if err == nil {
			return nil
		}
		reason, failover := ledger.FailoverReason(err)
		if !failover {
			return err
		}
		if atCommit {
			committed, rerr := p.confirmCommit(ctx, plans, at, deadline)
			if rerr != nil {
				return fmt.Errorf("%w (the commit's outcome is unknown: %w)", err, rerr)
			}
			if committed {
				p.e.logger.Warn("decisions committed under a broken connection: confirmed by their audit rows",
					"decisions", len(plans), "reason", reason)
				return nil
			}
		}
		p.e.logger.Debug("decisions not written: the database is failing over; trying again", "decisions", len(plans), "reason", reason)
		if !store.FailoverBackoff(ctx, n, deadline) {
			return fmt.Errorf("%w (the database did not take writes again while the leases held)", err)
		}
	}
}

// writeDeadline is when the first of the plans' leases lapses, less the
// lease margin: a write after it could land after another replica leased
// the key.
func writeDeadline(plans []*plan) time.Time {
	var d time.Time
	for _, pl := range plans {
		until := pl.leasedAt.Add(pl.l.LeaseExpiresAt.Sub(pl.l.Now) - leaseMargin)
		if d.IsZero() || until.Before(d) {
			d = until
		}
	}
	return d
}

// confirmCommit reads back, on another connection, whether the
// transaction that started at at committed: its audit rows (read through
// the failover, until deadline). committed: the plans' outcomes are set
// from the audit rows read.
func (p *pass) confirmCommit(ctx context.Context, plans []*plan, at, deadline time.Time) (committed bool, err error) {
	keys := make([]string, len(plans))
	for i, pl := range plans {
		keys[i] = pl.l.Key.Key
	}
	actions, err := store.AwaitAuditedAt(ctx, p.e.pool, keys, at, deadline)
	if err != nil || len(actions) == 0 {
		return false, err
	}
	for _, pl := range plans {
		a := actions[pl.l.Key.Key]
		pl.out = store.DecideResult{Action: a, Applied: a == pl.d.Action, Attempts: pl.l.Attempts}
		pl.raised = nil
	}
	return true, nil
}

// commitPlans writes plans in one transaction. at is the transaction's
// now() (its audit rows' created_at); atCommit: the error came from a
// COMMIT that may have reached the server (its outcome is unknown).
func (p *pass) commitPlans(ctx context.Context, plans []*plan) (at time.Time, atCommit bool, err error) {
	wctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), writeTimeout)
	defer cancel()
	return store.TxAt(wctx, p.e.pool, p.e.commitTx, func(tx pgx.Tx) error { return p.writePlans(wctx, tx, plans) })
}

// writePlans is the body of a group's transaction: the decisions, the
// tools' breakers, the alerts.
func (p *pass) writePlans(wctx context.Context, tx pgx.Tx, plans []*plan) error {
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
