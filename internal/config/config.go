// Package config loads and validates ledgerkeeper's YAML configuration.
//
// Loading is strict: an unknown key, a value of the wrong type, a bad
// duration or cron spec, an unknown probe type or a missing required field is
// an error that names the file, the line and the key path. `${VAR}` in a
// scalar expands from the environment (`$$` is a literal `$`); secrets may
// come from `*_file` twins instead. Secret values are of type Secret, which
// never prints its contents. Every value a ${VAR} expanded to in a text
// setting, every value read from a `*_file` twin and every Secret setting
// is registered in the configuration's Redactor, which every output goes
// through.
package config

import (
	"cmp"
	"fmt"
	"maps"
	"net/url"
	"slices"
	"sort"
	"strings"
	"time"

	"github.com/robfig/cron/v3"

	"github.com/ledgerkeeper/ledgerkeeper/internal/secret"
	"github.com/ledgerkeeper/ledgerkeeper/probes"
	"github.com/ledgerkeeper/ledgerkeeper/reconcile"
)

// Defaults, documented in README's configuration reference. The engine's
// own defaults are the source for its keys, so the two cannot drift.
const (
	DefaultReconcileSchedule    = "@every 30s"
	DefaultPurgeSchedule        = "@every 1h"
	DefaultAlertsSchedule       = "@every 15s"
	DefaultGrace                = reconcile.DefaultGrace
	DefaultBatchSize            = reconcile.DefaultBatchSize
	DefaultConcurrency          = reconcile.DefaultConcurrency
	DefaultLease                = reconcile.DefaultLease
	DefaultAlertAfterAttempts   = reconcile.DefaultAlertAfterAttempts
	DefaultAlertAfterAge        = reconcile.DefaultAlertAfterAge
	DefaultBackoffBase          = reconcile.DefaultBackoffBase
	DefaultBackoffMax           = reconcile.DefaultBackoffMax
	DefaultBreakerFailures      = reconcile.DefaultBreakerFailures
	DefaultBreakerCooldown      = reconcile.DefaultBreakerCooldown
	DefaultBreakerMaxCooldown   = reconcile.DefaultBreakerMaxCooldown
	DefaultProcessingWindow     = reconcile.DefaultProcessingWindow
	DefaultProbeTimeout         = 5 * time.Second
	DefaultRetentionMinAge      = 24 * time.Hour
	DefaultRetentionBatchSize   = 1000
	DefaultRetentionBatchPause  = 50 * time.Millisecond
	DefaultRetentionMaxDuration = 10 * time.Minute
	DefaultRetentionDutyCycle   = 0.20
	DefaultRetentionBatchTarget = 15 * time.Millisecond
	DefaultAuditMaxAge          = 30 * 24 * time.Hour
	DefaultRenotifyAfter        = reconcile.DefaultRenotifyAfter
	DefaultMaxKeysPerMessage    = 20
	DefaultHTTPListen           = ":9464"
)

// Config is the whole configuration file.
type Config struct {
	Database  Database        `yaml:"database" json:"database"`
	Schedule  Schedule        `yaml:"schedule" json:"schedule"`
	Reconcile Reconcile       `yaml:"reconcile" json:"reconcile"`
	Defaults  ToolDefaults    `yaml:"defaults" json:"defaults"`
	Tools     map[string]Tool `yaml:"tools" json:"tools"`
	SelfCheck SelfCheck       `yaml:"self_check" json:"self_check"`
	Retention Retention       `yaml:"retention" json:"retention"`
	Alerts    Alerts          `yaml:"alerts" json:"alerts"`
	HTTP      HTTP            `yaml:"http" json:"http"`
	Log       Log             `yaml:"log" json:"log"`

	// File is where the configuration came from ("" for built-in defaults).
	File string `yaml:"-" json:"file,omitempty"`
	// lines maps a key path ("reconcile.grace") to its line in File.
	lines map[string]int
	// redactor holds every secret value of this configuration (see
	// Redactor in load.go).
	redactor *secret.Redactor
}

