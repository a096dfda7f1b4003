package reconcile

import (
	"cmp"
	"context"
	"encoding/json"
	"log/slog"
	"maps"
	"slices"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/ledgerkeeper/ledgerkeeper/alerts"
	"github.com/ledgerkeeper/ledgerkeeper/internal/secret"
	"github.com/ledgerkeeper/ledgerkeeper/internal/settings"
	"github.com/ledgerkeeper/ledgerkeeper/probes"
	"github.com/ledgerkeeper/ledgerkeeper/store"
)

// writeTimeout bounds one decision's transaction.
const writeTimeout = 10 * time.Second

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
	// RateLimit bounds this process's probes of the tool (self-checks and
	// half-open trials included). Zero: no limit.
	RateLimit RateLimit
	// Canaries are effects known to exist downstream, declared in the
	// configuration (tools.T.probe.self_check.canaries): present-side
	// witnesses for a tool with no key recently completed by its tool
	// server. Operators add more with `ledgerkeeper probe canary add`.
	Canaries []Canary
	// WitnessNotRequired (tools.T.probe.self_check.require_witness: false)
	// applies not_found verdicts even when no sample of the bracket's
	// self-checks came back found. Dangerous: a probe that finds nothing
	// (a typo'd path answering 404) is then believed.
	WitnessNotRequired bool
}

// Canary is an effect known to exist downstream (a ticket kept for the
// purpose): its key as the probe addresses it and the request body the
// probe's templates read.
type Canary struct {
	Key     string
	Request json.RawMessage
}

// Config configures an Engine. Each setting is declared once, here: its
// `yaml` key in the configuration file's reconcile section (internal/config
// decodes the section into this struct), its `default` (a zero value means
// it) and its bounds (`min`, `max`, and CheckSettings across fields),
// applied and judged by internal/settings. Fields tagged `yaml:"-"` are
// wiring, or settings of other sections the daemon copies in.
type Config struct {
	// Actor names this replica in audit rows and lease owners (e.g.
	// hostname:pid, or "operator:alice" for a manual run). Required.
	Actor string `yaml:"-"`
	// Tools maps tool names to policies; a tool absent from it gets
	// Default.
	Tools map[string]Policy `yaml:"-"`
	// Default is the policy of tools absent from Tools (its Probe is
	// ignored: such keys have no probe). Its ProcessingWindow defaults to
	// DefaultProcessingWindow.
	Default Policy `yaml:"-"`
	// Grace is added to each processing window.
	Grace time.Duration `yaml:"grace" default:"10s"`
	// BatchSize is the number of keys leased per query.
	BatchSize int `yaml:"batch_size" default:"100" min:"0" max:"10000"`
	// Concurrency bounds probes in flight across all tools.
	Concurrency int `yaml:"concurrency" default:"16" min:"0"`
	// Lease is how long a key is reserved for one probe. It must exceed
	// the slowest probe's timeout.
	Lease time.Duration `yaml:"lease" default:"2m"`
	// AlertAfterAttempts and AlertAfterAge raise probe_failing / no_probe
	// alerts: once a key's inconclusive attempts reach the one, or an
	// unresolved key is as old as the other.
	AlertAfterAttempts int           `yaml:"alert_after_attempts" default:"3" min:"0"`
	AlertAfterAge      time.Duration `yaml:"alert_after_age" default:"1h"`
	// ConfirmNotFoundAfter > 0 requires a second not_found that much later
	// before a key is marked failed_retryable. 0: one not_found suffices.
	ConfirmNotFoundAfter time.Duration `yaml:"confirm_not_found_after"`
	// BackoffBase and BackoffMax shape the next probe time after an
	// inconclusive attempt: base * 2^(attempts-1), capped, ±10% jitter.
	BackoffBase time.Duration `yaml:"backoff_base" default:"30s"`
	BackoffMax  time.Duration `yaml:"backoff_max" default:"30m"`
	// Breaker is each tool's circuit breaker: see the package
	// documentation.
	Breaker BreakerConfig `yaml:"breaker"`
	// MaxDuration bounds a pass: past it no more keys are leased (those
	// in flight are finished and written); the rest wait for the next
	// pass.
	MaxDuration time.Duration `yaml:"max_duration" default:"10m"`
	// RenotifyAfter: see alerts.Raise (the file's alerts.renotify_after).
	RenotifyAfter time.Duration `yaml:"-" default:"4h"`
	// ReportKeys bounds the key lines a pass report keeps (counts are
	// always complete); negative keeps none.
	ReportKeys int `yaml:"-" default:"1000"`
	// SelfCheck tunes the probes' self-check (the file's self_check
	// section).
	SelfCheck SelfCheckConfig `yaml:"-"`
	// Redactor removes registered secrets from probe errors and evidence
	// before they reach the audit trail, logs and alerts. Nil redacts
	// nothing.
	Redactor *secret.Redactor `yaml:"-"`
}

// BreakerConfig opens a tool's circuit after Failures consecutive unknown
// verdicts (counted across passes and replicas); probing that tool pauses
// for Cooldown, doubling per re-open up to MaxCooldown.
type BreakerConfig struct {
	Failures    int           `yaml:"failures" default:"5" min:"0"`
	Cooldown    time.Duration `yaml:"cooldown" default:"1m"`
	MaxCooldown time.Duration `yaml:"max_cooldown" default:"30m"`
}

// CheckSettings refuses a ceiling below its floor.
func (b *BreakerConfig) CheckSettings(r *settings.Report) {
	if b.MaxCooldown < b.Cooldown {
		r.Field(&b.MaxCooldown, "must not be shorter than %s (%s)", settings.Ref(&b.Cooldown), b.Cooldown)
	}
}

