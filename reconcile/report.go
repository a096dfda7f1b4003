package reconcile

import (
	"encoding/json"
	"time"
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
