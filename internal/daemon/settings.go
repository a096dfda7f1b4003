package daemon

import (
	"cmp"
	"maps"
	"net/url"
	"slices"
	"strings"
	"time"

	"github.com/ledgerkeeper/ledgerkeeper/alerts"
	"github.com/ledgerkeeper/ledgerkeeper/expiry"
	"github.com/ledgerkeeper/ledgerkeeper/internal/config"
	"github.com/ledgerkeeper/ledgerkeeper/internal/fielderr"
	"github.com/ledgerkeeper/ledgerkeeper/probes"
	"github.com/ledgerkeeper/ledgerkeeper/reconcile"
)

// Defaults of the daemon's own settings: serve's schedules, its listener
// and its logs. Every other default is declared once, by its service
// (reconcile.Default*, expiry.Default*, alerts.Default*,
// probes.DefaultTimeout); Settle copies them into the configuration so that
// `config check` prints the effective settings.
const (
	DefaultReconcileSchedule = "@every 30s"
	DefaultPurgeSchedule     = "@every 1h"
	DefaultAlertsSchedule    = "@every 15s"
	DefaultHTTPListen        = ":9464"
	DefaultLogLevel          = "info"
	DefaultLogFormat         = "text"
)

// Settle makes a decoded configuration ready to run: it fills every zero
// setting with its service's default, then validates it: each service's
// own Validate (their field errors mapped back to `file:line: key`), the
// checks that involve two services (a probe's timeout against the lease, a
// retention floor against a tool's processing window) and the daemon's own
// settings. Every problem is reported, as config.Errors sorted by line.
// Nothing connects.
func Settle(cfg *config.Config) error {
	applyDefaults(cfg)
	return validate(cfg)
}

