package reconcile

import (
	"encoding/json"
	"log/slog"
	"maps"
	"slices"
	"time"

	"github.com/ledgerkeeper/ledgerkeeper/store"
)

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
	Actor     string        `json:"actor"`
	DryRun    bool          `json:"dry_run"`
	StartedAt time.Time     `json:"started_at"`
	Duration  time.Duration `json:"duration_ns"`
	// Actions counts every decision of the pass by action.
	Actions map[string]int `json:"actions"`
	Tools   []ToolReport   `json:"tools"`
	// Decided counts the keys decided (or whose write failed).
	Decided int `json:"decided"`
	// Keys lists the first Config.ReportKeys of them; KeysOmitted says how
	// many more there were.
	Keys        []KeyResult `json:"keys"`
	KeysOmitted int         `json:"keys_omitted"`
	// OutOfTime: the pass stopped leasing keys when it reached
	// Config.MaxDuration; what was left is due for the next pass.
	OutOfTime bool `json:"out_of_time,omitempty"`
	// Stopped: the pass was asked to stop (Options.Stop, or ctx
	// cancelled) before it ran out of due keys; what was left is due for
	// the next pass. A stop is not a failure.
	Stopped bool `json:"stopped,omitempty"`
	// Skipped lists --key arguments that were not reconciled, and why.
	Skipped []KeyResult `json:"skipped,omitempty"`
	// AlertsRaised counts alerts written to the outbox.
	AlertsRaised int `json:"alerts_raised"`
	// ResolvedAlerts counts every alert the pass resolved: keys settled
	// elsewhere (the sweep), keys it decided, breakers it closed, probes
	// that passed their self-check again.
	ResolvedAlerts int `json:"resolved_alerts"`
	// Withheld counts keys probed whose verdict was not applied (their
	// batch's closing self-check was not trusted, or a not_found had no
	// present-side witness): given back untouched, due again.
	Withheld int `json:"withheld"`
	// GivenBack counts the keys leased and given back without a verdict
	// (each once): their probe never started or was cut short (the pass
	// stopping, the tool paused, too little lease left). No attempt is
	// counted; they are due again at once (a paused tool's keys may be
	// taken again, and decided, later in the same pass).
	GivenBack int `json:"given_back"`
	// UnreachableShards lists the shards of a Citus ledger the pass could
	// not read (their worker did not answer): their keys were left as
	// they are, and one alert per worker was raised.
	UnreachableShards []store.ShardFault `json:"unreachable_shards,omitempty"`
}

// countGivenBack counts keys given back without a verdict, each once
// however often the pass leased and gave it back (a stopping pass may
// lease a key it just released, only to release it again).
func (p *pass) countGivenBack(keys ...string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.givenBack == nil {
		p.givenBack = map[string]struct{}{}
	}
	for _, k := range keys {
		p.givenBack[k] = struct{}{}
	}
	p.report.GivenBack = len(p.givenBack)
}

// add lists a decided key (or one whose write failed) and counts it.
func (p *pass) add(r KeyResult) { p.list(r, false) }

// addWithheld lists a key whose verdict was withheld (bracket.go): counted
// by action, not as a decision.
func (p *pass) addWithheld(r KeyResult) { p.list(r, true) }

func (p *pass) list(r KeyResult, withheld bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	// A pass over a huge backlog keeps counting but stops listing: its
	// memory stays flat whatever the number of keys.
	if len(p.report.Keys) < p.e.cfg.ReportKeys {
		p.report.Keys = append(p.report.Keys, r)
	} else {
		p.report.KeysOmitted++
	}
	if withheld {
		p.report.Withheld++
	} else {
		p.report.Decided++
		p.report.AlertsRaised += len(r.Alerts)
	}
	p.report.Actions[r.Action]++
	if p.e.metrics != nil {
		p.e.metrics.observeDecision(r.Tool, r.Action)
	}
}

// countAlerts adds alerts raised and resolved outside a key's decision (a
// self-check, a breaker) to the pass's counts.
func (p *pass) countAlerts(raised, resolved int) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.report.AlertsRaised += raised
	p.report.ResolvedAlerts += resolved
}

// LogAttrs are the pass's counts as slog attributes, for the one Info line
// serve logs per pass: keys decided, actions as a group (text logs read
// actions.completed=2, JSON logs an object; never a Go map), alerts raised
// and resolved, duration (a time.Duration, to the millisecond: the
// daemon's JSON handler writes it in seconds, its text handler as "93ms"), and
// withheld, given_back, out_of_time and stopped when they happened (a
// stopped pass that gave back its keys says how many: keys=0 alone would
// read as an idle pass).
func (r Report) LogAttrs() []any {
	actions := make([]any, 0, 2*len(r.Actions))
	for _, a := range slices.Sorted(maps.Keys(r.Actions)) {
		actions = append(actions, slog.Int(a, r.Actions[a]))
	}
	attrs := []any{
		slog.Int("keys", r.Decided),
		slog.Group("actions", actions...),
		slog.Int("alerts_raised", r.AlertsRaised),
		slog.Int("resolved_alerts", r.ResolvedAlerts),
		slog.Duration("duration", r.Duration.Round(time.Millisecond)),
	}
	if r.Withheld > 0 {
		attrs = append(attrs, slog.Int("withheld", r.Withheld))
	}
	if r.GivenBack > 0 {
		attrs = append(attrs, slog.Int("given_back", r.GivenBack))
	}
	if r.OutOfTime {
		attrs = append(attrs, slog.Bool("out_of_time", true))
	}
	if r.Stopped {
		attrs = append(attrs, slog.Bool("stopped", true))
	}
	return attrs
}
