package main

import (
	"context"
	"encoding/json"
	"fmt"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"

	"github.com/ledgerkeeper/ledgerkeeper/alerts"
	"github.com/ledgerkeeper/ledgerkeeper/internal/daemon"
	"github.com/ledgerkeeper/ledgerkeeper/ledger"
	"github.com/ledgerkeeper/ledgerkeeper/reconcile"
	"github.com/ledgerkeeper/ledgerkeeper/store"
)

// statusReport is `ledgerkeeper status`'s document.
type statusReport struct {
	At       time.Time           `json:"at"`
	Tools    []toolStatus        `json:"tools"`
	Holds    []store.Hold        `json:"holds"`
	Breakers []reconcile.Breaker `json:"circuit_breakers"`
	// ProbeChecks are the tools' stored probe self-checks.
	ProbeChecks []probeCheckStatus    `json:"probe_self_checks"`
	Alerts      alerts.DeliveryHealth `json:"alerts"`
	// WorkerAlerts are the firing alerts about Citus workers
	// (shards_unreachable, one per unreachable worker), which belong to no
	// tool; WorkerPendingAlerts counts the undelivered messages about
	// workers (raised or resolved): part of alerts.pending, in no tool's
	// pending_alerts.
	WorkerAlerts        []workerAlertStatus `json:"citus_worker_alerts"`
	WorkerPendingAlerts int                 `json:"citus_worker_pending_alerts"`
	LastRuns            []store.Run         `json:"last_runs"`
	Warnings            []string            `json:"warnings"`
	// Counts says which figures are estimates.
	Counts countsStatus `json:"counts"`
}

// countsStatus says how status counted: every figure is exact except the
// completed keys of tools marked completed_estimated, which come from
// PostgreSQL's planner statistics on a large ledger.
type countsStatus struct {
	// CompletedEstimated: at least one tool's completed figure is an
	// estimate.
	CompletedEstimated bool `json:"completed_estimated"`
	// Exact: --exact asked for every row to be counted.
	Exact bool `json:"exact"`
	// AnalyzedAt is when idempotency_keys' statistics were last gathered.
	AnalyzedAt *time.Time `json:"statistics_analyzed_at,omitempty"`
	// EstimatedKeys is the planner's estimate of the ledger's rows (-1:
	// never analyzed).
	EstimatedKeys int64 `json:"estimated_keys"`
}

type toolStatus struct {
	store.ToolStats
	Configured    bool    `json:"configured"`
	HasProbe      bool    `json:"has_probe"`
	WindowSeconds float64 `json:"processing_window_plus_grace_seconds"`
	P99Seconds    float64 `json:"observed_p99_processing_seconds,omitempty"`
	P99Samples    int     `json:"observed_samples,omitempty"`
	PendingAlerts int     `json:"pending_alerts"`
	// ProbeCheck is the outcome of the tool's stored self-check, if any.
	ProbeCheck string `json:"probe_self_check,omitempty"`
}

// workerAlertStatus is a Citus worker's firing alert, as `status` shows
// it: on a line of its own, since it is about no tool and no key.
type workerAlertStatus struct {
	// Node is the worker, "host:port".
	Node         string        `json:"node"`
	Reason       alerts.Reason `json:"reason"`
	FiringSince  time.Time     `json:"firing_since"`
	LastRaisedAt time.Time     `json:"last_raised_at"`
	// Delivery is that of the latest raise's message to Slack (delivered,
	// failing or pending); empty when the outbox no longer holds it.
	Delivery string `json:"delivery,omitempty"`
}

// probeCheckStatus is a tool's stored probe self-check, as `status` shows
// it.
type probeCheckStatus struct {
	Tool      string    `json:"tool"`
	Outcome   string    `json:"outcome"`
	CheckedAt time.Time `json:"checked_at"`
	Actor     string    `json:"actor"`
	Summary   string    `json:"summary"`
	// Blocking: the check is untrusted or inconclusive, so no key of the
	// tool changes state.
	Blocking bool `json:"blocking"`
	// PresentUnverified: no present-side sample (a key completed by its
	// tool server, a canary) came back found: the tool's not_found verdicts
	// are held unless require_witness is off.
	PresentUnverified bool `json:"present_unverified"`
	// Stale: the check is older than self_check.interval (a tool's pass
	// checks again before its next batch whatever this says).
	Stale bool `json:"stale,omitempty"`
	// Disagreements counts, since the tool's first check, completed keys
	// a trusted probe did not find as stored; DisagreeingKeys are those of
	// the latest check.
	Disagreements   int      `json:"disagreements"`
	DisagreeingKeys []string `json:"disagreeing_keys,omitempty"`
	// Failed lists the probes of the latest check that did not pass, when
	// it is blocking: which key, what came back.
	Failed []reconcile.SampleCheck `json:"failed,omitempty"`
	// ConfigChanged: the check was made with another probe configuration
	// than the one loaded now; the next pass checks again.
	ConfigChanged bool `json:"config_changed,omitempty"`
	// Disabled: tools.T.probe.self_check.enabled is false now.
	Disabled bool `json:"self_check_disabled,omitempty"`
}

