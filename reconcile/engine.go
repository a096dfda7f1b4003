package reconcile

import (
	"cmp"
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"math"
	mrand "math/rand/v2"
	"slices"
	"sort"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/ledgerkeeper/ledgerkeeper/alerts"
	"github.com/ledgerkeeper/ledgerkeeper/internal/safetext"
	"github.com/ledgerkeeper/ledgerkeeper/internal/secret"
	"github.com/ledgerkeeper/ledgerkeeper/ledger"
	"github.com/ledgerkeeper/ledgerkeeper/probes"
)

// Defaults for Config's zero values.
const (
	DefaultGrace              = 10 * time.Second
	DefaultBatchSize          = 100
	DefaultConcurrency        = 16
	DefaultLease              = 2 * time.Minute
	DefaultAlertAfterAttempts = 3
	DefaultAlertAfterAge      = time.Hour
	DefaultBackoffBase        = 30 * time.Second
	DefaultBackoffMax         = 30 * time.Minute
	DefaultBreakerFailures    = 5
	DefaultBreakerCooldown    = time.Minute
	DefaultBreakerMaxCooldown = 30 * time.Minute
	DefaultRenotifyAfter      = 4 * time.Hour
	DefaultProcessingWindow   = 30 * time.Second
	DefaultSelfCheckInterval  = 10 * time.Minute
	DefaultSelfCheckSamples   = 3
	DefaultSelfCheckMaxAge    = 6 * time.Hour
	// writeTimeout bounds one decision's transaction.
	writeTimeout = 10 * time.Second
)

// Policy is one tool's reconcile policy.
type Policy struct {
	// ProcessingWindow: keys claimed less than window + grace ago are in
	// flight. Default 30s.
	ProcessingWindow time.Duration
	// HeartbeatTimeout: keys with a heartbeat younger than this are in
	// flight. Default ProcessingWindow.
	HeartbeatTimeout time.Duration
	// DownstreamDedupWindow: past it (measured from created_at, the key's
	// first use: the conservative end when a retry re-claimed it), not_found
	// escalates instead of marking the key failed_retryable. 0 = none.
	DownstreamDedupWindow time.Duration
	// Concurrency bounds this tool's probes in flight. Default: the
	// engine's Concurrency.
	Concurrency int
	// Probe answers for this tool's keys; nil = no probe (alerted, never
	// guessed).
	Probe probes.Probe
	// ProbeTimeout is the probe's own deadline (0: unknown). A leased key
	// is probed only while its lease has this much left, plus a margin.
	ProbeTimeout time.Duration
	// ProbeFingerprint identifies the probe's configuration: a stored
	// self-check vouches only for the configuration it checked, so a
	// changed probe is checked again at once.
	ProbeFingerprint string
	// SelfCheckDisabled turns the self-check off for this tool: its
	// verdicts are acted on unchecked. Dangerous: a probe broken on day one
	// marks keys retryable whose effect happened.
	SelfCheckDisabled bool
}