// Database says where the ledger lives.
type Database struct {
	// URL is a PostgreSQL connection URL. Overridden by --database-url and
	// LEDGERKEEPER_DATABASE_URL.
	URL     Secret `yaml:"url" json:"url"`
	URLFile string `yaml:"url_file" json:"url_file,omitempty"`
	// MaxConns bounds the pool. Default: reconcile.concurrency + 4.
	MaxConns int `yaml:"max_conns" json:"max_conns"`
}

// Schedule holds robfig/cron specs for `serve`.
type Schedule struct {
	Reconcile string `yaml:"reconcile" json:"reconcile"`
	Purge     string `yaml:"purge" json:"purge"`
	Alerts    string `yaml:"alerts" json:"alerts"`
}

// Reconcile tunes the engine.
type Reconcile struct {
	// Grace is added to a tool's processing window before a key is due.
	Grace Duration `yaml:"grace" json:"grace"`
	// BatchSize is the number of keys leased per query.
	BatchSize int `yaml:"batch_size" json:"batch_size"`
	// Concurrency bounds probes in flight across all tools.
	Concurrency int `yaml:"concurrency" json:"concurrency"`
	// Lease is how long a leased key is reserved for one probe attempt.
	Lease Duration `yaml:"lease" json:"lease"`
	// AlertAfterAttempts raises an alert once a key's inconclusive attempts
	// reach it.
	AlertAfterAttempts int `yaml:"alert_after_attempts" json:"alert_after_attempts"`
	// AlertAfterAge raises an alert once an unresolved key is this old.
	AlertAfterAge Duration `yaml:"alert_after_age" json:"alert_after_age"`
	// ConfirmNotFoundAfter, when > 0, requires a second not_found at least
	// this much later before a key is marked failed_retryable.
	ConfirmNotFoundAfter Duration `yaml:"confirm_not_found_after" json:"confirm_not_found_after"`
	// BackoffBase and BackoffMax shape the exponential back-off of the next
	// probe after an inconclusive attempt.
	BackoffBase Duration `yaml:"backoff_base" json:"backoff_base"`
	BackoffMax  Duration `yaml:"backoff_max" json:"backoff_max"`
	// Breaker is the per-tool circuit breaker.
	Breaker Breaker `yaml:"breaker" json:"breaker"`
	// MaxDuration bounds one pass: past it no more keys are leased; the
	// rest wait for the next pass. Default 10m.
	MaxDuration Duration `yaml:"max_duration" json:"max_duration"`
}

// Breaker opens a tool's circuit after Failures consecutive unknown verdicts
// (counted across passes and replicas); probing that tool pauses for
// Cooldown, doubling per re-open up to MaxCooldown.
type Breaker struct {
	Failures    int      `yaml:"failures" json:"failures"`
	Cooldown    Duration `yaml:"cooldown" json:"cooldown"`
	MaxCooldown Duration `yaml:"max_cooldown" json:"max_cooldown"`
}

// SelfCheck tunes the probes' self-check against the ledger's ground truth:
// before a tool's verdicts change any key, its probe must find keys its tool
// server completed and must not find a key never issued.
type SelfCheck struct {
	// Interval is how long a passing check vouches for a probe (shared by
	// replicas). Default 10m. A failing check is repeated every pass.
	Interval Duration `yaml:"interval" json:"interval"`
	// Samples is how many completed keys are probed per check. Default 3.
	Samples int `yaml:"samples" json:"samples"`
	// MaxAge bounds the age of those keys. Default 6h.
	MaxAge Duration `yaml:"max_age" json:"max_age"`
}

// ProbeSelfCheck is one probe's self-check switch.
type ProbeSelfCheck struct {
	// Enabled: false acts on the probe's verdicts unchecked. Dangerous: a
	// probe broken on day one marks keys retryable whose effect happened.
	// Default true.
	Enabled *bool `yaml:"enabled" json:"enabled,omitempty"`
}