// p99Since is the look-back of the processing-time check.
const p99Since = time.Hour

func newStatusCmd(a *app) *cobra.Command {
	var asJSON, exact bool
	cmd := &cobra.Command{
		Use:   "status",
		Short: "Stuck keys per tool, holds, breakers, pending alerts, last runs",
		Args:  args(cobra.NoArgs),
		RunE: func(cmd *cobra.Command, _ []string) error {
			ctx := cmd.Context()
			a.manyLedgers = true
			if err := a.load(); err != nil {
				return err
			}
			if a.all.Fleet() && a.cfg == a.all {
				return a.fleetStatus(ctx, exact, asJSON)
			}
			pool, err := a.ledgerPool(ctx)
			if err != nil {
				return err
			}
			defer pool.Close()
			st, err := a.statusOf(ctx, pool, exact)
			if err != nil {
				return err
			}
			if asJSON {
				return a.writeJSON(st)
			}
			printStatus(a, st)
			return nil
		},
	}
	cmd.Flags().BoolVar(&asJSON, "json", false, "print one JSON document")
	cmd.Flags().BoolVar(&exact, "exact", false, "count every completed key instead of estimating them on a large ledger (a scan of the whole table)")
	return cmd
}

// statusOf is status's report of the ledger a.cfg configures, on pool.
func (a *app) statusOf(ctx context.Context, pool *ledgerDB, exact bool) (statusReport, error) {
	st := statusReport{At: time.Now().UTC(), Warnings: []string{}}
	counts, err := store.StatsWith(ctx, pool, a.windows, store.StatsOptions{Exact: exact})
	if err != nil {
		return st, err
	}
	stats := counts.Tools
	st.Counts = countsStatus{CompletedEstimated: counts.Estimated, Exact: exact, AnalyzedAt: counts.AnalyzedAt, EstimatedKeys: counts.EstimatedKeys}
	lat, err := store.ProcessingP99(ctx, pool, p99Since)
	if err != nil {
		return st, err
	}
	pending, err := alerts.PendingByTool(ctx, pool)
	if err != nil {
		return st, err
	}
	// Messages about a Citus worker have no tool: PendingByTool counts
	// them under "", which no tool's line shows.
	st.WorkerPendingAlerts = pending[""]
	if st.WorkerAlerts, err = workerAlerts(ctx, pool); err != nil {
		return st, err
	}
	p99 := map[string]store.ToolLatency{}
	for _, l := range lat {
		p99[l.Tool] = l
	}
	for _, s := range stats {
		pol := a.cfg.Policy(s.Tool)
		win, _ := a.windows(s.Tool)
		ts := toolStatus{ToolStats: s, Configured: pol.Configured, HasProbe: pol.Probe != nil, WindowSeconds: win.Seconds(), PendingAlerts: pending[s.Tool]}
		if l, ok := p99[s.Tool]; ok {
			ts.P99Seconds, ts.P99Samples = l.P99Seconds, l.Samples
			if l.Samples >= 20 && l.P99Seconds > pol.ProcessingWindow.Seconds() {
				st.Warnings = append(st.Warnings, fmt.Sprintf("%s: observed p99 processing time %.1fs exceeds its processing_window %s: live attempts risk being probed; raise tools.%s.processing_window (and the clients' retry deadline above it)",
					s.Tool, l.P99Seconds, pol.ProcessingWindow, s.Tool))
			}
		}
		if !pol.Configured && s.Stuck > 0 {
			st.Warnings = append(st.Warnings, fmt.Sprintf("%s: %d stuck key(s) of a tool absent from the configuration: no probe, alerted only", s.Tool, s.Stuck))
		}
		st.Tools = append(st.Tools, ts)
	}
	if st.Holds, err = store.ListHolds(ctx, pool); err != nil {
		return st, err
	}
	if st.Breakers, err = reconcile.Breakers(ctx, pool); err != nil {
		return st, err
	}
	if st.ProbeChecks, err = a.probeChecks(ctx, pool); err != nil {
		return st, err
	}
	checkOf := map[string]string{}
	for _, c := range st.ProbeChecks {
		checkOf[c.Tool] = c.Outcome
		switch {
		case c.Disabled:
		case c.Outcome == reconcile.CheckUntrusted:
			st.Warnings = append(st.Warnings, fmt.Sprintf("%s: probe untrusted: no key of this tool changes state (self-check %s); see runbook.md#probe_untrusted, then 'ledgerkeeper probe check --tool %s'",
				c.Tool, c.Summary, c.Tool))
		case c.Outcome == reconcile.CheckInconclusive:
			st.Warnings = append(st.Warnings, fmt.Sprintf("%s: probe self-check inconclusive: the downstream did not answer; no key of this tool changes state until it does (%s)", c.Tool, c.Summary))
		}
	}
	for i := range st.Tools {
		st.Tools[i].ProbeCheck = checkOf[st.Tools[i].Tool]
	}
	if st.Alerts, err = alerts.Health(ctx, pool); err != nil {
		return st, err
	}
	if st.Alerts.Permanent > 0 {
		st.Warnings = append(st.Warnings, "alert delivery is failing permanently: "+st.Alerts.LastError+" (fix alerts.slack; pending alerts are kept)")
	}
	if st.LastRuns, err = store.LastRuns(ctx, pool); err != nil {
		return st, err
	}
	return st, nil
}