// Config configures an Engine. Zero values take the defaults above.
type Config struct {
	// Actor names this replica in audit rows and lease owners (e.g.
	// hostname:pid, or "operator:alice" for a manual run). Required.
	Actor string
	// Tools maps tool names to policies; a tool absent from it gets
	// Default.
	Tools map[string]Policy
	// Default is the policy of tools absent from Tools (its Probe is
	// ignored: such keys have no probe).
	Default Policy
	// Grace is added to each processing window. Default 10s.
	Grace time.Duration
	// BatchSize is the number of keys leased per query. Default 100.
	BatchSize int
	// Concurrency bounds probes in flight across all tools. Default 16.
	Concurrency int
	// Lease is how long a key is reserved for one probe. Default 2m. It
	// must exceed the slowest probe's timeout.
	Lease time.Duration
	// AlertAfterAttempts and AlertAfterAge raise probe_failing / no_probe
	// alerts. Defaults 3 and 1h.
	AlertAfterAttempts int
	AlertAfterAge      time.Duration
	// ConfirmNotFoundAfter > 0 requires a second not_found that much later.
	ConfirmNotFoundAfter time.Duration
	// BackoffBase and BackoffMax shape the next probe time after an
	// inconclusive attempt: base * 2^(attempts-1), capped, ±10% jitter.
	BackoffBase time.Duration
	BackoffMax  time.Duration
	// BreakerFailures, BreakerCooldown, BreakerMaxCooldown: see the package
	// documentation.
	BreakerFailures    int
	BreakerCooldown    time.Duration
	BreakerMaxCooldown time.Duration
	// RenotifyAfter: see alerts.Raise. Default 4h.
	RenotifyAfter time.Duration
	// SelfCheckInterval is how long a passing self-check vouches for a
	// tool's probe (shared across replicas). Default 10m. A failing one is
	// repeated every pass.
	SelfCheckInterval time.Duration
	// SelfCheckSamples is how many keys completed by their tool server are
	// probed per self-check. Default 3.
	SelfCheckSamples int
	// SelfCheckMaxAge bounds the age of those keys. Default 6h.
	SelfCheckMaxAge time.Duration
	// Redactor removes registered secrets from probe errors and evidence
	// before they reach the audit trail, logs and alerts. Nil redacts
	// nothing.
	Redactor *secret.Redactor
}

func (c *Config) applyDefaults() {
	c.Grace = cmp.Or(c.Grace, DefaultGrace)
	c.BatchSize = cmp.Or(c.BatchSize, DefaultBatchSize)
	c.Concurrency = cmp.Or(c.Concurrency, DefaultConcurrency)
	c.Lease = cmp.Or(c.Lease, DefaultLease)
	c.AlertAfterAttempts = cmp.Or(c.AlertAfterAttempts, DefaultAlertAfterAttempts)
	c.AlertAfterAge = cmp.Or(c.AlertAfterAge, DefaultAlertAfterAge)
	c.BackoffBase = cmp.Or(c.BackoffBase, DefaultBackoffBase)
	c.BackoffMax = cmp.Or(c.BackoffMax, DefaultBackoffMax)
	c.BreakerFailures = cmp.Or(c.BreakerFailures, DefaultBreakerFailures)
	c.BreakerCooldown = cmp.Or(c.BreakerCooldown, DefaultBreakerCooldown)
	c.BreakerMaxCooldown = cmp.Or(c.BreakerMaxCooldown, DefaultBreakerMaxCooldown)
	c.RenotifyAfter = cmp.Or(c.RenotifyAfter, DefaultRenotifyAfter)
	c.SelfCheckInterval = cmp.Or(c.SelfCheckInterval, DefaultSelfCheckInterval)
	c.SelfCheckSamples = cmp.Or(c.SelfCheckSamples, DefaultSelfCheckSamples)
	c.SelfCheckMaxAge = cmp.Or(c.SelfCheckMaxAge, DefaultSelfCheckMaxAge)
	c.Default.ProcessingWindow = cmp.Or(c.Default.ProcessingWindow, DefaultProcessingWindow)
	c.Default.Probe = nil
	fill := func(p Policy) Policy {
		p.ProcessingWindow = cmp.Or(p.ProcessingWindow, c.Default.ProcessingWindow)
		p.HeartbeatTimeout = cmp.Or(p.HeartbeatTimeout, p.ProcessingWindow)
		p.Concurrency = min(cmp.Or(p.Concurrency, c.Concurrency), c.Concurrency)
		return p
	}
	c.Default = fill(c.Default)
	tools := make(map[string]Policy, len(c.Tools))
	for name, p := range c.Tools {
		tools[name] = fill(p)
	}
	c.Tools = tools
}

// Engine runs reconcile passes. It is safe for concurrent use; passes may
// also run concurrently in other processes.
type Engine struct {
	cfg     Config
	pool    *pgxpool.Pool
	logger  *slog.Logger
	metrics *Metrics

	sweepMu     sync.Mutex
	sweepCursor alerts.OpenAlert // where the next alert sweep resumes
}