func applyDefaults(c *config.Config) {
	c.Schedule.Reconcile = cmp.Or(c.Schedule.Reconcile, DefaultReconcileSchedule)
	c.Schedule.Purge = cmp.Or(c.Schedule.Purge, DefaultPurgeSchedule)
	c.Schedule.Alerts = cmp.Or(c.Schedule.Alerts, DefaultAlertsSchedule)

	r := &c.Reconcile
	r.Grace = orDur(r.Grace, reconcile.DefaultGrace)
	r.BatchSize = cmp.Or(r.BatchSize, reconcile.DefaultBatchSize)
	r.Concurrency = cmp.Or(r.Concurrency, reconcile.DefaultConcurrency)
	r.Lease = orDur(r.Lease, reconcile.DefaultLease)
	r.AlertAfterAttempts = cmp.Or(r.AlertAfterAttempts, reconcile.DefaultAlertAfterAttempts)
	r.AlertAfterAge = orDur(r.AlertAfterAge, reconcile.DefaultAlertAfterAge)
	r.BackoffBase = orDur(r.BackoffBase, reconcile.DefaultBackoffBase)
	r.BackoffMax = orDur(r.BackoffMax, reconcile.DefaultBackoffMax)
	r.Breaker.Failures = cmp.Or(r.Breaker.Failures, reconcile.DefaultBreakerFailures)
	r.Breaker.Cooldown = orDur(r.Breaker.Cooldown, reconcile.DefaultBreakerCooldown)
	r.Breaker.MaxCooldown = orDur(r.Breaker.MaxCooldown, reconcile.DefaultBreakerMaxCooldown)
	r.MaxDuration = orDur(r.MaxDuration, reconcile.DefaultMaxDuration)

	c.SelfCheck.Interval = orDur(c.SelfCheck.Interval, reconcile.DefaultSelfCheckInterval)
	c.SelfCheck.Samples = cmp.Or(c.SelfCheck.Samples, reconcile.DefaultSelfCheckSamples)
	c.SelfCheck.MaxAge = orDur(c.SelfCheck.MaxAge, reconcile.DefaultSelfCheckMaxAge)

	c.Defaults.ProcessingWindow = orDur(c.Defaults.ProcessingWindow, reconcile.DefaultProcessingWindow)
	c.Defaults.HeartbeatTimeout = orDur(c.Defaults.HeartbeatTimeout, c.Defaults.ProcessingWindow.D())
	for name, t := range c.Tools {
		t.ProcessingWindow = orDur(t.ProcessingWindow, c.Defaults.ProcessingWindow.D())
		t.HeartbeatTimeout = orDur(t.HeartbeatTimeout, t.ProcessingWindow.D())
		t.Concurrency = cmp.Or(t.Concurrency, r.Concurrency)
		if t.Probe != nil {
			t.Probe.Timeout = orDur(t.Probe.Timeout, probes.DefaultTimeout)
			if t.Probe.Type == "http" {
				t.Probe.Method = cmp.Or(strings.ToUpper(t.Probe.Method), "GET")
				t.Probe.NotFoundOn404 = cmp.Or(t.Probe.NotFoundOn404, probes.NotFoundOn404JSON)
			}
		}
		c.Tools[name] = t
	}

	p := &c.Retention
	p.MinAge = orDur(p.MinAge, expiry.DefaultMinAge)
	p.BatchSize = cmp.Or(p.BatchSize, expiry.DefaultBatchSize)
	p.BatchPause = orDur(p.BatchPause, expiry.DefaultBatchPause)
	p.MaxDuration = orDur(p.MaxDuration, expiry.DefaultMaxDuration)
	p.DutyCycle = cmp.Or(p.DutyCycle, expiry.DefaultDutyCycle)
	p.BatchTarget = orDur(p.BatchTarget, expiry.DefaultBatchTarget)
	p.AuditMaxAge = orDur(p.AuditMaxAge, expiry.DefaultAuditMaxAge)

	// reconcile raises with it, expiry too: one default, reconcile's.
	c.Alerts.RenotifyAfter = orDur(c.Alerts.RenotifyAfter, reconcile.DefaultRenotifyAfter)
	c.Alerts.MaxKeysPerMessage = cmp.Or(c.Alerts.MaxKeysPerMessage, alerts.DefaultMaxKeysPerMessage)
	c.Alerts.Slack.Timeout = orDur(c.Alerts.Slack.Timeout, alerts.DefaultSlackTimeout)

	c.HTTP.Listen = cmp.Or(c.HTTP.Listen, DefaultHTTPListen)
	c.Log.Level = cmp.Or(c.Log.Level, DefaultLogLevel)
	c.Log.Format = cmp.Or(c.Log.Format, DefaultLogFormat)
	if c.Database.MaxConns == 0 {
		c.Database.MaxConns = r.Concurrency + 4
	}
}

func orDur(d config.Duration, def time.Duration) config.Duration {
	if d == 0 {
		return config.Duration(def)
	}
	return d
}