func printStatus(a *app, st statusReport) {
	w := a.stdout
	fmt.Fprintf(w, "ledgerkeeper status at %s\n\n", ts(st.At))
	for _, c := range st.ProbeChecks {
		if c.Outcome == reconcile.CheckUntrusted && !c.Disabled {
			fmt.Fprintf(w, "!! %s: probe untrusted: no key of this tool changes state (checked %s). Run 'ledgerkeeper probe check --tool %s'; see runbook.md#probe_untrusted.\n\n",
				c.Tool, ts(c.CheckedAt), c.Tool)
		}
	}
	if len(st.Tools) == 0 {
		fmt.Fprintln(w, "The ledger is empty.")
	} else {
		tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
		fmt.Fprintln(tw, "TOOL\tIN FLIGHT\tSTUCK\tOLDEST STUCK\tFAILED_RETRYABLE\tCOMPLETED\tHELD\tALERTS PENDING\tWINDOW+GRACE\tP99 (1h)\tPROBE")
		for _, t := range st.Tools {
			oldest := "-"
			if t.OldestStuckClaimedAt != nil {
				oldest = (time.Duration(t.OldestStuckAgeSeconds) * time.Second).String()
			}
			p99 := "-"
			if t.P99Samples > 0 {
				p99 = fmt.Sprintf("%.1fs", t.P99Seconds)
			}
			probe := "yes"
			switch {
			case !t.Configured:
				probe = "not configured"
			case !t.HasProbe:
				probe = "none"
			case t.ProbeCheck != "":
				probe = "yes, " + t.ProbeCheck
				if t.ProbeCheck == reconcile.CheckUntrusted {
					probe = "yes, UNTRUSTED"
				}
			}
			completed := strconv.Itoa(t.Completed)
			if t.CompletedEstimated {
				completed = "~" + completed
			}
			fmt.Fprintf(tw, "%s\t%d\t%d\t%s\t%d\t%s\t%d\t%d\t%s\t%s\t%s\n", t.Tool, t.InWindow, t.Stuck, oldest, t.FailedRetryable,
				completed, t.Held, t.PendingAlerts, time.Duration(t.WindowSeconds*float64(time.Second)), p99, probe)
		}
		tw.Flush()
		if st.Counts.CompletedEstimated {
			analyzed := "never"
			if st.Counts.AnalyzedAt != nil {
				analyzed = ts(*st.Counts.AnalyzedAt)
			}
			fmt.Fprintf(w, "~ estimated from PostgreSQL's statistics (idempotency_keys last analyzed %s); every other figure is exact. 'status --exact' counts every row (a scan of the whole ledger).\n", analyzed)
		}
	}
	fmt.Fprintf(w, "\nHolds: %d\n", len(st.Holds))
	for _, h := range st.Holds {
		where := "(" + h.Tool + ", " + h.Status + ")"
		if h.Status == "" {
			// A hold outlives its row (purge never deletes a held key,
			// but a row deleted by hand leaves the hold behind).
			where = "(no such key in the ledger: release the hold)"
		}
		fmt.Fprintf(w, "  %s %s held by %s since %s: %s\n", h.Key, where, h.Actor, ts(h.CreatedAt), h.Reason)
	}
	if len(st.Breakers) > 0 {
		fmt.Fprintln(w, "\nCircuit breakers:")
		for _, b := range st.Breakers {
			state := "half-open (probing again)"
			if b.Open && b.OpenUntil != nil {
				state = "open until " + ts(*b.OpenUntil)
			}
			fmt.Fprintf(w, "  %s: %s after %d opening(s); last error: %s\n", b.Tool, state, b.Opens, oneLine(b.LastError, 120))
		}
	}
	if len(st.ProbeChecks) > 0 {
		fmt.Fprintln(w, "\nProbe self-checks:")
		for _, c := range st.ProbeChecks {
			fmt.Fprintf(w, "  %s: %s at %s by %s (%s ago): %s\n", c.Tool, c.Outcome, ts(c.CheckedAt), c.Actor,
				time.Since(c.CheckedAt).Round(time.Second), oneLine(c.Summary, 200))
			if c.Blocking && !c.Disabled {
				fmt.Fprintln(w, "    no key of this tool changes state until a check passes (the next pass checks again)")
				for _, f := range c.Failed {
					line := fmt.Sprintf("    %s (want %s): got %s", f.Key, f.Expect, f.Verdict)
					if len(f.Mismatched) > 0 {
						line += ", fields differ from the stored outcome: " + strings.Join(f.Mismatched, ", ")
					}
					if f.Error != "" {
						line += ": " + oneLine(f.Error, 160)
					}
					fmt.Fprintln(w, line)
				}
			}
			if c.PresentUnverified {
				fmt.Fprintln(w, "    present side unverified: no completed key or canary came back found; not_found verdicts are held (add a canary: ledgerkeeper probe canary add)")
			}
			if c.Stale {
				fmt.Fprintln(w, "    stale: older than self_check.interval (no key of this tool was due since; every batch is checked afresh)")
			}
			if c.Disagreements > 0 {
				fmt.Fprintf(w, "    %d disagreement(s) since the first check: a completed key the probe did not find as stored (deleted or changed downstream?)", c.Disagreements)
				if len(c.DisagreeingKeys) > 0 {
					fmt.Fprintf(w, "; latest: %s: inspect with 'ledgerkeeper probe run KEY'", strings.Join(c.DisagreeingKeys, ", "))
				}
				fmt.Fprintln(w)
			}
			if c.ConfigChanged {
				fmt.Fprintln(w, "    made with another probe configuration than the one loaded: the next pass checks again")
			}
			if c.Disabled {
				fmt.Fprintln(w, "    self-check disabled (tools."+c.Tool+".probe.self_check.enabled: false): verdicts are acted on unchecked")
			}
		}
	}
	al := st.Alerts
	fmt.Fprintf(w, "\nAlerts: %d pending", al.Pending)
	if al.Pending > 0 {
		fmt.Fprintf(w, " (oldest %s)", (time.Duration(al.OldestPendingAge) * time.Second).String())
	}
	fmt.Fprintln(w)
	if st.WorkerPendingAlerts > 0 {
		fmt.Fprintf(w, "  %d of them about Citus workers (in no tool's ALERTS PENDING)\n", st.WorkerPendingAlerts)
	}
	for _, n := range st.WorkerAlerts {
		msg := "its message " + n.Delivery
		if n.Delivery == "" {
			msg = "its message no longer in the outbox"
		}
		fmt.Fprintf(w, "  Citus worker %s: %s firing since %s, %s; the keys on its shards are not decided until it answers (runbook.md#%s)\n",
			n.Node, n.Reason, ts(n.FiringSince), msg, n.Reason)
	}
	if al.LastError != "" {
		fmt.Fprintf(w, "  last delivery error (%s): %s\n", al.LastErrorClass, oneLine(al.LastError, 160))
	}
	if al.RateLimitedUntil != nil {
		fmt.Fprintf(w, "  Slack rate-limited delivery: nothing is posted before %s (its Retry-After)\n", ts(*al.RateLimitedUntil))
	}
	if al.NextPermanentRetryAt != nil {
		fmt.Fprintf(w, "  Slack refuses the alerts (see the error above); a running serve tries again at %s\n", ts(*al.NextPermanentRetryAt))
	}
	fmt.Fprintln(w, "\nLast runs:")
	if len(st.LastRuns) == 0 {
		fmt.Fprintln(w, "  none yet")
	}
	for _, r := range st.LastRuns {
		res := "ok"
		var stats struct {
			Stopped bool `json:"stopped"`
		}
		if json.Unmarshal(r.Stats, &stats) == nil && stats.Stopped {
			res = "stopped (graceful: decisions in flight written)"
		}
		if r.Error != "" {
			res = "error: " + oneLine(r.Error, 100)
		}
		fmt.Fprintf(w, "  %-9s %s by %s (%s ago): %s %s\n", r.Kind, ts(r.FinishedAt), r.Actor, time.Since(r.FinishedAt).Round(time.Second), res, oneLine(string(r.Stats), 120))
	}
	if len(st.Warnings) > 0 {
		fmt.Fprintln(w, "\nWarnings:")
		for _, m := range st.Warnings {
			fmt.Fprintln(w, "  - "+m)
		}
	}
}