// New returns an engine. metrics may be nil.
func New(cfg Config, pool *pgxpool.Pool, logger *slog.Logger, metrics *Metrics) *Engine {
	if cfg.Actor == "" || pool == nil {
		panic("reconcile: New needs an Actor and a pool")
	}
	if logger == nil {
		logger = slog.New(slog.DiscardHandler)
	}
	cfg.applyDefaults()
	for _, tool := range slices.Sorted(maps.Keys(cfg.Tools)) {
		if pol := cfg.Tools[tool]; pol.Probe != nil && pol.SelfCheckDisabled {
			logger.Warn("probe self-check disabled: this tool's verdicts change keys unchecked", "tool", tool)
		}
	}
	if metrics != nil {
		for tool := range cfg.Tools {
			metrics.initTool(tool)
		}
	}
	return &Engine{cfg: cfg, pool: pool, logger: logger, metrics: metrics}
}

// Policy returns the effective policy of a tool.
func (e *Engine) Policy(tool string) Policy {
	if p, ok := e.cfg.Tools[tool]; ok {
		return p
	}
	return e.cfg.Default
}

// Windows returns a tool's window + grace and heartbeat timeout (for
// ledger.Stats).
func (e *Engine) Windows(tool string) (time.Duration, time.Duration) {
	p := e.Policy(tool)
	return p.ProcessingWindow + e.cfg.Grace, p.HeartbeatTimeout
}

// Options narrow one pass.
type Options struct {
	// Tools restricts the pass to these tools.
	Tools []string
	// Keys restricts the pass to these keys and ignores their back-off
	// (never their processing window).
	Keys []string
	// DryRun probes and reports; it writes nothing and leases nothing.
	DryRun bool
	// Limit bounds the keys probed in this pass (0 = no bound).
	Limit int
}

// KeyResult is one key's line in a pass report.
type KeyResult struct {
	Key       string          `json:"key"`
	Tool      string          `json:"tool"`
	Verdict   string          `json:"verdict,omitempty"`
	Action    string          `json:"action"`
	Attempts  int             `json:"attempts"`
	Error     string          `json:"error,omitempty"`
	Evidence  json.RawMessage `json:"evidence,omitempty"`
	Alerts    []string        `json:"alerts,omitempty"`
	AgeSecond float64         `json:"age_seconds"`
}

// ToolReport summarises one tool in a pass.
type ToolReport struct {
	Tool        string     `json:"tool"`
	Probed      int        `json:"probed"`
	BreakerOpen bool       `json:"breaker_open,omitempty"`
	OpenUntil   *time.Time `json:"breaker_open_until,omitempty"`
	Note        string     `json:"note,omitempty"`
	// SelfCheck is the check that vouched for (or against) the tool's
	// probe in this pass; nil when none applied (no probe, disabled, or
	// the breaker kept the tool from being probed).
	SelfCheck *CheckResult `json:"self_check,omitempty"`
	// Untrusted: the probe failed its self-check (or it was
	// inconclusive), so no key of the tool changed state.
	Untrusted bool `json:"untrusted,omitempty"`
}

// Report is the outcome of one pass.
type Report struct {
	Actor     string         `json:"actor"`
	DryRun    bool           `json:"dry_run"`
	StartedAt time.Time      `json:"started_at"`
	Duration  time.Duration  `json:"duration_ns"`
	Actions   map[string]int `json:"actions"`
	Tools     []ToolReport   `json:"tools"`
	Keys      []KeyResult    `json:"keys"`
	// Skipped lists --key arguments that were not reconciled, and why.
	Skipped []KeyResult `json:"skipped,omitempty"`
	// AlertsRaised counts alerts written to the outbox.
	AlertsRaised int `json:"alerts_raised"`
	// ResolvedAlerts counts alerts resolved because their key settled.
	ResolvedAlerts int `json:"resolved_alerts"`
}

