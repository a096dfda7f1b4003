package main

import (
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"

	"github.com/ledgerkeeper/ledgerkeeper/alerts"
	"github.com/ledgerkeeper/ledgerkeeper/ledger"
	"github.com/ledgerkeeper/ledgerkeeper/operator"
	"github.com/ledgerkeeper/ledgerkeeper/store"
)

// inspection is everything `inspect` shows about a key (its --json
// document).
type inspection struct {
	Key      ledger.Key         `json:"key"`
	State    *store.State       `json:"reconcile_state,omitempty"`
	Hold     *store.Hold        `json:"hold,omitempty"`
	History  []store.AuditEntry `json:"history"`
	Alerts   []alerts.OpenAlert `json:"open_alerts,omitempty"`
	Window   string             `json:"processing_window_plus_grace"`
	InFlight bool               `json:"in_flight"`
}

func newInspectCmd(a *app) *cobra.Command {
	var asJSON bool
	var limit int
	cmd := &cobra.Command{
		Use:   "inspect KEY",
		Short: "Show a key's row, reconcile state, hold and full history",
		Args:  args(cobra.ExactArgs(1)),
		RunE: func(cmd *cobra.Command, argv []string) error {
			if limit < 1 {
				return usagef("inspect: --history must be at least 1 (got %d)", limit)
			}
			ctx := cmd.Context()
			pool, err := a.ledgerPool(ctx)
			if err != nil {
				return err
			}
			defer pool.Close()
			key := argv[0]
			in, err := operator.Inspect(ctx, pool, operator.InspectRequest{Key: key, HistoryLimit: limit, Windows: a.windows})
			if errors.Is(err, operator.ErrNoKey) {
				return fmt.Errorf("no key %q in the ledger (never claimed, or purged after it expired)", key)
			}
			if err != nil {
				return err
			}
			if in.Judgement.Condition == operator.Purged {
				last := in.History[len(in.History)-1]
				if !asJSON {
					// The trail is what is left to read: show it (no raw
					// SQL needed), then fail as for any key not in the ledger.
					fmt.Fprintf(a.stdout, "key %s: the row was purged after it expired (or deleted); its audit trail remains.\n", key)
					printHistory(a, in.History)
				}
				return fmt.Errorf("no key %q in the ledger: purged after it expired (or deleted); its audit trail remains: %s, the newest %s by %s at %s",
					key, plural(len(in.History), "entry", "entries"), last.Action, last.Actor, ts(last.CreatedAt))
			}
			if asJSON {
				return a.writeJSON(inspection{Key: in.Key, State: in.State, Hold: in.Hold, History: in.History, Alerts: in.Alerts,
					Window: in.Window.String(), InFlight: in.Judgement.Condition == operator.InFlight})
			}
			printInspection(a, in)
			return nil
		},
	}
	cmd.Flags().BoolVar(&asJSON, "json", false, "print one JSON document")
	cmd.Flags().IntVar(&limit, "history", 200, "show at most the N newest history entries")
	return cmd
}

// windows returns a tool's window + grace and heartbeat timeout.
func (a *app) windows(tool string) (time.Duration, time.Duration) {
	p := a.cfg.Policy(tool)
	return p.ProcessingWindow + a.cfg.Reconcile.Grace, p.HeartbeatTimeout
}

