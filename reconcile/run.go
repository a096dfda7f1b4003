package reconcile

import (
	"context"
	"encoding/json"
	"errors"
	"slices"
	"sort"
	"sync"
	"time"

	"github.com/ledgerkeeper/ledgerkeeper/internal/lease"
	"github.com/ledgerkeeper/ledgerkeeper/ledger"
	"github.com/ledgerkeeper/ledgerkeeper/probes"
	"github.com/ledgerkeeper/ledgerkeeper/store"
)

// pass is the state of one running pass.
type pass struct {
	e      *Engine
	opts   Options
	owner  string
	sem    chan struct{} // probes in flight, all tools together
	budget *budget
	// decisions carries probed keys to the writers: a probe slot is freed
	// as soon as the probe returns, so Concurrency bounds probes in flight,
	// not probes plus database writes.
	decisions chan probed
	// shards collects the shards of a Citus ledger this pass could not
	// read; listedTools says it listed the tools of every shard that
	// answered (no --key, no --tool).
	shards      *shardFaults
	listedTools bool

	mu     sync.Mutex
	report Report
	// givenBack holds the keys given back without a verdict (countGivenBack).
	givenBack map[string]struct{}
}

// budget counts down Options.Limit across tools.
type budget struct {
	mu   sync.Mutex
	left int // < 0: unbounded
}

func (b *budget) take(n int) int {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.left < 0 {
		return n
	}
	n = min(n, b.left)
	b.left -= n
	return n
}

func (b *budget) giveBack(n int) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.left >= 0 {
		b.left += n
	}
}

// Run runs one pass: every due key of every (selected) tool, batch after
// batch, until none is left, the limit is reached or ctx is done.
func (e *Engine) Run(ctx context.Context, opts Options) (Report, error) {
	start := time.Now()
	p := &pass{
		e:      e,
		opts:   opts,
		owner:  lease.Token(e.cfg.Actor),
		sem:    make(chan struct{}, e.cfg.Concurrency),
		budget: &budget{left: -1},
		report: Report{Actor: e.cfg.Actor, DryRun: opts.DryRun, StartedAt: start, Actions: map[string]int{}},
	}
	if opts.Limit > 0 {
		p.budget.left = opts.Limit
	}
	ctx, p.shards = withShardFaults(ctx)
	tools, err := p.tools(ctx)
	if err != nil {
		// The database is down (or the pass was cancelled before it
		// started): still a pass, counted and recorded like any other.
		return p.finish(ctx, err)
	}
	p.decisions = make(chan probed, e.cfg.Concurrency)
	var writers sync.WaitGroup
	for range WriterCount(e.cfg.Concurrency) {
		writers.Add(1)
		go func() {
			defer writers.Done()
			p.writeDecisions(ctx)
		}()
	}
	if !opts.DryRun {
		n, err := e.sweepAlerts(ctx)
		if err != nil {
			e.logger.Warn("resolve alerts of settled keys", "err", err)
		}
		p.report.ResolvedAlerts = n
	}
	var wg sync.WaitGroup
	errs := make([]error, len(tools))
	for i, tool := range tools {
		wg.Add(1)
		go func() {
			defer wg.Done()
			errs[i] = p.runTool(ctx, tool)
		}()
	}
	wg.Wait()
	close(p.decisions)
	writers.Wait()
	if len(opts.Keys) > 0 && !opts.DryRun {
		p.explainUntouched(ctx)
	}
	sort.Slice(p.report.Keys, func(i, j int) bool {
		a, b := p.report.Keys[i], p.report.Keys[j]
		return a.Tool < b.Tool || (a.Tool == b.Tool && a.Key < b.Key)
	})
	sort.Slice(p.report.Tools, func(i, j int) bool { return p.report.Tools[i].Tool < p.report.Tools[j].Tool })
	return p.finish(ctx, errors.Join(errs...))
}

// runStats is the stats column of a reconcile run in ledgerkeeper_runs;
// stopped comes first so that `status`, which cuts the column, shows it.
type runStats struct {
	Stopped      bool           `json:"stopped,omitempty"`
	Actions      map[string]int `json:"actions"`
	Keys         int            `json:"keys"`
	AlertsRaised int            `json:"alerts_raised"`
	// Withheld and GivenBack are the report's: keys probed whose verdict
	// was not applied, and keys leased and given back without one.
	Withheld  int `json:"withheld"`
	GivenBack int `json:"given_back"`
	// UnreachableShards: the Citus shards the pass could not read.
	UnreachableShards []store.ShardFault `json:"unreachable_shards,omitempty"`
}