// Action names recorded in the audit trail and reports.
const (
	ActionCompleted            = "completed"
	ActionMarkedRetryable      = "marked_retryable"
	ActionAwaitingConfirmation = "awaiting_confirmation"
	ActionEscalatedDedup       = "escalated_dedup_window"
	ActionDuplicate            = "duplicate_alerted"
	ActionBackoff              = "backoff"
	ActionNoProbe              = "no_probe"
	ActionResolvedByOriginal   = ledger.ActionResolvedByOriginal
	ActionHeld                 = ledger.ActionHeld
	ActionLeaseLost            = ledger.ActionLeaseLost
	ActionInFlightAgain        = ledger.ActionInFlightAgain
	// Dry-run actions say what would happen.
	ActionWouldComplete = "would_complete"
	ActionWouldRetry    = "would_mark_retryable"
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

	mu     sync.Mutex
	report Report
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
		owner:  e.cfg.Actor + "/" + nonce(),
		sem:    make(chan struct{}, e.cfg.Concurrency),
		budget: &budget{left: -1},
		report: Report{Actor: e.cfg.Actor, DryRun: opts.DryRun, StartedAt: start, Actions: map[string]int{}},
	}
	if opts.Limit > 0 {
		p.budget.left = opts.Limit
	}
	tools, err := p.tools(ctx)
	if err != nil {
		return p.report, err
	}
	p.decisions = make(chan probed, e.cfg.Concurrency)
	var writers sync.WaitGroup
	for range writerCount(e.cfg.Concurrency) {
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
	p.report.Duration = time.Since(start)
	sort.Slice(p.report.Keys, func(i, j int) bool {
		a, b := p.report.Keys[i], p.report.Keys[j]
		return a.Tool < b.Tool || (a.Tool == b.Tool && a.Key < b.Key)
	})
	sort.Slice(p.report.Tools, func(i, j int) bool { return p.report.Tools[i].Tool < p.report.Tools[j].Tool })
	err = errors.Join(errs...)
	if ctx.Err() != nil {
		err = errors.Join(err, ctx.Err())
	}
	if e.metrics != nil {
		e.metrics.observePass(p.report, err)
	}
	if !opts.DryRun {
		stats, _ := json.Marshal(map[string]any{"actions": p.report.Actions, "keys": len(p.report.Keys), "alerts_raised": p.report.AlertsRaised})
		rec := ledger.Run{Kind: "reconcile", Actor: e.cfg.Actor, StartedAt: start, Stats: stats}
		if err != nil {
			rec.Error = err.Error()
		}
		rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), writeTimeout)
		if rerr := ledger.RecordRun(rctx, e.pool, rec); rerr != nil {
			e.logger.Warn("record reconcile run", "err", rerr)
		}
		cancel()
	}
	return p.report, err
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
	return ledger.ProcessingTools(ctx, p.e.pool, 0)
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
	l        ledger.Leased
	res      probes.Result
	leasedAt time.Time // local monotonic time the lease started (at the latest)
}

// writerCount sizes the pool of decision writers: a decision is a few
// milliseconds of database time against tens of a probe.
func writerCount(concurrency int) int {
	return min(max(concurrency/4, 2), 16)
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
	check       *CheckResult
	untrusted   bool
}

