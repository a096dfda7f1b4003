package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"slices"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"

	"github.com/ledgerkeeper/ledgerkeeper/alerts"
	"github.com/ledgerkeeper/ledgerkeeper/internal/daemon"
	"github.com/ledgerkeeper/ledgerkeeper/internal/safetext"
	"github.com/ledgerkeeper/ledgerkeeper/probes"
	"github.com/ledgerkeeper/ledgerkeeper/reconcile"
	"github.com/ledgerkeeper/ledgerkeeper/store"
)

func newReconcileCmd(a *app) *cobra.Command {
	var (
		tools, keys    []string
		dryRun, asJSON bool
		noAlerts       bool
		limit          int
		actorFlag      string
	)
	cmd := &cobra.Command{
		Use:   "reconcile [--tool T]... [--key K]... [--dry-run] [--limit N] [--json] [--no-alerts]",
		Short: "Run one reconcile pass now",
		Long: `Run one reconcile pass now: work through every due key (processing past its
tool's window + grace, no fresh heartbeat, not held, not leased elsewhere,
back-off elapsed), batch after batch, probe the downstream and record the
decision; then deliver the alerts the pass raised.

--key reconciles the named keys even before their next back-off time, but
never inside their processing window. --dry-run probes and reports what would
happen; it writes nothing, leases nothing and posts nothing.

Safe to run while 'serve' replicas run: leases keep each key to one prober.`,
		Args: args(cobra.NoArgs),
		RunE: func(cmd *cobra.Command, _ []string) error {
			if limit < 0 {
				return usagef("--limit must be positive")
			}
			ctx := cmd.Context()
			pool, err := a.ledgerPool(ctx)
			if err != nil {
				return err
			}
			defer pool.Close()
			who := actor(actorFlag)
			eng, closer, err := daemon.BuildEngine(ctx, a.cfg, pool, a.registry(), who, a.logger, nil)
			if err != nil {
				return &configError{err}
			}
			defer closer.Close()
			if err := a.checkTools(ctx, pool, tools); err != nil {
				return err
			}
			rep, runErr := eng.Run(ctx, reconcile.Options{Tools: tools, Keys: keys, DryRun: dryRun, Limit: limit})
			var delivery *alerts.Report
			if !dryRun && !noAlerts && runErr == nil {
				delivery = a.deliverAlerts(ctx, pool)
			}
			if asJSON {
				if err := a.writeJSON(struct {
					reconcile.Report
					Delivery *alerts.Report `json:"alert_delivery,omitempty"`
				}{rep, delivery}); err != nil {
					return err
				}
			} else {
				printReconcile(a.stdout, rep, delivery)
			}
			if runErr != nil {
				if errors.Is(runErr, context.Canceled) {
					return fmt.Errorf("reconcile interrupted: decisions already recorded are kept; unprobed keys were given back: %w", runErr)
				}
				return fmt.Errorf("reconcile pass: %w", runErr)
			}
			if rep.Actions["write_failed"] > 0 {
				return fmt.Errorf("%d decision(s) could not be recorded (see errors above); the keys stay processing and will be retried", rep.Actions["write_failed"])
			}
			// A key that is not in the ledger is exit 1, as for inspect.
			var missing []string
			for _, s := range rep.Skipped {
				if s.Action == "not_found_in_ledger" {
					missing = append(missing, fmt.Sprintf("%q", s.Key))
				}
			}
			if len(missing) > 0 {
				return fmt.Errorf("--key: no key %s in the ledger (never claimed, or purged after it expired)", strings.Join(missing, ", "))
			}
			return nil
		},
	}
	f := cmd.Flags()
	f.StringArrayVar(&tools, "tool", nil, "only keys of this tool (repeatable)")
	f.StringArrayVar(&keys, "key", nil, "only this key, ignoring its back-off (repeatable)")
	f.BoolVar(&dryRun, "dry-run", false, "probe and report; write nothing, post nothing")
	f.IntVar(&limit, "limit", 0, "probe at most N keys (0: no limit)")
	f.BoolVar(&asJSON, "json", false, "print one JSON document")
	f.BoolVar(&noAlerts, "no-alerts", false, "leave raised alerts in the outbox for 'serve' to deliver")
	f.StringVar(&actorFlag, "actor", "", "operator name for the audit trail (default $USER)")
	return cmd
}

// checkTools refuses a --tool that is neither configured nor in the ledger
// (a typo: "Reconciled no due keys" would hide it), with the nearest
// names; a tool with keys but no configuration is warned about and
// reconciled (its keys are alerted, never guessed).
func (a *app) checkTools(ctx context.Context, pool store.Pool, tools []string) error {
	var ledgerTools []string
	for _, t := range tools {
		if _, ok := a.cfg.Tools[t]; ok {
			continue
		}
		if ledgerTools == nil {
			var err error
			if ledgerTools, err = store.LedgerTools(ctx, pool); err != nil {
				return err
			}
		}
		if slices.Contains(ledgerTools, t) {
			a.logger.Warn("tool is not in the configuration: its keys have no probe and will only be alerted", "tool", t)
			continue
		}
		known := slices.Compact(slices.Sorted(slices.Values(append(a.cfg.ToolNames(), ledgerTools...))))
		msg := fmt.Sprintf("--tool %q: no such tool: not in the configuration and no key of it in the ledger", t)
		if s := suggest(t, known); len(s) > 0 {
			msg += " (did you mean " + strings.Join(s, " or ") + "?)"
		}
		if len(known) > 0 {
			msg += "; the tools are " + strings.Join(known, ", ")
		}
		return usagef("%s", msg)
	}
	return nil
}

// plural is "1 key", "3 keys".
func plural(n int, one, many string) string {
	if n == 1 {
		return "1 " + one
	}
	return fmt.Sprintf("%d %s", n, many)
}

