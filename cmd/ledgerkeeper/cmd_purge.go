package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"maps"
	"slices"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"

	"github.com/ledgerkeeper/ledgerkeeper/expiry"
	"github.com/ledgerkeeper/ledgerkeeper/internal/daemon"
)

func newPurgeCmd(a *app) *cobra.Command {
	var dryRun, asJSON, noAlerts bool
	cmd := &cobra.Command{
		Use:   "purge [--dry-run] [--json] [--no-alerts]",
		Short: "Run one purge pass now: delete expired keys, gently",
		Long: `Run one purge pass now. A key is deleted when it is completed or
failed_retryable, past its expires_at, older than its retention floor
(retention.min_age, or retention.tools.<tool>.min_age) and not on hold. Keys
still processing are never deleted, however old: each expired one is alerted
once (expired_processing) so that someone resolves it.

The pass deletes in small batches, each its own short transaction, and
pauses between them so that the tool servers writing to the ledger do not
notice (retention.duty_cycle, batch_size, batch_target, batch_pause); it
stops when retention.max_duration is spent and the next pass carries on. It
also trims ledgerkeeper's own tables (audit rows, sent alerts, resolved alert
state, run records) older than retention.audit_max_age.

One purge runs at a time across every replica and operator: if another is
running, this one says so and exits 0. Stopping it (Ctrl-C) or losing the
database mid-run loses nothing: finished batches stay deleted, the rest
waits for the next pass.

--dry-run counts what would go and what is kept and why; it deletes nothing
and raises nothing. --no-alerts leaves the alerts this pass raises in the
outbox for 'serve' to deliver.`,
		Args: args(cobra.NoArgs),
		RunE: func(cmd *cobra.Command, _ []string) error {
			ctx := cmd.Context()
			pool, err := a.ledgerPool(ctx)
			if err != nil {
				return err
			}
			defer pool.Close()
			p := expiry.New(daemon.PurgeConfig(a.cfg, actor("")), pool, a.logger.With("component", "purge"), nil)
			if dryRun {
				rep, err := p.DryRun(ctx)
				if err != nil {
					return fmt.Errorf("purge dry run: %w", err)
				}
				if asJSON {
					return a.writeJSON(rep)
				}
				printDryRun(a.stdout, rep, p.Config())
				return nil
			}
			rep, runErr := p.RunOnce(ctx)
			if !noAlerts && runErr == nil && !rep.AlreadyRunning {
				// Delivers what this pass raised and anything still pending;
				// a failure leaves the alerts in the outbox.
				a.deliverAlerts(ctx, pool)
			}
			if asJSON {
				if err := a.writeJSON(rep); err != nil {
					return err
				}
			} else {
				printPurge(a.stdout, rep)
			}
			if runErr != nil {
				done := fmt.Sprintf("after deleting %d key(s) in %d batch(es)", rep.KeysDeleted, rep.Batches)
				if errors.Is(runErr, context.Canceled) {
					return fmt.Errorf("purge interrupted %s; nothing half-done is lost (each batch is its own transaction): run it again to carry on", done)
				}
				return fmt.Errorf("purge stopped %s: %w; nothing half-done is lost (each batch is its own transaction): run it again to carry on", done, runErr)
			}
			return nil
		},
	}
	f := cmd.Flags()
	f.BoolVar(&dryRun, "dry-run", false, "report what would be deleted and alerted; delete nothing")
	f.BoolVar(&asJSON, "json", false, "print one JSON document")
	f.BoolVar(&noAlerts, "no-alerts", false, "leave raised alerts in the outbox for 'serve' to deliver")
	return cmd
}