func (p *pass) runTool(ctx context.Context, tool string) error {
	policy := p.e.Policy(tool)
	t := &toolRun{p: p, tool: tool, policy: policy, sem: make(chan struct{}, policy.Concurrency)}
	defer func() {
		t.mu.Lock()
		tr := ToolReport{Tool: tool, Probed: t.probed, BreakerOpen: t.open, OpenUntil: t.openUntil, Note: t.note,
			SelfCheck: t.check, Untrusted: t.untrusted}
		t.mu.Unlock()
		p.mu.Lock()
		p.report.Tools = append(p.report.Tools, tr)
		p.mu.Unlock()
	}()
	lp := ledger.LeaseParams{
		Tool:             tool,
		Window:           policy.ProcessingWindow + p.e.cfg.Grace,
		HeartbeatTimeout: policy.HeartbeatTimeout,
		Owner:            p.owner,
		Lease:            p.e.cfg.Lease,
		Keys:             slices.Clone(p.opts.Keys),
		IgnoreBackoff:    len(p.opts.Keys) > 0,
	}
	if policy.Probe != nil {
		on, err := t.admit(ctx, lp)
		if err != nil || !on {
			return err
		}
	}
	type leasedKey struct {
		l  ledger.Leased
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
	var leaseErr error
	var after ledger.Leased // a dry run pages without leasing
	waitTrial := t.halfOpen
	for ctx.Err() == nil && !t.isOpen() {
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
		var batch []ledger.Leased
		if p.opts.DryRun {
			batch, leaseErr = ledger.PeekDue(ctx, p.e.pool, lp, after)
			if len(batch) > 0 {
				after = batch[len(batch)-1]
			}
		} else {
			// Detached from ctx: a lease statement cancelled mid-flight may
			// still commit, and its keys would stay leased unseen. Let it
			// finish, then give the batch back if the pass is over.
			lctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), writeTimeout)
			batch, leaseErr = ledger.LeaseDue(lctx, p.e.pool, lp)
			if leaseErr == nil && ctx.Err() != nil && len(batch) > 0 {
				keys := make([]string, len(batch))
				for i, l := range batch {
					keys[i] = l.Key.Key
				}
				if err := ledger.ReleaseLeases(lctx, p.e.pool, keys, p.owner); err != nil {
					p.e.logger.Warn("release leases", "tool", tool, "err", err)
				}
				batch = nil
			}
			cancel()
		}
		if leaseErr != nil || len(batch) == 0 {
			p.budget.giveBack(want)
			break
		}
		p.budget.giveBack(want - len(batch))
		if lp.IgnoreBackoff {
			// A named key is reconciled once per pass, whatever its
			// decision: back-off is ignored, so it would be due again.
			lp.Keys = slices.DeleteFunc(lp.Keys, func(k string) bool {
				return slices.ContainsFunc(batch, func(l ledger.Leased) bool { return l.Key.Key == k })
			})
		}
		for _, l := range batch {
			queue <- leasedKey{l, leasedAt}
		}
		if waitTrial {
			select {
			case <-t.trialDone:
			case <-ctx.Done():
			}
			waitTrial = false
		}
	}
	close(queue)
	wg.Wait()
	if leaseErr != nil && ctx.Err() == nil {
		return leaseErr
	}
	return nil
}

func (t *toolRun) isOpen() bool {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.open
}

// leaseMargin is the least lease left for a probe to start: the probe's
// timeout plus this, so the decision is written before the lease lapses
// and another replica may take the key.
const leaseMargin = 2 * time.Second

// handle probes one leased key and hands the answer to a writer.
func (t *toolRun) handle(ctx context.Context, l ledger.Leased, leasedAt time.Time) {
	p := t.p
	if t.trialDone != nil {
		defer t.trialOnce.Do(func() { close(t.trialDone) })
	}
	release := func() {
		if p.opts.DryRun {
			return
		}
		rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), writeTimeout)
		defer cancel()
		if err := ledger.ReleaseLease(rctx, p.e.pool, l.Key.Key, p.owner); err != nil {
			p.e.logger.Warn("release lease", "key", l.Key.Key, "err", err)
		}
	}
	if ctx.Err() != nil || t.isOpen() {
		release()
		return
	}
	// Per-tool, then global concurrency; held for the probe only.
	select {
	case t.sem <- struct{}{}:
	case <-ctx.Done():
		release()
		return
	}
	select {
	case p.sem <- struct{}{}:
	case <-ctx.Done():
		<-t.sem
		release()
		return
	}
	free := func() { <-p.sem; <-t.sem }
	if t.isOpen() {
		free()
		release()
		return
	}
	// Waited too long for a slot: the lease could lapse mid-probe and
	// another replica probe the key too. Give it back; it is due again.
	if !p.opts.DryRun && time.Until(leasedAt.Add(p.e.cfg.Lease)) < t.policy.ProbeTimeout+leaseMargin {
		free()
		release()
		p.e.logger.Debug("lease too short to probe; key given back", "key", l.Key.Key, "tool", t.tool)
		return
	}

	var res probes.Result
	started := time.Now()
	if t.policy.Probe == nil {
		// Not a probe failure: no probe ran, so no probe metric moves
		// and the breaker does not count it.
		res = probes.Result{Verdict: probes.Unknown, Err: errNoProbe}
	} else {
		res = callProbe(ctx, t.policy.Probe, probes.Key{
			Key: l.Key.Key, Tool: l.Tool, RequestBody: l.RequestBody, CreatedAt: l.CreatedAt, ClaimedAt: l.ClaimedAt,
		})
		if p.e.metrics != nil {
			p.e.metrics.observeProbe(t.tool, string(res.Verdict), time.Since(started))
		}
	}
	free()
	if ctx.Err() != nil {
		// Cancelled mid-probe: whatever the probe said may be an artefact
		// of the cancellation. Give the key back; a crash is not an attempt.
		release()
		return
	}
	t.mu.Lock()
	t.probed++
	t.mu.Unlock()
	// Counted as verdicts come, before the write, so that no probe starts
	// after the one that will open the breaker; the database's count, in
	// the decision's transaction, is what opens it.
	if t.policy.Probe != nil {
		t.recordVerdict(res.Verdict != probes.Unknown)
	}
	p.decisions <- probed{t: t, l: l, res: res, leasedAt: leasedAt}
}