// ToolDefaults apply to every tool that does not override them, and to keys
// of tools absent from `tools`.
type ToolDefaults struct {
	ProcessingWindow Duration `yaml:"processing_window" json:"processing_window"`
	// HeartbeatTimeout: a key whose heartbeat_at is younger is in flight.
	// Default: the processing window.
	HeartbeatTimeout Duration `yaml:"heartbeat_timeout" json:"heartbeat_timeout"`
}

// Tool is one tool's policy.
type Tool struct {
	ProcessingWindow Duration `yaml:"processing_window" json:"processing_window"`
	HeartbeatTimeout Duration `yaml:"heartbeat_timeout" json:"heartbeat_timeout"`
	// DownstreamDedupWindow is how long the downstream itself deduplicates
	// (Stripe: 24h). Past it, not_found escalates instead of marking the key
	// failed_retryable. Zero: no such horizon.
	DownstreamDedupWindow Duration `yaml:"downstream_dedup_window" json:"downstream_dedup_window"`
	// Concurrency bounds this tool's probes in flight. Default: the global
	// reconcile.concurrency.
	Concurrency int    `yaml:"concurrency" json:"concurrency"`
	Probe       *Probe `yaml:"probe" json:"probe,omitempty"`
}

// Probe configures a built-in probe ("http" or "sql"), or names a probe
// registered from Go ("go").
type Probe struct {
	Type string `yaml:"type" json:"type"`
	// http
	URL          string            `yaml:"url" json:"url,omitempty"`
	Method       string            `yaml:"method" json:"method,omitempty"`
	Headers      map[string]Secret `yaml:"headers" json:"headers,omitempty"`
	HeadersFile  map[string]string `yaml:"headers_file" json:"headers_file,omitempty"`
	Match        string            `yaml:"match" json:"match,omitempty"`
	MaxBodyBytes int64             `yaml:"max_body_bytes" json:"max_body_bytes,omitempty"`
	// sql
	DatabaseURL     Secret   `yaml:"database_url" json:"database_url,omitempty"`
	DatabaseURLFile string   `yaml:"database_url_file" json:"database_url_file,omitempty"`
	Query           string   `yaml:"query" json:"query,omitempty"`
	Args            []string `yaml:"args" json:"args,omitempty"`
	// both
	Timeout      Duration          `yaml:"timeout" json:"timeout"`
	ResponseCode int               `yaml:"response_code" json:"response_code,omitempty"`
	ResponseBody map[string]string `yaml:"response_body" json:"response_body,omitempty"`
	// SelfCheck can turn the self-check off for this probe.
	SelfCheck ProbeSelfCheck `yaml:"self_check" json:"self_check"`
}

// SelfCheckEnabled reports whether the probe's verdicts are vetted by the
// self-check (the default).
func (p *Probe) SelfCheckEnabled() bool { return p.SelfCheck.Enabled == nil || *p.SelfCheck.Enabled }

// Retention governs purge.
type Retention struct {
	// MinAge is a floor: a key younger than this (by created_at) is never
	// purged, whatever its expires_at.
	MinAge Duration `yaml:"min_age" json:"min_age"`
	// BatchSize is the most rows one DELETE removes.
	BatchSize int `yaml:"batch_size" json:"batch_size"`
	// BatchPause is the least pause between batches.
	BatchPause Duration `yaml:"batch_pause" json:"batch_pause"`
	// MaxDuration is one pass's time budget.
	MaxDuration Duration `yaml:"max_duration" json:"max_duration"`
	// DutyCycle is the largest fraction of wall time spent inside DELETE
	// transactions (0 < d <= 1).
	DutyCycle float64 `yaml:"duty_cycle" json:"duty_cycle"`
	// BatchTarget is the batch duration above which batches shrink.
	BatchTarget Duration `yaml:"batch_target" json:"batch_target"`
	// AuditMaxAge is how long audit rows, sent alerts and run records live.
	AuditMaxAge Duration `yaml:"audit_max_age" json:"audit_max_age"`
	// Tools overrides MinAge per tool.
	Tools map[string]ToolRetention `yaml:"tools" json:"tools,omitempty"`
}