func printPurge(w io.Writer, rep expiry.Report) {
	if rep.AlreadyRunning {
		fmt.Fprintln(w, "Another purge is already running (on a replica or by another operator); this one did nothing. Try again when it is done.")
		return
	}
	dur := rep.Duration.Round(time.Millisecond)
	switch {
	case rep.KeysDeleted == 0 && rep.Error == "":
		fmt.Fprintf(w, "Nothing to purge: no key is both expired and past its retention floor (checked in %s).\n", dur)
	case rep.Error != "":
		fmt.Fprintf(w, "Purge stopped early after deleting %s expired key(s) in %s.\n", purgeCount(rep.KeysDeleted), dur)
	default:
		fmt.Fprintf(w, "Purged %s expired key(s) in %s (%s rows/s, %d batches).\n",
			purgeCount(rep.KeysDeleted), dur, purgeCount(int64(rep.RowsPerSecond)), rep.Batches)
	}
	if rep.BudgetExhausted {
		fmt.Fprintf(w, "The time budget (retention.max_duration = %s) ran out before everything was purged; the next pass carries on.\n",
			purgeDuration(time.Duration(rep.BudgetSeconds*float64(time.Second))))
	}
	if rep.TimedOutBatches > 0 {
		fmt.Fprintf(w, "%d batch(es) hit the statement timeout and were retried smaller: the database is slow or busy.\n", rep.TimedOutBatches)
	}
	if rep.ExpiredProcessing > 0 {
		fmt.Fprintf(w, "%d expired key(s) are still processing and were kept (their outcome is unknown); %d alert(s) raised now",
			rep.ExpiredProcessing, rep.AlertsRaised)
		if rep.ExpiredProcessingHeld > 0 {
			fmt.Fprintf(w, ", %d on hold and not alerted", rep.ExpiredProcessingHeld)
			fmt.Fprintln(w, ". Resolve them with 'ledgerkeeper resolve'; a held key must be released first ('ledgerkeeper release KEY'): resolve refuses it.")
		} else {
			fmt.Fprintln(w, ". Resolve them with 'ledgerkeeper resolve'.")
		}
	}
	fmt.Fprintln(w)
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "TABLE\tROWS DELETED")
	for _, t := range rep.Deleted {
		fmt.Fprintf(tw, "%s\t%s\n", t.Table, purgeCount(t.Rows))
	}
	tw.Flush()
	if len(rep.Keys) > 0 {
		fmt.Fprintln(w)
		tw = tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
		fmt.Fprintln(tw, "TOOL\tSTATUS\tKEYS DELETED")
		for _, k := range rep.Keys {
			fmt.Fprintf(tw, "%s\t%s\t%s\n", k.Tool, k.Status, purgeCount(k.Keys))
		}
		tw.Flush()
	}
}