// callProbe runs a probe and enforces the verdict contract, whatever the
// probe does: a panic or garbage is unknown.
func callProbe(ctx context.Context, pr probes.Probe, k probes.Key) (res probes.Result) {
	defer func() {
		if r := recover(); r != nil {
			res = probes.Result{Verdict: probes.Unknown, Err: fmt.Errorf("probe panicked: %v", r)}
		}
	}()
	return sanitize(pr.Probe(ctx, k))
}

var errNoProbe = errors.New("no probe configured for this tool")

// sanitize enforces the verdict contract whatever a probe returns.
func sanitize(r probes.Result) probes.Result {
	switch r.Verdict {
	case probes.Found:
		if r.Outcome == nil || r.Outcome.Code < 100 || r.Outcome.Code > 599 || (r.Outcome.Body != nil && !json.Valid(r.Outcome.Body)) {
			return probes.Result{Verdict: probes.Unknown, Evidence: r.Evidence, Err: errors.New("probe said found without a valid outcome")}
		}
	case probes.NotFound, probes.Duplicate:
	case probes.Unknown:
		if r.Err == nil {
			r.Err = errors.New("probe returned unknown without an error")
		}
	default:
		return probes.Result{Verdict: probes.Unknown, Evidence: r.Evidence, Err: fmt.Errorf("probe returned an invalid verdict %q", r.Verdict)}
	}
	if r.Evidence != nil && !json.Valid(r.Evidence) {
		r.Evidence = nil
	}
	return r
}