// ToolRetention is a per-tool retention override.
type ToolRetention struct {
	MinAge Duration `yaml:"min_age" json:"min_age"`
}

// Alerts configures notification.
type Alerts struct {
	Slack Slack `yaml:"slack" json:"slack"`
	// RenotifyAfter: a key alerted for a reason is not alerted again for
	// the same reason sooner.
	RenotifyAfter Duration `yaml:"renotify_after" json:"renotify_after"`
	// MaxKeysPerMessage bounds the keys listed in one grouped message.
	MaxKeysPerMessage int `yaml:"max_keys_per_message" json:"max_keys_per_message"`
	// RunbookURL is the base link of runbook.md, for per-reason sections.
	RunbookURL string `yaml:"runbook_url" json:"runbook_url,omitempty"`
}

// Slack is where alerts go: an incoming webhook, or a bot token + channel.
type Slack struct {
	WebhookURL     Secret `yaml:"webhook_url" json:"webhook_url"`
	WebhookURLFile string `yaml:"webhook_url_file" json:"webhook_url_file,omitempty"`
	Token          Secret `yaml:"token" json:"token"`
	TokenFile      string `yaml:"token_file" json:"token_file,omitempty"`
	Channel        string `yaml:"channel" json:"channel,omitempty"`
	// APIURL points the Web API client elsewhere (a proxy, a test server).
	// It must end in "/".
	APIURL string `yaml:"api_url" json:"api_url,omitempty"`
	// Timeout bounds one call to Slack. Default 10s.
	Timeout Duration `yaml:"timeout" json:"timeout"`
}

// HTTP is the daemon's own listener.
type HTTP struct {
	Listen string `yaml:"listen" json:"listen"`
}

// Log configures log/slog output on stderr.
type Log struct {
	// Level is debug, info, warn or error. Default info.
	Level string `yaml:"level" json:"level"`
	// Format is text or json. Default text.
	Format string `yaml:"format" json:"format"`
}