// finish counts and records the pass. A stop (Options.Stop, or ctx
// cancelled rather than timed out) is not a failure: the run is recorded
// with stopped true and no error. The returned error still carries a
// cancelled ctx's error, so a caller that was interrupted knows.
func (p *pass) finish(ctx context.Context, err error) (Report, error) {
	e := p.e
	p.report.Duration = time.Since(p.report.StartedAt)
	p.report.Stopped = p.stopping() || errors.Is(ctx.Err(), context.Canceled)
	recErr := err
	if p.report.Stopped && errors.Is(err, context.Canceled) {
		recErr = nil // what the stop cut short, not a failure
	}
	if !p.report.Stopped && ctx.Err() != nil {
		recErr = errors.Join(recErr, ctx.Err()) // the job's timeout
	}
	if ctx.Err() != nil {
		err = errors.Join(err, ctx.Err())
	}
	if p.shards != nil {
		p.settleNodeAlerts(ctx, p.listedTools)
	}
	if e.metrics != nil {
		e.metrics.observePass(p.report, recErr)
	}
	if !p.opts.DryRun {
		stats, _ := json.Marshal(runStats{Stopped: p.report.Stopped, Actions: p.report.Actions, Keys: p.report.Decided, AlertsRaised: p.report.AlertsRaised,
			Withheld: p.report.Withheld, GivenBack: p.report.GivenBack, UnreachableShards: p.report.UnreachableShards})
		rec := store.Run{Kind: "reconcile", Actor: e.cfg.Actor, StartedAt: p.report.StartedAt, Stats: stats}
		if recErr != nil {
			rec.Error = recErr.Error()
		}
		rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), writeTimeout)
		if rerr := store.RecordRun(rctx, e.pool, rec); rerr != nil {
			e.logger.Warn("record reconcile run", "err", rerr)
		}
		cancel()
	}
	return p.report, err
}

// stopping reports whether the pass was asked to stop leasing and probing.
func (p *pass) stopping() bool {
	select {
	case <-p.opts.Stop:
		return true
	default:
		return false
	}
}

// tools decides which tools this pass visits. With Keys, it also reports
// the keys that cannot be reconciled now, and why.
func (p *pass) tools(ctx context.Context) ([]string, error) {
	if len(p.opts.Keys) > 0 {
		set := map[string]bool{}
		for _, k := range p.opts.Keys {
			row, err := ledger.Get(ctx, p.e.pool, k)
			if errors.Is(err, ledger.ErrNotFound) {
				p.report.Skipped = append(p.report.Skipped, KeyResult{Key: k, Action: "not_found_in_ledger"})
				continue
			}
			if err != nil {
				return nil, err
			}
			if len(p.opts.Tools) > 0 && !slices.Contains(p.opts.Tools, row.Tool) {
				p.report.Skipped = append(p.report.Skipped, KeyResult{Key: k, Tool: row.Tool, Action: "other_tool"})
				continue
			}
			set[row.Tool] = true
		}
		return sortedKeys(set), nil
	}
	if len(p.opts.Tools) > 0 {
		return slices.Sorted(slices.Values(p.opts.Tools)), nil
	}
	tools, err := store.ProcessingTools(ctx, p.e.pool)
	err = skipUnreachable(ctx, err)
	p.listedTools = err == nil
	return tools, err
}

func sortedKeys(m map[string]bool) []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	sort.Strings(out)
	return out
}

// probed is a key whose probe has answered, on its way to a writer.
type probed struct {
	t        *toolRun
	l        store.Leased
	res      probes.Result
	leasedAt time.Time // local monotonic time the lease started (at the latest)
	// answeredAt is when the probe's answer came back (local monotonic
	// time): the decision is judged at that moment, not when it is
	// written, which for a bracketed batch is after its closing check.
	answeredAt time.Time
}

// WriterCount sizes the pool of decision writers: a decision is a few
// milliseconds of database time against tens of a probe. Few writers make
// big groups: the per-transaction statements (BEGIN, the locking read, the
// breaker count, COMMIT and its WAL flush) are shared by more keys. At
// concurrency 32, two writers instead of eight cut PostgreSQL's CPU per
// key by a quarter (BENCHMARKS.md, "Reconcile with durable commits").
func WriterCount(concurrency int) int {
	return min(max(concurrency/16, 2), 16)
}