// decide turns a verdict into a plan for the writers; a dry run reports it
// instead (nil plan).
func (t *toolRun) decide(_ context.Context, pr probed) *plan {
	p, cfg := t.p, t.p.e.cfg
	l, res, leasedAt := pr.l, pr.res, pr.leasedAt
	// The database's clock at lease time plus the time since (a monotonic
	// local duration): no replica's wall clock enters a decision.
	now := l.Now.Add(time.Since(leasedAt))
	age := now.Sub(l.ClaimedAt)
	d := ledger.Decision{
		Key: l.Key.Key, Tool: l.Tool, ClaimedAt: l.ClaimedAt, Owner: p.owner, Actor: cfg.Actor,
		Verdict: string(res.Verdict), Evidence: res.Evidence, CountAttempt: true,
		CheckHeartbeat: true, LeasedHeartbeatAt: l.HeartbeatAt,
	}
	d.Evidence = cfg.Redactor.JSON(d.Evidence)
	if res.Err != nil {
		d.Error = safetext.Clip(cfg.Redactor.String(res.Err.Error()), maxErrorBytes)
	}
	attemptsAfter := l.Attempts + 1
	var raise []alerts.Alert
	details := alerts.Details{Attempts: attemptsAfter, ClaimedAt: &l.ClaimedAt, CreatedAt: &l.CreatedAt, Verdict: string(res.Verdict), LastError: d.Error}
	resolveHow := ""
	conclusive := true

	switch {
	case t.policy.Probe == nil:
		conclusive = false
		d.Verdict = "no_probe"
		d.Action = ActionNoProbe
		d.NextProbeIn = t.backoff(attemptsAfter)
		if attemptsAfter >= cfg.AlertAfterAttempts || age >= cfg.AlertAfterAge {
			raise = append(raise, alerts.Alert{Reason: alerts.ReasonNoProbe, Tool: l.Tool, Key: l.Key.Key, Details: details})
		}
	case res.Verdict == probes.Found:
		d.Transition = ledger.StatusCompleted
		d.ResponseCode = res.Outcome.Code
		d.ResponseBody = res.Outcome.Body
		if d.ResponseBody == nil {
			d.ResponseBody = json.RawMessage("null")
		}
		d.Action = ActionCompleted
		resolveHow = "completed by the reconciler (effect found downstream)"
	case res.Verdict == probes.NotFound:
		// The downstream's horizon starts with the key's first use: the
		// conservative end when a retry re-claimed it since.
		keyAge := now.Sub(l.CreatedAt)
		switch {
		case t.policy.DownstreamDedupWindow > 0 && keyAge > t.policy.DownstreamDedupWindow:
			// A wrong not_found could no longer be caught downstream.
			d.Action = ActionEscalatedDedup
			d.NextProbeIn = t.backoff(attemptsAfter)
			details.Note = fmt.Sprintf("key is %s old, past the downstream's dedup window of %s", keyAge.Round(time.Second), t.policy.DownstreamDedupWindow)
			raise = append(raise, alerts.Alert{Reason: alerts.ReasonDedupWindowPassed, Tool: l.Tool, Key: l.Key.Key, Details: details})
		case cfg.ConfirmNotFoundAfter > 0 && (l.FirstNotFoundAt == nil || now.Sub(*l.FirstNotFoundAt) < cfg.ConfirmNotFoundAfter):
			d.Action = ActionAwaitingConfirmation
			d.NotFoundSeen = true
			wait := cfg.ConfirmNotFoundAfter
			if l.FirstNotFoundAt != nil {
				wait -= now.Sub(*l.FirstNotFoundAt)
			}
			d.NextProbeIn = max(wait, time.Second)
		default:
			d.Transition = ledger.StatusFailedRetryable
			d.Action = ActionMarkedRetryable
			resolveHow = "marked failed_retryable by the reconciler (effect not found downstream)"
		}
	case res.Verdict == probes.Duplicate:
		d.Action = ActionDuplicate
		d.NextProbeIn = t.backoff(attemptsAfter)
		raise = append(raise, alerts.Alert{Reason: alerts.ReasonDuplicate, Tool: l.Tool, Key: l.Key.Key, Details: details})
	default: // unknown
		conclusive = false
		d.Action = ActionBackoff
		d.NextProbeIn = t.backoff(attemptsAfter)
	}

	// Raised unless the breaker is open when the decision is written (see
	// afterDecide): the tool-wide alert covers it.
	if res.Verdict == probes.Unknown && t.policy.Probe != nil &&
		(attemptsAfter >= cfg.AlertAfterAttempts || age >= cfg.AlertAfterAge) {
		raise = append(raise, alerts.Alert{Reason: alerts.ReasonProbeFailing, Tool: l.Tool, Key: l.Key.Key, Details: details})
	}

	if p.opts.DryRun {
		switch d.Transition {
		case ledger.StatusCompleted:
			d.Action = ActionWouldComplete
		case ledger.StatusFailedRetryable:
			d.Action = ActionWouldRetry
		}
		var names []string
		for _, a := range raise {
			names = append(names, string(a.Reason))
		}
		p.add(KeyResult{Key: l.Key.Key, Tool: l.Tool, Verdict: d.Verdict, Action: d.Action, Attempts: l.Attempts,
			Error: d.Error, Evidence: d.Evidence, Alerts: names, AgeSecond: age.Seconds()})
		return nil
	}

	return &plan{t: t, l: l, d: d, raise: raise, resolveHow: resolveHow, conclusive: conclusive, age: age,
		resolve: l.Attempts > 0 || !l.ExpiresAt.After(now)}
}