func printInspection(a *app, in operator.Inspection) {
	w := tabwriter.NewWriter(a.stdout, 0, 4, 2, ' ', 0)
	k, j := in.Key, in.Judgement
	row := func(name string, v any) { fmt.Fprintf(w, "%s\t%v\n", name, v) }
	row("key", k.Key)
	row("tool", k.Tool)
	status := k.Status
	switch {
	case j.Held:
		// Held keys are not stuck (status counts them apart): nothing
		// probes them until released.
		status += " (held: never probed, resolved or purged until 'ledgerkeeper release " + k.Key + "')"
	case j.Condition == operator.InFlight:
		status += fmt.Sprintf(" (in flight: inside its %s or heartbeating; the reconciler leaves it alone)", a.windowText(k.Tool, in.Window))
	case j.Condition == operator.Stuck:
		status += fmt.Sprintf(" (stuck: past its %s)", a.windowText(k.Tool, in.Window))
	}
	row("status", status)
	row("created_at", ts(k.CreatedAt))
	row("claimed_at", fmt.Sprintf("%s (%s ago)", ts(k.ClaimedAt), j.Age.Round(time.Second)))
	row("updated_at", ts(k.UpdatedAt))
	row("expires_at", ts(k.ExpiresAt))
	if k.HeartbeatAt != nil {
		row("heartbeat_at", fmt.Sprintf("%s (%s ago)", ts(*k.HeartbeatAt), j.HeartbeatAge.Round(time.Second)))
	}
	row("request_hash", k.RequestHash)
	row("request_body", oneLine(string(k.RequestBody), 200))
	if k.ResponseCode != nil {
		row("response_code", *k.ResponseCode)
		row("response_body", oneLine(string(k.ResponseBody), 200))
	}
	if s := in.State; s != nil {
		row("attempts", s.Attempts)
		if s.LastVerdict != nil {
			row("last_verdict", *s.LastVerdict)
		}
		if s.LastError != nil {
			// In full: the cause is what the operator came for.
			row("last_error", causeFirst(oneLine(*s.LastError, len(*s.LastError))))
		}
		if s.NextProbeAt != nil {
			row("next_probe_at", ts(*s.NextProbeAt))
		}
		if j.Leased {
			row("leased_by", fmt.Sprintf("%s until %s", *s.LeaseOwner, ts(*s.LeaseExpiresAt)))
		}
	}
	if h := in.Hold; h != nil {
		row("hold", fmt.Sprintf("held by %s since %s: %s", h.Actor, ts(h.CreatedAt), h.Reason))
	}
	for _, o := range in.Alerts {
		row("open_alert", string(o.Reason))
	}
	w.Flush()
	fmt.Fprintln(a.stdout)
	printHistory(a, in.History)
}

// windowText says what a key's judging window is made of: "window + grace
// of 17s: processing window 15s + grace 2s".
func (a *app) windowText(tool string, total time.Duration) string {
	if a.cfg == nil {
		return fmt.Sprintf("window + grace of %s", total)
	}
	return fmt.Sprintf("window + grace of %s: processing window %s + grace %s", total, a.cfg.Policy(tool).ProcessingWindow, a.cfg.Reconcile.Grace)
}

// printHistory prints an audit trail, each entry's error first and in
// full, then its evidence (clipped: the JSON document is in --json).
func printHistory(a *app, hist []store.AuditEntry) {
	fmt.Fprintf(a.stdout, "History (%d):\n", len(hist))
	if len(hist) == 0 {
		fmt.Fprintln(a.stdout, "  none: the reconciler has not decided anything for this key")
		return
	}
	w := tabwriter.NewWriter(a.stdout, 0, 4, 2, ' ', 0)
	fmt.Fprintln(w, "  TIME\tACTOR\tATTEMPT\tVERDICT\tACTION\tDETAIL")
	for _, e := range hist {
		detail := causeFirst(oneLine(e.Error, len(e.Error)))
		if len(e.Evidence) > 0 {
			detail = strings.TrimSpace(detail + "  evidence: " + oneLine(string(e.Evidence), 120))
		}
		fmt.Fprintf(w, "  %s\t%s\t%d\t%s\t%s\t%s\n", ts(e.CreatedAt), e.Actor, e.Attempt, e.Verdict, e.Action, detail)
	}
	w.Flush()
}

func ts(t time.Time) string { return t.UTC().Format(time.RFC3339) }