// validate expects applyDefaults to have run.
func validate(c *config.Config) error {
	var errs config.Errors
	add := func(e *config.Error) { errs = append(errs, e) }
	// service maps a service's Validate error back to the file.
	service := func(section string, err error) {
		fes, ok := fielderr.All(err)
		if !ok {
			add(c.ErrorAt(section, "%v", err))
			return
		}
		for _, fe := range fes {
			add(c.ErrorAt(fe.Field, "%s", fe.Msg))
		}
	}
	service("reconcile", EngineConfig(c, nil, "config").Validate())
	service("retention", PurgeConfig(c, "config").Validate())

	if c.Database.MaxConns < 0 {
		add(c.ErrorAt("database.max_conns", "must be positive, got %d", c.Database.MaxConns))
	}
	if c.Alerts.MaxKeysPerMessage < 0 {
		add(c.ErrorAt("alerts.max_keys_per_message", "must be positive, got %d", c.Alerts.MaxKeysPerMessage))
	}
	switch c.Log.Level {
	case "debug", "info", "warn", "error":
	default:
		add(c.ErrorAt("log.level", "must be debug, info, warn or error, got %q", c.Log.Level))
	}
	switch c.Log.Format {
	case "text", "json":
	default:
		add(c.ErrorAt("log.format", "must be text or json, got %q", c.Log.Format))
	}
	if u := c.Alerts.Slack.APIURL; u != "" {
		if pu, err := url.Parse(u); err != nil || (pu.Scheme != "http" && pu.Scheme != "https") || pu.Host == "" {
			add(c.ErrorAt("alerts.slack.api_url", "must be an http(s) URL"))
		} else if !strings.HasSuffix(u, "/") {
			add(c.ErrorAt("alerts.slack.api_url", "must end in \"/\" (slack-go appends the method name)"))
		}
	}
	if c.Alerts.Slack.Token != "" && c.Alerts.Slack.Channel == "" {
		add(c.ErrorAt("alerts.slack.channel", "required with alerts.slack.token"))
	}
	if w := c.Alerts.Slack.WebhookURL; w != "" {
		if pu, err := url.Parse(w.Reveal()); err != nil || (pu.Scheme != "http" && pu.Scheme != "https") || pu.Host == "" {
			add(c.ErrorAt("alerts.slack.webhook_url", "must be an http(s) URL"))
		}
	}

	errs = append(errs, validateInteractive(c)...)

	for _, name := range c.ToolNames() {
		t := c.Tools[name]
		base := "tools." + name
		if len(name) > 64 {
			add(c.ErrorAt(base, "tool name longer than 64 characters"))
		}
		floor := c.Retention.MinAge
		floorPath := "retention.min_age"
		if r, ok := c.Retention.Tools[name]; ok && r.MinAge > 0 {
			floor, floorPath = r.MinAge, "retention.tools."+name+".min_age"
		}
		if floor < t.ProcessingWindow+c.Reconcile.Grace {
			add(c.ErrorAt(floorPath, "retention floor %s is shorter than tool %s's processing window plus grace (%s): a key could be purged while its outcome is unknown", floor, name, t.ProcessingWindow+c.Reconcile.Grace))
		}
		if t.Probe != nil {
			errs = append(errs, validateProbe(c, base+".probe", t.Probe)...)
			// A probe must finish, and its decision be written, well
			// inside the lease, or another replica may take the key.
			if t.Probe.Timeout+config.Duration(2*time.Second) >= c.Reconcile.Lease/2 {
				add(c.ErrorAt(base+".probe.timeout", "probe timeout %s must be well under half of reconcile.lease (%s): raise the lease or shorten the timeout", t.Probe.Timeout, c.Reconcile.Lease))
			}
		}
	}
	for _, name := range slices.Sorted(maps.Keys(c.Retention.Tools)) {
		r := c.Retention.Tools[name]
		if _, ok := c.Tools[name]; !ok && r.MinAge < c.Defaults.ProcessingWindow+c.Reconcile.Grace {
			add(c.ErrorAt("retention.tools."+name+".min_age", "retention floor %s is shorter than the default processing window plus grace (%s)", r.MinAge, c.Defaults.ProcessingWindow+c.Reconcile.Grace))
		}
	}
	if len(errs) == 0 {
		return nil
	}
	errs.SortByLine()
	return errs
}