// workerBatch is how many firing alerts workerAlerts reads at a time.
const workerBatch = 100

// workerAlerts reads the firing alerts about Citus workers, a batch at a
// time. Their subjects (node:HOST:PORT, alerts.FiringAlert) sort together
// between the keys' and the tools' (k < n < t in any collation), so the
// pages start at "node:" and stop at the first alert about something else:
// a page per workerBatch unreachable workers, whatever the number of keys'
// alerts.
func workerAlerts(ctx context.Context, db alerts.DBTX) ([]workerAlertStatus, error) {
	out := []workerAlertStatus{}
	after, afterReason := "node:", alerts.Reason("")
	for {
		page, err := alerts.FiringAfter(ctx, db, after, afterReason, workerBatch)
		if err != nil {
			return nil, err
		}
		for _, a := range page {
			if a.Node == "" {
				return out, nil
			}
			n := workerAlertStatus{Node: a.Node, Reason: a.Reason, FiringSince: a.FirstRaisedAt, LastRaisedAt: a.LastRaisedAt}
			if a.Message != nil {
				n.Delivery = a.Message.Delivery()
			}
			out = append(out, n)
		}
		if len(page) < workerBatch {
			return out, nil
		}
		last := page[len(page)-1]
		after, afterReason = last.Subject, last.Reason
	}
}