// ApplyDefaults fills every zero value with its documented default.
func (c *Config) ApplyDefaults() {
	c.Schedule.Reconcile = cmp.Or(c.Schedule.Reconcile, DefaultReconcileSchedule)
	c.Schedule.Purge = cmp.Or(c.Schedule.Purge, DefaultPurgeSchedule)
	c.Schedule.Alerts = cmp.Or(c.Schedule.Alerts, DefaultAlertsSchedule)

	r := &c.Reconcile
	r.Grace = orDur(r.Grace, DefaultGrace)
	r.BatchSize = cmp.Or(r.BatchSize, DefaultBatchSize)
	r.Concurrency = cmp.Or(r.Concurrency, DefaultConcurrency)
	r.Lease = orDur(r.Lease, DefaultLease)
	r.AlertAfterAttempts = cmp.Or(r.AlertAfterAttempts, DefaultAlertAfterAttempts)
	r.AlertAfterAge = orDur(r.AlertAfterAge, DefaultAlertAfterAge)
	r.BackoffBase = orDur(r.BackoffBase, DefaultBackoffBase)
	r.BackoffMax = orDur(r.BackoffMax, DefaultBackoffMax)
	r.Breaker.Failures = cmp.Or(r.Breaker.Failures, DefaultBreakerFailures)
	r.Breaker.Cooldown = orDur(r.Breaker.Cooldown, DefaultBreakerCooldown)
	r.Breaker.MaxCooldown = orDur(r.Breaker.MaxCooldown, DefaultBreakerMaxCooldown)
	r.MaxDuration = orDur(r.MaxDuration, reconcile.DefaultMaxDuration)

	c.SelfCheck.Interval = orDur(c.SelfCheck.Interval, reconcile.DefaultSelfCheckInterval)
	c.SelfCheck.Samples = cmp.Or(c.SelfCheck.Samples, reconcile.DefaultSelfCheckSamples)
	c.SelfCheck.MaxAge = orDur(c.SelfCheck.MaxAge, reconcile.DefaultSelfCheckMaxAge)

	c.Defaults.ProcessingWindow = orDur(c.Defaults.ProcessingWindow, DefaultProcessingWindow)
	c.Defaults.HeartbeatTimeout = orDur(c.Defaults.HeartbeatTimeout, c.Defaults.ProcessingWindow)
	for name, t := range c.Tools {
		t.ProcessingWindow = orDur(t.ProcessingWindow, c.Defaults.ProcessingWindow)
		t.HeartbeatTimeout = orDur(t.HeartbeatTimeout, t.ProcessingWindow)
		t.Concurrency = cmp.Or(t.Concurrency, r.Concurrency)
		if t.Probe != nil {
			t.Probe.Timeout = orDur(t.Probe.Timeout, DefaultProbeTimeout)
			if t.Probe.Type == "http" {
				t.Probe.Method = cmp.Or(strings.ToUpper(t.Probe.Method), "GET")
			}
		}
		c.Tools[name] = t
	}

	p := &c.Retention
	p.MinAge = orDur(p.MinAge, DefaultRetentionMinAge)
	p.BatchSize = cmp.Or(p.BatchSize, DefaultRetentionBatchSize)
	p.BatchPause = orDur(p.BatchPause, DefaultRetentionBatchPause)
	p.MaxDuration = orDur(p.MaxDuration, DefaultRetentionMaxDuration)
	p.DutyCycle = cmp.Or(p.DutyCycle, DefaultRetentionDutyCycle)
	p.BatchTarget = orDur(p.BatchTarget, DefaultRetentionBatchTarget)
	p.AuditMaxAge = orDur(p.AuditMaxAge, DefaultAuditMaxAge)

	c.Alerts.RenotifyAfter = orDur(c.Alerts.RenotifyAfter, DefaultRenotifyAfter)
	c.Alerts.MaxKeysPerMessage = cmp.Or(c.Alerts.MaxKeysPerMessage, DefaultMaxKeysPerMessage)
	c.Alerts.Slack.Timeout = orDur(c.Alerts.Slack.Timeout, 10*time.Second)

	c.HTTP.Listen = cmp.Or(c.HTTP.Listen, DefaultHTTPListen)
	c.Log.Level = cmp.Or(c.Log.Level, "info")
	c.Log.Format = cmp.Or(c.Log.Format, "text")
	if c.Database.MaxConns == 0 {
		c.Database.MaxConns = r.Concurrency + 4
	}
}

func orDur[T ~int64](d Duration, def T) Duration {
	if d == 0 {
		return Duration(def)
	}
	return d
}

// ToolPolicy is the effective policy for one tool name, configured or not.
type ToolPolicy struct {
	Name                  string
	Configured            bool
	ProcessingWindow      time.Duration
	HeartbeatTimeout      time.Duration
	DownstreamDedupWindow time.Duration
	Concurrency           int
	Probe                 *Probe
	RetentionMinAge       time.Duration
}

