package daemon

import (
	"cmp"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strings"
	"time"

	"github.com/ledgerkeeper/ledgerkeeper/alerts"
	"github.com/ledgerkeeper/ledgerkeeper/expiry"
	"github.com/ledgerkeeper/ledgerkeeper/internal/config"
	"github.com/ledgerkeeper/ledgerkeeper/internal/fielderr"
	"github.com/ledgerkeeper/ledgerkeeper/internal/settings"
	"github.com/ledgerkeeper/ledgerkeeper/probes"
	"github.com/ledgerkeeper/ledgerkeeper/reconcile"
)

// Settle makes a decoded configuration ready to run: it fills every zero
// setting with its default, then validates it. Both come from the
// settings' own declarations: each field's `default`, `min`, `max` and
// `oneof` tags and its struct's CheckSettings (internal/settings; the
// reconcile section is reconcile.Config, self_check reconcile.SelfCheckConfig,
// retention expiry.Config), their refusals mapped back to `file:line: key`.
// What is left here is what involves two sections or the probes' own
// judgement (a probe's timeout against the lease, a retention floor
// against a tool's processing window, the probe blocks, Slack actions).
// Every problem is reported, as config.Errors sorted by line. Nothing
// connects.
func Settle(cfg *config.Config) error {
	applyDefaults(cfg)
	err := validate(cfg)
	if !cfg.Fleet() {
		return err
	}
	// Each ledger's configuration is settled on its own; its errors name
	// their keys under ledgers.NAME (or say the ledger inherits them).
	errs := []error{err}
	for _, l := range cfg.Ledgers() {
		ownPool := l.Database.MaxConns == 0
		applyDefaults(l.Config)
		if ownPool {
			l.Database.MaxConns = FleetLedgerConns(l.Reconcile.Concurrency)
		}
		errs = append(errs, validate(l.Config))
	}
	return joinConfigErrors(errs...)
}

// joinConfigErrors is the errors' config.Errors in line order, nil when
// there are none; an error of another type is returned as it is.
func joinConfigErrors(errs ...error) error {
	var all config.Errors
	for _, err := range errs {
		if err == nil {
			continue
		}
		var ce config.Errors
		var one *config.Error
		switch {
		case errors.As(err, &ce):
			all = append(all, ce...)
		case errors.As(err, &one):
			all = append(all, one)
		default:
			return err
		}
	}
	if len(all) == 0 {
		return nil
	}
	// A top-level setting every ledger inherits is reported once.
	seen := map[string]bool{}
	kept := all[:0]
	for _, e := range all {
		k := fmt.Sprintf("%d\x00%s", e.Line, e.Msg)
		if !seen[k] {
			seen[k] = true
			kept = append(kept, e)
		}
	}
	kept.SortByLine()
	return kept
}