func newResolveCmd(a *app) *cobra.Command {
	var (
		completed, retryable, force bool
		code                        int
		body, reason, actorFlag     string
	)
	cmd := &cobra.Command{
		Use:   "resolve KEY (--completed --code N --body JSON | --retryable) --reason TEXT",
		Short: "Resolve a processing key by hand (audited, compare-and-set)",
		Long: `Resolve a key stuck in processing by hand, after checking the downstream
yourself: --completed stores the outcome retries will replay; --retryable
marks it failed_retryable so a retry may redo the work (only when you know
the effect did not happen). The decision is audited with --actor (default
$USER) and --reason, and written only if the key is still processing with
the claim you saw: otherwise nothing changes and the command exits 1.

A key inside its processing window or with a fresh heartbeat (by the
database's clock, with the windows of the loaded configuration) is in flight:
resolving it could race the running attempt, so it is refused unless --force.
A held key must be released first. --completed also applies to a key
already marked failed_retryable that no retry has re-claimed yet, when the
effect turns out to exist after all.

A key of an MCP tool (ledger/mcpkey) replays --body to every retry: a JSON
object as the result's structuredContent (when it matches the tool's
outputSchema) and as its text; any other body (a string such as '"ticket
T-1 created"', an array, null), or an object the outputSchema refuses, as
text only, _meta["ledgerkeeper/replayAsText"] saying why, and as an error
result saying the call completed when the tool declares an outputSchema.
For an MCP tool, give the object its tool returns.`,
		Args: args(cobra.ExactArgs(1)),
		RunE: func(cmd *cobra.Command, argv []string) error {
			if completed == retryable {
				return usagef("resolve: give exactly one of --completed or --retryable")
			}
			req := operator.ResolveRequest{Key: argv[0], Mark: operator.MarkRetryable, Reason: reason, Actor: actor(actorFlag), Force: force}
			if completed {
				req.Mark, req.Code, req.Body = operator.MarkCompleted, code, json.RawMessage(body)
			} else if cmd.Flags().Changed("code") || cmd.Flags().Changed("body") {
				req.Code, req.Body = code, json.RawMessage(body)
				if req.Body == nil {
					// --code 0 or --body "": still an outcome given.
					req.Body = json.RawMessage{}
				}
			}
			if completed {
				// Missing is not malformed: say which flag is missing.
				switch {
				case !cmd.Flags().Changed("code"):
					return usagef("resolve --completed: --code is required (the response code retries will replay)")
				case !cmd.Flags().Changed("body"):
					return usagef("resolve --completed: --body is required (the JSON response body retries will replay)")
				}
			}
			if err := req.Validate(); err != nil {
				return resolveUsage(err, code)
			}
			ctx := cmd.Context()
			pool, err := a.ledgerPool(ctx)
			if err != nil {
				return err
			}
			defer pool.Close()
			if a.cfg.File != "" {
				// The serve configuration's windows judge "in flight";
				// without it operator.Resolve refuses unless --force.
				req.Windows = a.windows
			}
			res, err := operator.Resolve(ctx, pool, req)
			if err != nil {
				return resolveRefusal(err, req.Key)
			}
			fmt.Fprintf(a.stdout, "key %s is now %s (by %s: %s)\n", req.Key, res.Key.Status, req.Actor, reason)
			if completed && !isJSONObject(req.Body) {
				fmt.Fprintln(a.stderr, "note: the body is not a JSON object: if this is an MCP tool's key, its retries receive it as text only, without structuredContent (see resolve --help)")
			}
			return nil
		},
	}
	f := cmd.Flags()
	f.BoolVar(&completed, "completed", false, "store an outcome: the effect happened")
	f.BoolVar(&retryable, "retryable", false, "mark failed_retryable: the effect did not happen")
	f.IntVar(&code, "code", 0, "response code to store (with --completed)")
	f.StringVar(&body, "body", "", "response body to store, JSON (with --completed)")
	f.StringVar(&reason, "reason", "", "why (recorded in the audit trail; required)")
	f.StringVar(&actorFlag, "actor", "", "operator name for the audit trail (default $USER)")
	f.BoolVar(&force, "force", false, "resolve even a key that is in flight")
	return cmd
}

// isJSONObject reports whether body is a JSON object: what an MCP tool's
// retry receives as structuredContent (package mcpkey's replay rule).
func isJSONObject(body json.RawMessage) bool {
	var m map[string]json.RawMessage
	return json.Unmarshal(body, &m) == nil && m != nil
}

func newHoldCmd(a *app) *cobra.Command {
	var reason, actorFlag string
	var replace bool
	cmd := &cobra.Command{
		Use:   "hold KEY --reason TEXT [--replace]",
		Short: "Put a key on hold: never probed, resolved or purged until released",
		Long: `Put a key on hold: the reconciler neither probes nor resolves it, purge keeps
it, and resolve refuses it, until 'ledgerkeeper release KEY'. A hold binds
ledgerkeeper only: the tool side still answers retries as the key's status
says (409 while processing, the replay once completed), and a retry of a
failed_retryable key still re-claims it.

A key already on hold is refused (exit 1) with the hold in force: who put it,
since when, why. --replace replaces it with yours (audited as a hold, naming
the hold it replaced).`,
		Args: args(cobra.ExactArgs(1)),
		RunE: func(cmd *cobra.Command, argv []string) error {
			req := operator.HoldRequest{Key: argv[0], Reason: reason, Actor: actor(actorFlag), Replace: replace}
			if err := req.Validate(); err != nil {
				if errors.Is(err, operator.ErrNoReason) {
					return usagef("hold: --reason is required")
				}
				return &usageError{fmt.Errorf("hold: %w", err)}
			}
			ctx := cmd.Context()
			pool, err := a.ledgerPool(ctx)
			if err != nil {
				return err
			}
			defer pool.Close()
			key, who := req.Key, req.Actor
			res, err := operator.Hold(ctx, pool, req)
			var refused *operator.RefusedError
			switch {
			case errors.Is(err, operator.ErrNoKey):
				return fmt.Errorf("no key %q in the ledger", key)
			case errors.As(err, &refused) && refused.Why == operator.RefusedAlreadyHeld && refused.Hold != nil:
				h := refused.Hold
				return fmt.Errorf("refused: key %q is already on hold, by %s since %s: %s; nothing changed. Pass --replace to replace that hold with yours, or leave it to %s", key, h.Actor, ts(h.CreatedAt), h.Reason, h.Actor)
			case err != nil:
				return err
			}
			if prev := res.Replaced; prev != nil {
				fmt.Fprintf(a.stdout, "key %s is on hold (by %s: %s), replacing the hold by %s since %s (%s); 'ledgerkeeper release %s' lifts it\n",
					key, who, reason, prev.Actor, ts(prev.CreatedAt), prev.Reason, key)
				return nil
			}
			fmt.Fprintf(a.stdout, "key %s is on hold (by %s: %s); 'ledgerkeeper release %s' lifts it\n", key, who, reason, key)
			return nil
		},
	}
	cmd.Flags().BoolVar(&replace, "replace", false, "replace the key's hold if it has one (audited)")
	cmd.Flags().StringVar(&reason, "reason", "", "why (shown by status and inspect; required)")
	cmd.Flags().StringVar(&actorFlag, "actor", "", "operator name for the audit trail (default $USER)")
	return cmd
}