// plan is a decision ready to be written.
type plan struct {
	t          *toolRun
	l          ledger.Leased
	d          ledger.Decision
	raise      []alerts.Alert
	resolveHow string
	conclusive bool
	age        time.Duration
	// resolve: the key may have open alerts (it was decided before, or it
	// expired and purge alerted it). Otherwise resolving is skipped; the
	// sweep at the start of every pass catches anything it would miss.
	resolve bool

	out    ledger.DecideResult
	raised []string
	br     breakerChange // the tool's breaker after this plan's transaction
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
	if pl.br.opened {
		pl.raised = append(pl.raised, string(alerts.ReasonDownstreamUnreachable))
	}
	var err error
	switch {
	case pl.out.Action == ledger.ActionResolvedByOriginal:
		// Only a key that is settled (not re-claimed) ends its alerts.
		if pl.out.Current.Key == "" || pl.out.Current.Status != ledger.StatusProcessing {
			_, err = alerts.ResolveKey(ctx, tx, l.Tool, l.Key.Key, "resolved by the original attempt")
		}
		return err
	case !pl.out.Applied:
		return nil
	}
	if pl.resolveHow != "" && pl.resolve {
		if _, err := alerts.ResolveKey(ctx, tx, l.Tool, l.Key.Key, pl.resolveHow); err != nil {
			return err
		}
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
	t.breakerChanged(pl.br)
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

// maxGroup bounds the decisions one writer commits together.
const maxGroup = 16

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
		ds := make([]ledger.Decision, len(plans))
		for i, pl := range plans {
			ds[i] = pl.d
		}
		outs, err := ledger.DecideMany(wctx, tx, ds)
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
			if pl.conclusive {
				vc.conclusive = true
			} else {
				vc.unknowns++
				vc.lastErr = pl.d.Error
			}
		}
		changes := map[string]breakerChange{}
		for _, tool := range slices.Sorted(maps.Keys(counts)) {
			ch, err := p.e.countVerdicts(wctx, tx, *counts[tool])
			if err != nil {
				return err
			}
			changes[tool] = ch
		}
		for _, pl := range plans {
			pl.br = changes[pl.l.Tool]
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

func (p *pass) add(r KeyResult) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.report.Keys = append(p.report.Keys, r)
	p.report.Actions[r.Action]++
	p.report.AlertsRaised += len(r.Alerts)
	if p.e.metrics != nil {
		p.e.metrics.observeDecision(r.Tool, r.Action)
	}
}

// backoff returns the delay before a key's next probe after attempts
// inconclusive attempts.
func (t *toolRun) backoff(attempts int) time.Duration {
	cfg := t.p.e.cfg
	exp := math.Pow(2, float64(max(attempts-1, 0)))
	d := time.Duration(math.Min(float64(cfg.BackoffBase)*exp, float64(cfg.BackoffMax)))
	jitter := 0.9 + 0.2*mrand.Float64()
	return time.Duration(float64(d) * jitter)
}

// recordVerdict updates this pass's count of the tool's consecutive
// unknown verdicts and stops probing the tool when the next decision
// written will open its breaker (one unknown when half-open).
func (t *toolRun) recordVerdict(conclusive bool) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if conclusive {
		t.consecutive = 0
		t.halfOpen = false
		return
	}
	t.consecutive++
	threshold := t.p.e.cfg.BreakerFailures
	if t.halfOpen {
		threshold = 1
	}
	if t.consecutive >= threshold {
		t.open = true
	}
}

func nonce() string {
	b := make([]byte, 6)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}