// Policy returns the effective policy for tool: its own settings, or the
// defaults (and no probe) for a tool absent from `tools`.
func (c *Config) Policy(tool string) ToolPolicy {
	p := ToolPolicy{
		Name:             tool,
		ProcessingWindow: c.Defaults.ProcessingWindow.D(),
		HeartbeatTimeout: c.Defaults.HeartbeatTimeout.D(),
		Concurrency:      c.Reconcile.Concurrency,
		RetentionMinAge:  c.Retention.MinAge.D(),
	}
	if t, ok := c.Tools[tool]; ok {
		p.Configured = true
		p.ProcessingWindow = t.ProcessingWindow.D()
		p.HeartbeatTimeout = t.HeartbeatTimeout.D()
		p.DownstreamDedupWindow = t.DownstreamDedupWindow.D()
		p.Concurrency = t.Concurrency
		p.Probe = t.Probe
	}
	if r, ok := c.Retention.Tools[tool]; ok && r.MinAge > 0 {
		p.RetentionMinAge = r.MinAge.D()
	}
	return p
}

// ToolNames returns the configured tools, sorted.
func (c *Config) ToolNames() []string {
	names := make([]string, 0, len(c.Tools))
	for n := range c.Tools {
		names = append(names, n)
	}
	sort.Strings(names)
	return names
}

// Error is a configuration error at a place in a file.
type Error struct {
	File string
	Line int
	Path string
	Msg  string
}

func (e *Error) Error() string {
	var b strings.Builder
	if e.File != "" {
		b.WriteString(e.File)
		if e.Line > 0 {
			fmt.Fprintf(&b, ":%d", e.Line)
		}
		b.WriteString(": ")
	}
	if e.Path != "" {
		b.WriteString(e.Path)
		b.WriteString(": ")
	}
	b.WriteString(e.Msg)
	return b.String()
}

// Errors is every problem found in one file.
type Errors []*Error

func (es Errors) Error() string {
	parts := make([]string, len(es))
	for i, e := range es {
		parts[i] = e.Error()
	}
	return strings.Join(parts, "\n")
}

func (c *Config) errAt(path, format string, args ...any) *Error {
	return &Error{File: c.File, Line: c.lineOf(path), Path: path, Msg: fmt.Sprintf(format, args...)}
}

// lineOf returns the line of path, or of its nearest ancestor present.
func (c *Config) lineOf(path string) int {
	for p := path; p != ""; {
		if l, ok := c.lines[p]; ok {
			return l
		}
		i := strings.LastIndexByte(p, '.')
		if i < 0 {
			break
		}
		p = p[:i]
	}
	return 0
}