// applyDefaults fills the tags' defaults (settings.ApplyDefaults), then
// the settings whose default is another setting, or a constant of the
// service that reads them.
func applyDefaults(c *config.Config) {
	settings.ApplyDefaults(c)
	c.Defaults.ProcessingWindow = orDur(c.Defaults.ProcessingWindow, reconcile.DefaultProcessingWindow)
	c.Defaults.HeartbeatTimeout = orDur(c.Defaults.HeartbeatTimeout, c.Defaults.ProcessingWindow.D())
	for name, t := range c.Tools {
		t.ProcessingWindow = orDur(t.ProcessingWindow, c.Defaults.ProcessingWindow.D())
		t.HeartbeatTimeout = orDur(t.HeartbeatTimeout, t.ProcessingWindow.D())
		t.Concurrency = cmp.Or(t.Concurrency, c.Reconcile.Concurrency)
		if t.Probe != nil {
			t.Probe.Timeout = orDur(t.Probe.Timeout, probes.DefaultTimeout)
			// config check prints what is in force, never "self_check: {}".
			t.Probe.SelfCheck.Enabled = cmp.Or(t.Probe.SelfCheck.Enabled, ptr(true))
			t.Probe.SelfCheck.RequireWitness = cmp.Or(t.Probe.SelfCheck.RequireWitness, ptr(true))
			if t.Probe.Type == "http" {
				t.Probe.Method = cmp.Or(strings.ToUpper(t.Probe.Method), "GET")
				t.Probe.NotFoundOn404 = cmp.Or(t.Probe.NotFoundOn404, probes.NotFoundOn404JSON)
				t.Probe.MaxBodyBytes = cmp.Or(t.Probe.MaxBodyBytes, probes.DefaultMaxBodyBytes)
			}
		}
		c.Tools[name] = t
	}
	// reconcile raises with it, expiry too: one default, the engine's.
	c.Alerts.RenotifyAfter = orDur(c.Alerts.RenotifyAfter, c.Reconcile.RenotifyAfter)
	c.Alerts.MaxKeysPerMessage = cmp.Or(c.Alerts.MaxKeysPerMessage, alerts.DefaultMaxKeysPerMessage)
	c.Alerts.Slack.Timeout = orDur(c.Alerts.Slack.Timeout, alerts.DefaultSlackTimeout)
	c.HTTP.Console.Enabled = cmp.Or(c.HTTP.Console.Enabled, ptr(true))
	if c.Database.MaxConns == 0 {
		c.Database.MaxConns = c.Reconcile.Concurrency + 4
	}
}

// FleetLedgerConns is the default size of a fleet ledger's own pool: a
// connection for each of its decision writers, one for its leases and
// one for everything else (purge, alerts, gauges, the console), which
// waits its turn. A ledger's statements stay on few connections, where
// their plans are reused (BENCHMARKS.md, "Many ledgers in one process").
func FleetLedgerConns(concurrency int) int {
	return reconcile.WriterCount(concurrency) + 2
}

func ptr[T any](v T) *T { return &v }

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
	// Every section's own rules, declared beside its fields.
	for _, fe := range settings.Check(c) {
		add(c.ErrorAt(fe.Field, "%s", fe.Msg))
	}

	errs = append(errs, validateInteractive(c)...)
	errs = append(errs, validateConsole(c)...)

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
		if window := t.ProcessingWindow.D() + c.Reconcile.Grace; floor < window {
			add(c.ErrorAt(floorPath, "retention floor %s is shorter than tool %s's processing window plus grace (%s): a key could be purged while its outcome is unknown", floor, name, window))
		}
		if t.Probe != nil {
			errs = append(errs, validateProbe(c, base+".probe", t.Probe)...)
			// A probe must finish, and its decision be written, well
			// inside the lease, or another replica may take the key.
			if t.Probe.Timeout.D()+2*time.Second >= c.Reconcile.Lease/2 {
				add(c.ErrorAt(base+".probe.timeout", "probe timeout %s must be well under half of reconcile.lease (%s): raise the lease or shorten the timeout", t.Probe.Timeout, c.Reconcile.Lease))
			}
		}
	}
	for _, name := range slices.Sorted(maps.Keys(c.Retention.Tools)) {
		r := c.Retention.Tools[name]
		if window := c.Defaults.ProcessingWindow.D() + c.Reconcile.Grace; !hasTool(c, name) && r.MinAge < window {
			add(c.ErrorAt("retention.tools."+name+".min_age", "retention floor %s is shorter than the default processing window plus grace (%s)", r.MinAge, window))
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
	return append(out, consoleWarnings(c)...)
}

func hasTool(c *config.Config, name string) bool { _, ok := c.Tools[name]; return ok }

// PurgeConfig is the purger's Config: the retention section as decoded,
// plus what comes from elsewhere (alerts.renotify_after, the actor, the
// alert tables' implementation), for `purge`, `serve` and lkbench.
func PurgeConfig(cfg *config.Config, actor string) expiry.Config {
	c := cfg.Retention
	c.Alerts = PurgeAlerts{}
	c.RenotifyAfter = cfg.Alerts.RenotifyAfter.D()
	c.Actor = actor
	return c
}