// registry returns the Go probes compiled into this binary (none in the
// stock build; a program embedding ledgerkeeper registers its own).
func (a *app) registry() *probes.Registry {
	if a.probes == nil {
		a.probes = probes.NewRegistry()
	}
	return a.probes
}

// deliverAlerts runs one dispatcher pass; failures are reported, not fatal:
// the alerts stay in the outbox.
func (a *app) deliverAlerts(ctx context.Context, pool store.Pool) *alerts.Report {
	d, err := newDispatcher(a, pool)
	if err != nil {
		a.logger.Error("alert delivery not possible", "err", err)
		return nil
	}
	start := time.Now()
	rep, err := d.RunOnce(ctx)
	if err != nil {
		a.logger.Error("alert delivery", "err", err)
	}
	recordAlertsRun(ctx, a.logger, pool, actor(""), start, rep, err)
	return &rep
}

func printReconcile(w io.Writer, rep reconcile.Report, delivery *alerts.Report) {
	verb := "Reconciled"
	if rep.DryRun {
		verb = "Dry run (nothing written, nothing posted):"
	}
	held := 0 // tools whose due keys this pass left alone (breaker, untrusted probe)
	for _, t := range rep.Tools {
		if t.Untrusted || t.BreakerOpen {
			held++
		}
	}
	switch {
	case rep.Decided == 0 && held > 0:
		fmt.Fprintf(w, "%s no key in %s: %d tool(s) left alone, their keys unchanged (see below).\n", verb, rep.Duration.Round(time.Millisecond), held)
	case rep.Decided == 0:
		fmt.Fprintf(w, "%s no due keys in %s.\n", verb, rep.Duration.Round(time.Millisecond))
	default:
		fmt.Fprintf(w, "%s %d key(s) in %s: %s.\n", verb, rep.Decided, rep.Duration.Round(time.Millisecond), summarize(rep.Actions))
		tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
		fmt.Fprintln(tw, "\nTOOL\tKEY\tAGE\tATTEMPTS\tVERDICT\tACTION\tDETAIL")
		for _, k := range rep.Keys {
			detail := causeFirst(k.Error)
			if len(k.Alerts) > 0 {
				detail = strings.TrimSpace("alert: " + strings.Join(k.Alerts, ",") + "  " + detail)
			}
			fmt.Fprintf(tw, "%s\t%s\t%s\t%d\t%s\t%s\t%s\n", k.Tool, k.Key, (time.Duration(k.AgeSecond) * time.Second).String(),
				k.Attempts, k.Verdict, k.Action, oneLine(detail, 100))
		}
		tw.Flush()
		if rep.KeysOmitted > 0 {
			fmt.Fprintf(w, "(%d more key(s) decided, not listed: the counts above include them; 'ledgerkeeper inspect KEY' shows any key's history)\n", rep.KeysOmitted)
		}
	}
	if rep.OutOfTime {
		fmt.Fprintln(w, "The pass reached reconcile.max_duration: the keys left are due for the next pass.")
	}
	if rep.GivenBack > 0 {
		fmt.Fprintf(w, "%s given back without a verdict (stopped, paused, or too little lease left to probe): no attempt counted, due again.\n", plural(rep.GivenBack, "key", "keys"))
	}
	for _, s := range rep.Skipped {
		fmt.Fprintf(w, "skipped %s: %s\n", s.Key, strings.ReplaceAll(s.Action, "_", " "))
	}
	for _, t := range rep.Tools {
		if t.Note != "" {
			fmt.Fprintf(w, "%s: %s\n", t.Tool, t.Note)
		}
	}
	if rep.ResolvedAlerts > 0 {
		fmt.Fprintf(w, "%d alert(s) resolved: their keys settled since.\n", rep.ResolvedAlerts)
	}
	if delivery != nil {
		switch {
		case delivery.Permanent:
			fmt.Fprintf(w, "Alerts NOT delivered: %s (they stay in the outbox; see 'ledgerkeeper status').\n", delivery.LastError)
		case delivery.Messages > 0 || delivery.FailedMessages > 0:
			fmt.Fprintf(w, "Alerts: %d message(s) posted, %d failed (%d pending).\n", delivery.Messages, delivery.FailedMessages, delivery.Pending)
		}
	}
}

func summarize(m map[string]int) string {
	var parts []string
	for _, k := range []string{"completed", "marked_retryable", "would_complete", "would_mark_retryable", "would_alert", "awaiting_confirmation",
		"duplicate_alerted", "escalated_dedup_window", "backoff", "no_probe", "resolved_by_original", "held", "lease_lost", "write_failed"} {
		if n := m[k]; n > 0 {
			parts = append(parts, fmt.Sprintf("%d %s", n, strings.ReplaceAll(k, "_", " ")))
		}
	}
	return strings.Join(parts, ", ")
}

// causeFirst puts a probe error's cause before the request it was about:
// "http probe GET /v1/tickets?idempotency_key=…: unexpected status 401
// Unauthorized" becomes "unexpected status 401 Unauthorized (http probe GET
// /v1/tickets?idempotency_key=…)", so a clipped column keeps the cause.
func causeFirst(s string) string {
	const pre = "http probe "
	if !strings.HasPrefix(s, pre) {
		return s
	}
	i := strings.Index(s[len(pre):], ": ")
	if i < 0 {
		return s
	}
	what, cause := s[:len(pre)+i], s[len(pre)+i+2:]
	return cause + " (" + what + ")"
}

// oneLine folds s onto one line of at most n characters, cut between
// characters (a byte cut would print half of an "é").
func oneLine(s string, n int) string {
	return safetext.ClipRunes(strings.Join(strings.Fields(s), " "), n)
}