func printDryRun(w io.Writer, rep expiry.DryRunReport, cfg expiry.Config) {
	if rep.TotalKeys == 0 {
		fmt.Fprintln(w, "Dry run: nothing would be purged now; no key is both expired and past its retention floor. Nothing was deleted.")
	} else {
		fmt.Fprintf(w, "Dry run: %s expired key(s) would be purged, the oldest expired %s ago (%s). Nothing was deleted.\n",
			purgeCount(rep.TotalKeys), purgeAgo(*rep.OldestExpiresAt), rep.OldestExpiresAt.UTC().Format(time.RFC3339))
	}
	if rep.PurgeRunning {
		fmt.Fprintln(w, "A purge is running right now: these counts are shrinking under it.")
	}
	fmt.Fprintf(w, "Rules: completed or failed_retryable, past expires_at, created more than %s ago%s, not on hold.\n",
		purgeDuration(cfg.MinAge), toolFloors(cfg))
	if len(rep.Keys) > 0 {
		fmt.Fprintln(w)
		tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
		fmt.Fprintln(tw, "TOOL\tSTATUS\tKEYS\tOLDEST EXPIRES_AT")
		for _, k := range rep.Keys {
			fmt.Fprintf(tw, "%s\t%s\t%s\t%s\n", k.Tool, k.Status, purgeCount(k.Keys), k.OldestExpiresAt.UTC().Format(time.RFC3339))
		}
		tw.Flush()
	}

	var kept []string
	if rep.UnderFloor > 0 {
		kept = append(kept, fmt.Sprintf("%s expired but younger than their retention floor", purgeCount(rep.UnderFloor)))
	}
	if rep.Held > 0 {
		kept = append(kept, fmt.Sprintf("%s expired but on hold (see 'ledgerkeeper status')", purgeCount(rep.Held)))
	}
	if rep.ExpiredProcessing > 0 {
		kept = append(kept, fmt.Sprintf("%s expired but still processing (never purged)", purgeCount(rep.ExpiredProcessing)))
	}
	if len(kept) > 0 {
		fmt.Fprintln(w, "\nKept:")
		for _, k := range kept {
			fmt.Fprintf(w, "  - %s\n", k)
		}
	}
	if len(rep.WouldAlert) > 0 {
		more := rep.ExpiredProcessing - rep.ExpiredProcessingHeld - int64(len(rep.WouldAlert))
		fmt.Fprintf(w, "\nExpired keys still processing that a pass would alert (unless alerted in the last %s):\n", purgeDuration(cfg.RenotifyAfter))
		tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
		fmt.Fprintln(tw, "  TOOL\tKEY\tCLAIMED\tEXPIRED")
		for _, k := range rep.WouldAlert {
			fmt.Fprintf(tw, "  %s\t%s\t%s ago\t%s ago\n", k.Tool, k.Key, purgeAgo(k.ClaimedAt), purgeAgo(k.ExpiresAt))
		}
		tw.Flush()
		if more > 0 {
			fmt.Fprintf(w, "  ... and %d more in later passes (at most %d alerts per pass).\n", more, cfg.MaxAlertsPerPass)
		}
	}

	var own []string
	for _, t := range rep.Tables {
		if t.Rows > 0 {
			own = append(own, fmt.Sprintf("%s %s", purgeCount(t.Rows), t.Table))
		}
	}
	if len(own) > 0 {
		fmt.Fprintf(w, "\nledgerkeeper's own rows older than %s (retention.audit_max_age) would go too: %s.\n",
			purgeDuration(cfg.AuditMaxAge), strings.Join(own, ", "))
	}
}

func toolFloors(cfg expiry.Config) string {
	floors := cfg.ToolMinAge()
	if len(floors) == 0 {
		return ""
	}
	var parts []string
	for _, tool := range slices.Sorted(maps.Keys(floors)) {
		parts = append(parts, fmt.Sprintf("%s: %s", tool, purgeDuration(floors[tool])))
	}
	return " (" + strings.Join(parts, ", ") + ")"
}

// purgeDuration renders a configured duration the way people write it:
// "24h", "30 days", "90m".
func purgeDuration(d time.Duration) string {
	if d >= 48*time.Hour && d%(24*time.Hour) == 0 {
		return fmt.Sprintf("%d days", d/(24*time.Hour))
	}
	s := d.String()
	for _, zero := range []string{"m0s", "h0m"} {
		s = strings.Replace(s, zero, zero[:1], 1)
	}
	return s
}

// purgeAgo renders how long ago t was, to the unit that matters.
func purgeAgo(t time.Time) string {
	d := time.Since(t)
	switch {
	case d >= 48*time.Hour:
		return fmt.Sprintf("%d days", int(d/(24*time.Hour)))
	case d >= time.Hour:
		return fmt.Sprintf("%.1f hours", d.Hours())
	case d >= time.Minute:
		return fmt.Sprintf("%d minutes", int(d.Minutes()))
	default:
		return d.Round(time.Second).String()
	}
}

// purgeCount renders n with thousands separators.
func purgeCount(n int64) string {
	s := fmt.Sprint(n)
	if n < 0 {
		return "-" + purgeCount(-n)
	}
	for i := len(s) - 3; i > 0; i -= 3 {
		s = s[:i] + "," + s[i:]
	}
	return s
}