// validateProbe maps the probe package's judgement of one probe's settings
// (probes.CheckHTTPSettings, CheckSQLSettings, CheckAnswerSettings) to the
// file's keys, so that each error has the key's own line; BuildProbes then
// builds the probe (NewHTTP, NewSQL), which refuses the rest. What is
// config's own shape (the type, keys of the other type) is judged here.
func validateProbe(c *config.Config, base string, p *config.Probe) []*config.Error {
	var errs []*config.Error
	add := func(path, format string, args ...any) { errs = append(errs, c.ErrorAt(path, format, args...)) }
	notHTTP := func() {
		if p.NotFoundBody != nil {
			add(base+".not_found_body", "belongs to http probes (a 404's body)")
		}
		if p.NotFoundOn404 != "" {
			add(base+".not_found_on_404", "belongs to http probes")
		}
	}
	probe := func(err error) {
		fes, ok := fielderr.All(err)
		if !ok {
			add(base, "%v", err)
			return
		}
		for _, fe := range fes {
			add(base+"."+fe.Field, "%s", fe.Msg)
		}
	}
	switch p.Type {
	case "http":
		probe(probes.CheckHTTPSettings(probes.HTTPConfig{
			URL: p.URL, Method: p.Method, Timeout: p.Timeout.D(), Match: p.Match,
			ResponseCode: p.ResponseCode, ResponseBody: p.ResponseBody,
			NotFoundOn404: p.NotFoundOn404, NotFoundBody: notFoundBody(p),
		}))
		if p.Query != "" || p.DatabaseURL != "" || len(p.Args) > 0 {
			add(base, "query, database_url and args belong to sql probes")
		}
	case "sql":
		probe(probes.CheckSQLSettings(probes.SQLConfig{
			DatabaseURL: p.DatabaseURL.Reveal(), Query: p.Query, Args: p.Args, Timeout: p.Timeout.D(),
			ResponseCode: p.ResponseCode, ResponseBody: p.ResponseBody,
		}))
		if p.Match != "" {
			probe(probes.CheckAnswerSettings(p.Match, 0, nil))
		}
		if p.URL != "" || p.Match != "" || len(p.Headers) > 0 {
			add(base, "url, match and headers belong to http probes")
		}
		notHTTP()
	default:
		switch p.Type {
		case "go":
		case "":
			add(base+".type", "required: http, sql or go")
		default:
			add(base+".type", "unknown probe type %q (want http, sql or go)", p.Type)
		}
		if p.Timeout < 0 {
			add(base+".timeout", "must be positive")
		}
		probe(probes.CheckAnswerSettings(p.Match, p.ResponseCode, p.ResponseBody))
		notHTTP()
	}
	return errs
}

// notFoundBody is the probe's not_found_body for probes.HTTPConfig (nil:
// none).
func notFoundBody(p *config.Probe) *probes.NotFoundBody {
	if p.NotFoundBody == nil {
		return nil
	}
	return &probes.NotFoundBody{Path: p.NotFoundBody.Path, Equals: p.NotFoundBody.Equals}
}

// Warnings names the settings that are valid but dangerous, one line each
// with the key's file and line, for `config check`: each one lets a broken
// probe's not_found mark keys retryable whose effect happened.
func Warnings(c *config.Config) []string {
	var out []string
	warn := func(path, msg string) { out = append(out, c.ErrorAt(path, "%s", msg).Error()) }
	for _, name := range c.ToolNames() {
		p := c.Tools[name].Probe
		if p == nil {
			continue
		}
		base := "tools." + name + ".probe."
		if !p.SelfCheckEnabled() {
			warn(base+"self_check.enabled", "false: verdicts are acted on unchecked; a probe broken on day one would mark keys retryable whose effect happened (dangerous)")
		}
		if p.NotFoundOn404 == probes.NotFoundOn404Any {
			warn(base+"not_found_on_404", "any: every 404 counts as absence, even a router's or ingress's error page; only for an API whose 404s have no body")
		}
		if !p.WitnessRequired() {
			warn(base+"self_check.require_witness", "false: not_found verdicts are applied with no witness that the probe can find anything; a typo'd path answering 404 would mark keys retryable whose effect happened (dangerous)")
		}
	}
	return out
}

// PurgeConfig maps the retention section of the configuration onto the
// purger's Config, for `purge`, `serve` and Settle's validation.
func PurgeConfig(cfg *config.Config, actor string) expiry.Config {
	r := cfg.Retention
	c := expiry.Config{
		Alerts:        PurgeAlerts{},
		MinAge:        r.MinAge.D(),
		BatchSize:     r.BatchSize,
		BatchPause:    r.BatchPause.D(),
		MaxDuration:   r.MaxDuration.D(),
		DutyCycle:     r.DutyCycle,
		BatchTarget:   r.BatchTarget.D(),
		AuditMaxAge:   r.AuditMaxAge.D(),
		RenotifyAfter: cfg.Alerts.RenotifyAfter.D(),
		Actor:         actor,
	}
	for tool, t := range r.Tools {
		if t.MinAge > 0 {
			if c.ToolMinAge == nil {
				c.ToolMinAge = map[string]time.Duration{}
			}
			c.ToolMinAge[tool] = t.MinAge.D()
		}
	}
	return c
}