// probeChecks reads the stored self-checks and compares each with the
// probe configuration loaded now.
func (a *app) probeChecks(ctx context.Context, db ledger.DBTX) ([]probeCheckStatus, error) {
	checks, err := reconcile.StoredChecks(ctx, db)
	if err != nil {
		return nil, err
	}
	current := daemon.EngineConfig(a.cfg, nil, "status").Tools
	out := make([]probeCheckStatus, 0, len(checks))
	for _, c := range checks {
		pc := probeCheckStatus{Tool: c.Tool, Outcome: c.Outcome, CheckedAt: c.CheckedAt, Actor: c.Actor, Summary: c.Summary,
			Blocking: !c.Trusted(), PresentUnverified: c.PresentUnverified, Disagreements: c.Disagreements,
			Stale: time.Since(c.CheckedAt) > a.cfg.SelfCheck.Interval}
		for _, s := range append([]reconcile.SampleCheck{c.Absent}, c.Samples...) {
			switch {
			case s.Passed:
			case pc.Blocking:
				pc.Failed = append(pc.Failed, s)
			case s.Expect == "found" && !s.Unreachable:
				pc.DisagreeingKeys = append(pc.DisagreeingKeys, s.Key)
			}
		}
		if pol, ok := current[c.Tool]; ok {
			pc.ConfigChanged = pol.ProbeFingerprint != c.Fingerprint
			pc.Disabled = pol.SelfCheckDisabled
		}
		out = append(out, pc)
	}
	return out, nil
}