// toolRun is one tool's share of a pass.
type toolRun struct {
	p      *pass
	tool   string
	policy Policy
	sem    chan struct{}

	// trialDone is closed once the half-open breaker's trial probe has
	// answered: no other key of the tool is leased before.
	trialDone chan struct{}
	trialOnce sync.Once

	mu sync.Mutex
	// consecutive counts unknown verdicts since the last conclusive one,
	// starting from the breaker's stored count: it stops this pass's
	// probing as soon as a verdict would open the breaker, before the
	// decision that opens it (in the database) is written.
	consecutive int
	halfOpen    bool // the breaker opened before and has not closed
	open        bool
	probed      int
	note        string
	openUntil   *time.Time
	lastCheck   *CheckResult
	untrusted   bool

	// bracketed: the tool's verdicts wait for a closing self-check
	// (bracket.go); false when its probe's self-check is off.
	bracketed bool
	bk        batch
	handing   sync.WaitGroup // batches on their way to the writers
	// samples are the self-check's present-side samples, drawn by the
	// tool's first check of the pass (sampled) and reused by the others.
	samples []sample
	sampled bool

	pace pace // keys in flight and given back to a pause (ratelimit.go)
}

func (p *pass) runTool(ctx context.Context, tool string) error {
	policy := p.e.Policy(tool)
	t := &toolRun{p: p, tool: tool, policy: policy, sem: make(chan struct{}, policy.Concurrency),
		bracketed: policy.Probe != nil && !policy.SelfCheckDisabled}
	defer func() {
		t.mu.Lock()
		tr := ToolReport{Tool: tool, Probed: t.probed, BreakerOpen: t.open, OpenUntil: t.openUntil, Note: t.note,
			SelfCheck: t.lastCheck, Untrusted: t.untrusted}
		t.mu.Unlock()
		p.mu.Lock()
		p.report.Tools = append(p.report.Tools, tr)
		p.mu.Unlock()
	}()
	// Runs first: batches still on their way to the writers are handed
	// over before the report is taken and before Run closes the writers'
	// channel.
	defer t.handing.Wait()
	lp := store.LeaseParams{
		Tool:             tool,
		Window:           policy.ProcessingWindow + p.e.cfg.Grace,
		HeartbeatTimeout: policy.HeartbeatTimeout,
		Owner:            p.owner,
		Lease:            p.e.cfg.Lease,
		Keys:             slices.Clone(p.opts.Keys),
		IgnoreBackoff:    len(p.opts.Keys) > 0,
	}
	if policy.Probe != nil {
		if !t.awaitPause(ctx) { // no self-check or trial while paused
			return nil
		}
		on, err := t.admit(ctx, lp)
		if err != nil || !on {
			return err
		}
	}
	type leasedKey struct {
		l  store.Leased
		at time.Time
	}
	// Leased keys wait in a buffer of one round of probes: the next batch
	// is leased while this one is probed, and few keys wait under lease.
	queue := make(chan leasedKey, max(policy.Concurrency, p.e.cfg.BatchSize))
	var wg sync.WaitGroup
	for range policy.Concurrency {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for k := range queue {
				t.handle(ctx, k.l, k.at)
			}
		}()
	}
	var leaseErr, checkErr error
	var after store.Leased // a dry run pages without leasing
	// drained: the last lease found fewer due keys than it asked for, so
	// the next would find none (keys due since wait for the next pass).
	drained := false
	waitTrial := t.halfOpen
	for ctx.Err() == nil && !p.stopping() && !t.isOpen() {
		if t.bracketed && t.bk.due() {
			var goOn bool
			if goOn, checkErr = t.closeBatch(ctx); !goOn {
				break
			}
		}
		if !t.awaitPause(ctx) {
			break
		}
		if t.bracketed {
			var goOn bool
			if goOn, checkErr = t.freshOpener(ctx); !goOn {
				break
			}
		}
		if time.Since(p.report.StartedAt) >= p.e.cfg.MaxDuration {
			p.outOfTime()
			break
		}
		if lp.IgnoreBackoff && len(lp.Keys) == 0 {
			break // every named key was taken once this pass
		}
		batchSize := p.e.cfg.BatchSize
		if waitTrial {
			batchSize = 1 // half-open: one probe decides
		}
		want := p.budget.take(batchSize)
		if want == 0 {
			break
		}
		lp.Limit = want
		leasedAt := time.Now()
		var batch []store.Leased
		switch {
		case drained:
			// As if a lease had found nothing: no statement.
		case p.opts.DryRun:
			batch, leaseErr = store.PeekDue(ctx, p.e.pool, lp, after)
			leaseErr = skipUnreachable(ctx, leaseErr)
			if len(batch) > 0 {
				after = batch[len(batch)-1]
			}
		default:
			// Detached from ctx: a lease statement cancelled mid-flight may
			// still commit, and its keys would stay leased unseen. Let it
			// finish, then give the batch back if the pass is over or
			// stopping.
			lctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), writeTimeout)
			batch, drained, leaseErr = store.LeaseDueDrained(lctx, p.e.pool, lp)
			leaseErr = skipUnreachable(ctx, leaseErr)
			if leaseErr == nil && (ctx.Err() != nil || p.stopping()) && len(batch) > 0 {
				keys := make([]string, len(batch))
				for i, l := range batch {
					keys[i] = l.Key.Key
				}
				if err := store.ReleaseLeases(lctx, p.e.pool, keys, p.owner); err != nil {
					p.e.logger.Warn("release leases", "tool", tool, "err", err)
				}
				p.countGivenBack(keys...)
				batch = nil
			}
			cancel()
		}
		if leaseErr != nil || len(batch) == 0 {
			p.budget.giveBack(want)
			if leaseErr == nil && t.resumeAfterPause(ctx) {
				drained = false
				lp.ClaimedFrom = time.Time{} // keys a pause gave back are due again
				if t.bracketed {
					// The answers from before the pause are closed now, so
					// that the keys it gave back start a batch whose opener
					// (this closer, or a fresh one) is no older than the
					// pause.
					t.bk.closeNow = true
				}
				continue
			}
			break
		}
		if !p.opts.DryRun {
			// Leased oldest claim first: the next lease starts where this
			// one ended, not at the keys this pass still holds.
			lp.ClaimedFrom = batch[len(batch)-1].ClaimedAt
		}
		p.budget.giveBack(want - len(batch))
		if lp.IgnoreBackoff {
			// A named key is reconciled once per pass, whatever its
			// decision: back-off is ignored, so it would be due again.
			lp.Keys = slices.DeleteFunc(lp.Keys, func(k string) bool {
				return slices.ContainsFunc(batch, func(l store.Leased) bool { return l.Key.Key == k })
			})
		}
		t.pace.inFlight.Add(len(batch))
		if t.bracketed {
			t.bk.noteLeased(batch)
		}
		for _, l := range batch {
			queue <- leasedKey{l, leasedAt}
		}
		if waitTrial {
			select {
			case <-t.trialDone:
			case <-ctx.Done():
			case <-p.opts.Stop:
			}
			waitTrial = false
			t.bk.closeNow = true // the trial's verdict waits for no other key
		}
	}
	close(queue)
	wg.Wait()
	if t.bracketed && checkErr == nil {
		// The last batch's closer: also within a graceful stop, so that the
		// answers of the probes in flight are written.
		_, checkErr = t.closeBatch(ctx)
	}
	if leaseErr != nil && ctx.Err() == nil {
		return leaseErr
	}
	return checkErr
}

func (t *toolRun) isOpen() bool {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.open
}

// recordVerdict updates this pass's count of the tool's consecutive
// unknown verdicts and stops probing the tool when the next decision
// written will open its breaker (one unknown when half-open).
func (t *toolRun) recordVerdict(conclusive bool) {
	t.mu.Lock()
	defer t.mu.Unlock()
	c, opens := breakerCount{consecutive: t.consecutive, halfOpen: t.halfOpen}.after(conclusive, t.p.e.cfg.Breaker.Failures)
	t.consecutive, t.halfOpen = c.consecutive, c.halfOpen
	if opens {
		t.open = true
	}
}

// outOfTime notes that the pass reached its time budget.
func (p *pass) outOfTime() {
	p.mu.Lock()
	defer p.mu.Unlock()
	if !p.report.OutOfTime {
		p.report.OutOfTime = true
		p.e.logger.Warn("reconcile pass reached its time budget: the keys left are due for the next pass", "max_duration", p.e.cfg.MaxDuration)
	}
}