func newReleaseCmd(a *app) *cobra.Command {
	var actorFlag string
	cmd := &cobra.Command{
		Use:   "release KEY",
		Short: "Release a key's hold",
		Args:  args(cobra.ExactArgs(1)),
		RunE: func(cmd *cobra.Command, argv []string) error {
			ctx := cmd.Context()
			pool, err := a.ledgerPool(ctx)
			if err != nil {
				return err
			}
			defer pool.Close()
			who := actor(actorFlag)
			err = operator.Release(ctx, pool, operator.ReleaseRequest{Key: argv[0], Actor: who})
			if errors.Is(err, operator.ErrNotHeld) {
				return fmt.Errorf("key %q is not on hold", argv[0])
			}
			if err != nil {
				return err
			}
			fmt.Fprintf(a.stdout, "key %s released (by %s)\n", argv[0], who)
			return nil
		},
	}
	cmd.Flags().StringVar(&actorFlag, "actor", "", "operator name for the audit trail (default $USER)")
	return cmd
}

// resolveUsage words a request operator.ResolveRequest.Validate refused in
// terms of the flags (exit 2).
func resolveUsage(err error, code int) error {
	switch {
	case errors.Is(err, operator.ErrNoReason):
		return usagef("resolve: --reason is required (it goes into the audit trail)")
	case errors.Is(err, operator.ErrBadCode):
		return usagef("resolve --completed: --code must be an HTTP status code (100-599)")
	case errors.Is(err, operator.ErrServerErrorOutcome):
		return usagef("resolve --completed: --code %d would replay a server error to every retry forever (the caching rule stores definitive outcomes only); pass --force if you mean it", code)
	case errors.Is(err, operator.ErrBadBody):
		return usagef("resolve --completed: --body must be valid JSON (the response retries will replay)")
	case errors.Is(err, operator.ErrOutcomeOnRetryable):
		return usagef("resolve --retryable takes no --code or --body")
	}
	return &usageError{fmt.Errorf("resolve: %w", err)}
}

// resolveRefusal words operator.Resolve's refusals for the command line
// (exit 1, nothing changed); other errors pass through.
func resolveRefusal(err error, key string) error {
	var r *operator.RefusedError
	switch {
	case errors.Is(err, operator.ErrNoKey):
		return fmt.Errorf("no key %q in the ledger", key)
	case !errors.As(err, &r):
		return err
	}
	switch r.Why {
	case operator.RefusedAlreadyRetryable:
		return fmt.Errorf("refused: key %q is already failed_retryable", key)
	case operator.RefusedFinal:
		return fmt.Errorf("refused: key %q is %s; a completed key is final (only purge removes it)", key, r.Status)
	case operator.RefusedHeld:
		return fmt.Errorf("refused: key %q is on hold; run 'ledgerkeeper release %s' first", key, key)
	case operator.RefusedNoConfiguration:
		return fmt.Errorf("refused: no configuration loaded, so the processing window of tool %q is unknown here; pass --config with the serve configuration (or --force)", r.Tool)
	case operator.RefusedInFlight:
		return fmt.Errorf("refused: key %q is in flight (claimed less than its window + grace of %s ago, or heartbeating): the original attempt may still finish; wait, or pass --force", key, r.Window)
	case operator.RefusedChanged:
		return fmt.Errorf("refused: key %q changed while you looked (%s); nothing written; run 'ledgerkeeper inspect %s'", key, strings.ReplaceAll(r.Action, "_", " "), key)
	}
	return err
}