// SelfCheckConfig is the file's self_check section: before a tool's
// verdicts change any key, its probe must find keys its tool server
// completed and must not find a key never issued.
type SelfCheckConfig struct {
	// Interval is how often a tool with keys in flight and none due is
	// checked (a broken probe is reported before its keys come due);
	// `status` marks an older check stale. A failing check is repeated
	// every pass.
	Interval time.Duration `yaml:"interval" default:"10m"`
	// Samples is how many keys completed by their tool server are probed
	// per check: a few tell a broken probe from a good one.
	Samples int `yaml:"samples" default:"3" min:"0" max:"20"`
	// MaxAge bounds the age of those keys.
	MaxAge time.Duration `yaml:"max_age" default:"6h"`
}

// DefaultProcessingWindow is the processing window of a tool that sets
// none (the file's defaults.processing_window).
const DefaultProcessingWindow = 30 * time.Second

// DefaultConfig returns a Config with every default applied (no tools).
func DefaultConfig() Config {
	var c Config
	c.applyDefaults()
	return c
}

// CheckSettings refuses a back-off ceiling below its base.
func (c *Config) CheckSettings(r *settings.Report) {
	if c.BackoffMax < c.BackoffBase {
		r.Field(&c.BackoffMax, "must not be shorter than %s (%s)", settings.Ref(&c.BackoffBase), c.BackoffBase)
	}
}

// Validate refuses settings the engine cannot run with, after the
// defaults: every refusal is a *fielderr.Error naming the setting by its
// yaml path within the reconcile section; all are returned, joined.
func (c Config) Validate() error {
	c.applyDefaults() // c is a copy; applyDefaults builds its own Tools map
	return settings.Validate(&c)
}

func (c *Config) applyDefaults() {
	settings.ApplyDefaults(c)
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

// rules are the settings Decide reads.
func (c *Config) rules() Rules {
	return Rules{AlertAfterAttempts: c.AlertAfterAttempts, AlertAfterAge: c.AlertAfterAge,
		ConfirmNotFoundAfter: c.ConfirmNotFoundAfter, BackoffBase: c.BackoffBase, BackoffMax: c.BackoffMax}
}

// Engine runs reconcile passes. It is safe for concurrent use; passes may
// also run concurrently in other processes.
type Engine struct {
	cfg     Config
	pool    store.Pool
	logger  *slog.Logger
	metrics *Metrics

	sweepMu     sync.Mutex
	sweepCursor alerts.OpenAlert // where the next alert sweep resumes

	// limits holds each probed tool's rate limiter and Retry-After pause,
	// shared by every pass of this engine (built in New, read-only after).
	limits map[string]*toolLimit

	// commitTx commits a decisions' transaction (nil: tx.Commit); a test
	// replaces it to break the connection under a COMMIT.
	commitTx func(tx pgx.Tx, ctx context.Context) error
}

// New returns an engine. metrics may be nil.
func New(cfg Config, pool store.Pool, logger *slog.Logger, metrics *Metrics) *Engine {
	if cfg.Actor == "" || pool == nil {
		panic("reconcile: New needs an Actor and a pool")
	}
	if logger == nil {
		logger = slog.New(slog.DiscardHandler)
	}
	cfg.applyDefaults()
	for _, tool := range slices.Sorted(maps.Keys(cfg.Tools)) {
		pol := cfg.Tools[tool]
		if pol.Probe == nil {
			continue
		}
		if pol.SelfCheckDisabled {
			logger.Warn("probe self-check disabled: this tool's verdicts change keys unchecked", "tool", tool)
		}
		// The one place every probe is guarded: whatever it returns, the
		// engine sees a well-formed result, and no probe outlives its
		// lease.
		pol.Probe = probes.Guard(pol.Probe, cmp.Or(pol.ProbeTimeout, cfg.Lease-leaseMargin))
		cfg.Tools[tool] = pol
	}
	if metrics != nil {
		for tool := range cfg.Tools {
			metrics.initTool(tool)
		}
	}
	limits := map[string]*toolLimit{}
	for tool, pol := range cfg.Tools {
		if pol.Probe != nil {
			limits[tool] = newToolLimit(tool, pol.RateLimit, metrics)
		}
	}
	return &Engine{cfg: cfg, pool: pool, logger: logger, metrics: metrics, limits: limits}
}

// Policy returns the effective policy of a tool.
func (e *Engine) Policy(tool string) Policy {
	if p, ok := e.cfg.Tools[tool]; ok {
		return p
	}
	return e.cfg.Default
}

// Windows returns a tool's window + grace and heartbeat timeout (for
// store.Stats).
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
	// Stop, when closed, asks the pass to stop gracefully: it leases no
	// more keys and starts no more probes (keys leased but not yet probing
	// are given back), while the probes in flight run to their end and
	// their decisions are written, for as long as ctx lives. Cancelling
	// ctx is the hard stop: a probe still running is given back, not
	// counted as an attempt. A stopped pass is recorded as stopped, not
	// failed. Nil: only ctx stops the pass.
	Stop <-chan struct{}
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
	ActionResolvedByOriginal   = store.ActionResolvedByOriginal
	ActionHeld                 = store.ActionHeld
	ActionLeaseLost            = store.ActionLeaseLost
	ActionInFlightAgain        = store.ActionInFlightAgain
	// Dry-run actions say what would happen.
	ActionWouldComplete = "would_complete"
	ActionWouldRetry    = "would_mark_retryable"
	// ActionWouldAlert replaces duplicate_alerted and escalated_dedup_window
	// in a dry run, which raises nothing.
	ActionWouldAlert = "would_alert"
)