// Validate checks the semantics that types alone do not. It expects
// ApplyDefaults to have run.
func (c *Config) Validate() error {
	var errs Errors
	add := func(e *Error) { errs = append(errs, e) }
	parser := cron.NewParser(cron.Minute | cron.Hour | cron.Dom | cron.Month | cron.Dow | cron.Descriptor)
	for path, spec := range map[string]string{
		"schedule.reconcile": c.Schedule.Reconcile,
		"schedule.purge":     c.Schedule.Purge,
		"schedule.alerts":    c.Schedule.Alerts,
	} {
		if _, err := parser.Parse(spec); err != nil {
			add(c.errAt(path, "bad cron spec %q: %v", spec, err))
		}
	}
	positive := func(path string, v int) {
		if v < 0 {
			add(c.errAt(path, "must be positive, got %d", v))
		}
	}
	positive("reconcile.batch_size", c.Reconcile.BatchSize)
	positive("reconcile.concurrency", c.Reconcile.Concurrency)
	positive("reconcile.alert_after_attempts", c.Reconcile.AlertAfterAttempts)
	positive("reconcile.breaker.failures", c.Reconcile.Breaker.Failures)
	positive("self_check.samples", c.SelfCheck.Samples)
	if c.SelfCheck.Samples > 20 {
		add(c.errAt("self_check.samples", "at most 20, got %d: a few keys tell a broken probe from a good one", c.SelfCheck.Samples))
	}
	positive("retention.batch_size", c.Retention.BatchSize)
	positive("alerts.max_keys_per_message", c.Alerts.MaxKeysPerMessage)
	positive("database.max_conns", c.Database.MaxConns)
	if c.Reconcile.BatchSize > 10000 {
		add(c.errAt("reconcile.batch_size", "at most 10000, got %d", c.Reconcile.BatchSize))
	}
	if c.Retention.DutyCycle <= 0 || c.Retention.DutyCycle > 1 {
		add(c.errAt("retention.duty_cycle", "must be in (0, 1], got %v", c.Retention.DutyCycle))
	}
	if c.Reconcile.Breaker.MaxCooldown < c.Reconcile.Breaker.Cooldown {
		add(c.errAt("reconcile.breaker.max_cooldown", "must not be shorter than reconcile.breaker.cooldown (%s)", c.Reconcile.Breaker.Cooldown))
	}
	if c.Reconcile.BackoffMax < c.Reconcile.BackoffBase {
		add(c.errAt("reconcile.backoff_max", "must not be shorter than reconcile.backoff_base (%s)", c.Reconcile.BackoffBase))
	}
	switch c.Log.Level {
	case "debug", "info", "warn", "error":
	default:
		add(c.errAt("log.level", "must be debug, info, warn or error, got %q", c.Log.Level))
	}
	switch c.Log.Format {
	case "text", "json":
	default:
		add(c.errAt("log.format", "must be text or json, got %q", c.Log.Format))
	}
	if u := c.Alerts.Slack.APIURL; u != "" {
		if pu, err := url.Parse(u); err != nil || (pu.Scheme != "http" && pu.Scheme != "https") || pu.Host == "" {
			add(c.errAt("alerts.slack.api_url", "must be an http(s) URL"))
		} else if !strings.HasSuffix(u, "/") {
			add(c.errAt("alerts.slack.api_url", "must end in \"/\" (slack-go appends the method name)"))
		}
	}
	if c.Alerts.Slack.Token != "" && c.Alerts.Slack.Channel == "" {
		add(c.errAt("alerts.slack.channel", "required with alerts.slack.token"))
	}
	if w := c.Alerts.Slack.WebhookURL; w != "" {
		if pu, err := url.Parse(w.Reveal()); err != nil || (pu.Scheme != "http" && pu.Scheme != "https") || pu.Host == "" {
			add(c.errAt("alerts.slack.webhook_url", "must be an http(s) URL"))
		}
	}

	for _, name := range c.ToolNames() {
		t := c.Tools[name]
		base := "tools." + name
		if len(name) > 64 {
			add(c.errAt(base, "tool name longer than 64 characters"))
		}
		if t.Concurrency < 0 {
			add(c.errAt(base+".concurrency", "must be positive, got %d", t.Concurrency))
		}
		floor := c.Retention.MinAge
		floorPath := "retention.min_age"
		if r, ok := c.Retention.Tools[name]; ok && r.MinAge > 0 {
			floor, floorPath = r.MinAge, "retention.tools."+name+".min_age"
		}
		if floor < t.ProcessingWindow+c.Reconcile.Grace {
			add(c.errAt(floorPath, "retention floor %s is shorter than tool %s's processing window plus grace (%s): a key could be purged while its outcome is unknown", floor, name, t.ProcessingWindow+c.Reconcile.Grace))
		}
		if t.Probe != nil {
			for _, e := range c.validateProbe(base+".probe", t.Probe) {
				add(e)
			}
			// A probe must finish, and its decision be written, well
			// inside the lease, or another replica may take the key.
			if t.Probe.Timeout+Duration(2*time.Second) >= c.Reconcile.Lease/2 {
				add(c.errAt(base+".probe.timeout", "probe timeout %s must be well under half of reconcile.lease (%s): raise the lease or shorten the timeout", t.Probe.Timeout, c.Reconcile.Lease))
			}
		}
	}
	for name, r := range c.Retention.Tools {
		if _, ok := c.Tools[name]; !ok && r.MinAge < c.Defaults.ProcessingWindow+c.Reconcile.Grace {
			add(c.errAt("retention.tools."+name+".min_age", "retention floor %s is shorter than the default processing window plus grace (%s)", r.MinAge, c.Defaults.ProcessingWindow+c.Reconcile.Grace))
		}
	}
	if len(errs) == 0 {
		return nil
	}
	sort.SliceStable(errs, func(i, j int) bool { return errs[i].Line < errs[j].Line })
	return errs
}

