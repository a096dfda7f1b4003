package main

import (
	"fmt"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"

	"github.com/ledgerkeeper/ledgerkeeper/alerts"
	"github.com/ledgerkeeper/ledgerkeeper/ledger"
	"github.com/ledgerkeeper/ledgerkeeper/reconcile"
)

// statusReport is `ledgerkeeper status`'s document.
type statusReport struct {
	At       time.Time             `json:"at"`
	Tools    []toolStatus          `json:"tools"`
	Holds    []ledger.Hold         `json:"holds"`
	Breakers []reconcile.Breaker   `json:"circuit_breakers"`
	Alerts   alerts.DeliveryHealth `json:"alerts"`
	LastRuns []ledger.Run          `json:"last_runs"`
	Warnings []string              `json:"warnings"`
}

type toolStatus struct {
	ledger.ToolStats
	Configured    bool    `json:"configured"`
	HasProbe      bool    `json:"has_probe"`
	WindowSeconds float64 `json:"processing_window_plus_grace_seconds"`
	P99Seconds    float64 `json:"observed_p99_processing_seconds,omitempty"`
	P99Samples    int     `json:"observed_samples,omitempty"`
	PendingAlerts int     `json:"pending_alerts"`
}

// p99Since is the look-back of the processing-time check.
const p99Since = time.Hour

func newStatusCmd(a *app) *cobra.Command {
	var asJSON bool
	cmd := &cobra.Command{
		Use:   "status",
		Short: "Stuck keys per tool, holds, breakers, pending alerts, last runs",
		Args:  args(cobra.NoArgs),
		RunE: func(cmd *cobra.Command, _ []string) error {
			ctx := cmd.Context()
			pool, err := a.ledgerPool(ctx)
			if err != nil {
				return err
			}
			defer pool.Close()
			st := statusReport{At: time.Now().UTC(), Warnings: []string{}}
			stats, err := ledger.Stats(ctx, pool, a.windows)
			if err != nil {
				return err
			}
			lat, err := ledger.ProcessingP99(ctx, pool, p99Since)
			if err != nil {
				return err
			}
			pending, err := alerts.PendingByTool(ctx, pool)
			if err != nil {
				return err
			}
			p99 := map[string]ledger.ToolLatency{}
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
			if st.Holds, err = ledger.ListHolds(ctx, pool); err != nil {
				return err
			}
			if st.Breakers, err = reconcile.Breakers(ctx, pool); err != nil {
				return err
			}
			if st.Alerts, err = alerts.Health(ctx, pool); err != nil {
				return err
			}
			if st.Alerts.Permanent > 0 {
				st.Warnings = append(st.Warnings, "alert delivery is failing permanently: "+st.Alerts.LastError+" (fix alerts.slack; pending alerts are kept)")
			}
			if st.LastRuns, err = ledger.LastRuns(ctx, pool); err != nil {
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
	return cmd
}

func printStatus(a *app, st statusReport) {
	w := a.stdout
	fmt.Fprintf(w, "ledgerkeeper status at %s\n\n", ts(st.At))
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
			}
			fmt.Fprintf(tw, "%s\t%d\t%d\t%s\t%d\t%d\t%d\t%d\t%s\t%s\t%s\n", t.Tool, t.InWindow, t.Stuck, oldest, t.FailedRetryable,
				t.Completed, t.Held, t.PendingAlerts, time.Duration(t.WindowSeconds*float64(time.Second)), p99, probe)
		}
		tw.Flush()
	}
	fmt.Fprintf(w, "\nHolds: %d\n", len(st.Holds))
	for _, h := range st.Holds {
		fmt.Fprintf(w, "  %s (%s, %s) held by %s since %s: %s\n", h.Key, h.Tool, h.Status, h.Actor, ts(h.CreatedAt), h.Reason)
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
	al := st.Alerts
	fmt.Fprintf(w, "\nAlerts: %d pending", al.Pending)
	if al.Pending > 0 {
		fmt.Fprintf(w, " (oldest %s)", (time.Duration(al.OldestPendingAge) * time.Second).String())
	}
	fmt.Fprintln(w)
	if al.LastError != "" {
		fmt.Fprintf(w, "  last delivery error (%s): %s\n", al.LastErrorClass, oneLine(al.LastError, 160))
	}
	fmt.Fprintln(w, "\nLast runs:")
	if len(st.LastRuns) == 0 {
		fmt.Fprintln(w, "  none yet")
	}
	for _, r := range st.LastRuns {
		res := "ok"
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