func (c *Config) validateProbe(base string, p *Probe) []*Error {
	var errs []*Error
	add := func(path, format string, args ...any) { errs = append(errs, c.errAt(path, format, args...)) }
	if p.Timeout < 0 {
		add(base+".timeout", "must be positive")
	}
	switch p.Type {
	case "http":
		if p.URL == "" {
			add(base+".url", "required for an http probe")
		} else if err := checkURLTemplate(p.URL); err != nil {
			add(base+".url", "%v", err)
		}
		switch p.Method {
		case "GET", "POST", "HEAD":
		default:
			add(base+".method", "must be GET, POST or HEAD, got %q", p.Method)
		}
		if p.Query != "" || p.DatabaseURL != "" || len(p.Args) > 0 {
			add(base, "query, database_url and args belong to sql probes")
		}
	case "sql":
		if p.DatabaseURL == "" {
			add(base+".database_url", "required for a sql probe (or database_url_file)")
		}
		if strings.TrimSpace(p.Query) == "" {
			add(base+".query", "required for a sql probe")
		} else if err := probes.CheckQuery(p.Query); err != nil {
			add(base+".query", "%v", err)
		}
		if p.DatabaseURL != "" {
			if err := probes.CheckExecMode(p.DatabaseURL.Reveal()); err != nil {
				add(base+".database_url", "%v", err)
			}
		}
		for i, a := range p.Args {
			if a != "key" && a != "tool" && !strings.HasPrefix(a, "request.") {
				add(fmt.Sprintf("%s.args[%d]", base, i), "must be key, tool or request.PATH, got %q", a)
			}
		}
		if p.URL != "" || p.Match != "" || len(p.Headers) > 0 {
			add(base, "url, match and headers belong to http probes")
		}
	case "go":
	case "":
		add(base+".type", "required: http, sql or go")
	default:
		add(base+".type", "unknown probe type %q (want http, sql or go)", p.Type)
	}
	// JSONPath and JSON Pointer spellings would name members no answer
	// has; refused here so the error has the key's own line.
	if err := probes.CheckPathSpelling(p.Match); err != nil {
		add(base+".match", "%v", err)
	}
	for _, field := range slices.Sorted(maps.Keys(p.ResponseBody)) {
		if err := probes.CheckPathSpelling(p.ResponseBody[field]); err != nil {
			add(base+".response_body."+field, "%v", err)
		}
	}
	if p.ResponseCode != 0 && (p.ResponseCode < 100 || p.ResponseCode > 599) {
		add(base+".response_code", "must be an HTTP status code, got %d", p.ResponseCode)
	}
	return errs
}

// checkURLTemplate accepts http(s) URLs whose scheme and host are literal:
// placeholders may stand only in the path and query.
func checkURLTemplate(tmpl string) error {
	scheme, rest, ok := strings.Cut(tmpl, "://")
	if !ok || (scheme != "http" && scheme != "https") {
		return fmt.Errorf("must start with http:// or https://")
	}
	hostEnd := strings.IndexAny(rest, "/?#")
	host := rest
	if hostEnd >= 0 {
		host = rest[:hostEnd]
	}
	if host == "" {
		return fmt.Errorf("has no host")
	}
	if strings.ContainsAny(host, "{}@") {
		return fmt.Errorf("host %q must be literal (no placeholders, no credentials)", host)
	}
	return nil
}

// ErrorAt builds an error at a key path of this configuration, with the
// key's line, for problems found after loading (building probes).
func (c *Config) ErrorAt(path, format string, args ...any) *Error {
	return c.errAt(path, format, args...)
}
