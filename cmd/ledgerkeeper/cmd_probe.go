package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"slices"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"

	"github.com/ledgerkeeper/ledgerkeeper/internal/config"
	"github.com/ledgerkeeper/ledgerkeeper/internal/daemon"
	"github.com/ledgerkeeper/ledgerkeeper/internal/safetext"
	"github.com/ledgerkeeper/ledgerkeeper/ledger"
	"github.com/ledgerkeeper/ledgerkeeper/probes"
	"github.com/ledgerkeeper/ledgerkeeper/reconcile"
	"github.com/ledgerkeeper/ledgerkeeper/store"
)

// Probing by hand: `probe run` and `probe check` ask the downstream what
// the reconciler would ask it, and write nothing (no decision, no audit
// row, no alert, no self-check record). Operators run them before deploying
// a probe and when an alert says a probe is untrusted.

// maxExcerptRunes bounds the body excerpt `probe run` prints.
const maxExcerptRunes = 1000

func newProbeCmd(a *app) *cobra.Command {
	cmd := &cobra.Command{
		Use:   "probe",
		Short: "Probe a key by hand, run the probes' self-check now, or mark canaries",
		Long: `Ask a tool's downstream what the reconciler would ask it, writing nothing:

  probe run KEY     probe one key, whatever its status, and show the request
                    made, the answer, the verdict and the outcome that would
                    be stored;
  probe check       run the probes' self-check now: completed keys must come
                    back found with their stored values, a made-up key must
                    come back not_found.

Neither writes to the ledger, the audit trail, the alert outbox or the
self-check record: what the reconciler does is unchanged.

  probe canary      add, list or remove canaries: effects known to exist
                    downstream that the self-check probes as present-side
                    witnesses (audited).`,
	}
	cmd.AddCommand(newProbeRunCmd(a), newProbeCheckCmd(a), newProbeCanaryCmd(a))
	parentOnly(cmd, false)
	return cmd
}

// probeRunReport is `probe run`'s document.
type probeRunReport struct {
	Key  string `json:"key"`
	Tool string `json:"tool"`
	// InLedger: the key is in the ledger; Status is its status there.
	InLedger bool   `json:"in_ledger"`
	Status   string `json:"status,omitempty"`
	// KeyTool is the key's own tool when --tool named another.
	KeyTool   string `json:"key_tool,omitempty"`
	ProbeType string `json:"probe_type"`
	// Requests are the http probe's requests and their answers (URL
	// secrets redacted, header values never shown).
	Requests []probeRequest `json:"requests"`
	// Query is the sql probe's query (its arguments come from args).
	Query      string          `json:"query,omitempty"`
	QueryArgs  []string        `json:"query_args,omitempty"`
	Verdict    string          `json:"verdict"`
	Error      string          `json:"error,omitempty"`
	Evidence   json.RawMessage `json:"evidence,omitempty"`
	DurationMS float64         `json:"duration_ms"`
	// WouldStore is the outcome a found verdict would store.
	WouldStore *probeOutcome `json:"would_store,omitempty"`
	// Stored is the key's outcome in the ledger, if it has one; Mismatched
	// the response_body fields where the probe's differs from it.
	Stored     *probeOutcome `json:"stored,omitempty"`
	Mismatched []string      `json:"mismatched_fields,omitempty"`
	// Note says what the verdict means for this key, where it is worth
	// saying (a completed key the probe does not find).
	Note string `json:"note,omitempty"`
	// SelfCheck is the tool's latest stored self-check: the reconciler
	// acts on the probe's verdicts only while it passes.
	SelfCheck *checkNote `json:"self_check,omitempty"`
	// Written is always false: probe run writes nothing.
	Written bool `json:"written"`
}

type probeRequest struct {
	Method      string   `json:"method"`
	URL         string   `json:"url"`
	Headers     []string `json:"headers,omitempty"`
	Answered    bool     `json:"answered"`
	HTTPStatus  int      `json:"http_status,omitempty"`
	BodyBytes   int      `json:"body_bytes"`
	BodyExcerpt string   `json:"body_excerpt,omitempty"`
}

type probeOutcome struct {
	Code int             `json:"response_code"`
	Body json.RawMessage `json:"response_body"`
}

// checkNote is a stored self-check, in short.
type checkNote struct {
	Outcome   string    `json:"outcome"`
	CheckedAt time.Time `json:"checked_at"`
	Summary   string    `json:"summary"`
}

func newProbeRunCmd(a *app) *cobra.Command {
	var (
		tool   string
		asJSON bool
	)
	cmd := &cobra.Command{
		Use:   "run KEY [--tool T] [--json]",
		Short: "Probe one key by hand, whatever its status; writes nothing",
		Long: `Probe one key with its tool's probe, whatever the key's status (processing,
completed, failed_retryable), and print the request made (secrets redacted),
the status code, an excerpt of the body, the verdict, the error and the
outcome a found verdict would store. For a completed key, the outcome the
ledger holds is shown next to it.

The key is read from the ledger (its tool and request body). --tool probes
with another tool's probe; it is required for a key that is not in the
ledger, which is then probed with no request body.

Writes nothing. Exit 0 when the probe ran, whatever its verdict.`,
		Args: args(cobra.ExactArgs(1)),
		RunE: func(cmd *cobra.Command, argv []string) error {
			ctx := cmd.Context()
			if err := a.load(); err != nil {
				return err
			}
			if tool != "" {
				if err := a.probeable(tool); err != nil {
					return err
				}
			}
			pool, err := a.ledgerPool(ctx)
			if err != nil {
				return err
			}
			defer pool.Close()
			rep := probeRunReport{Key: argv[0], Requests: []probeRequest{}}
			pk := probes.Key{Key: argv[0], Tool: tool, CreatedAt: time.Now(), ClaimedAt: time.Now()}
			k, err := ledger.Get(ctx, pool, argv[0])
			switch {
			case errors.Is(err, ledger.ErrNotFound):
				if tool == "" {
					return fmt.Errorf("key %q not in the ledger: pass --tool to probe it with that tool's probe", argv[0])
				}
			case err != nil:
				return err
			default:
				rep.InLedger, rep.Status = true, k.Status
				pk.RequestBody, pk.CreatedAt, pk.ClaimedAt = k.RequestBody, k.CreatedAt, k.ClaimedAt
				if tool == "" {
					if err := a.probeable(k.Tool); err != nil {
						return err
					}
					tool = k.Tool
				} else if tool != k.Tool {
					rep.KeyTool = k.Tool
				}
				if k.ResponseCode != nil {
					rep.Stored = &probeOutcome{Code: *k.ResponseCode, Body: k.ResponseBody}
				}
			}
			pk.Tool, rep.Tool = tool, tool
			eng, closer, err := a.probeEngine(ctx, pool)
			if err != nil {
				return err
			}
			defer closer.Close()
			probe := eng.Policy(tool).Probe
			if probe == nil {
				return usagef("tool %q has no probe", tool)
			}
			a.describeProbe(&rep, tool)

			var tr probes.Trace
			start := time.Now()
			res := probe.Probe(probes.WithTrace(ctx, &tr), pk)
			rep.DurationMS = float64(time.Since(start).Microseconds()) / 1000
			if err := ctx.Err(); err != nil {
				return fmt.Errorf("probe run interrupted: %w", err)
			}
			red := a.redactor()
			for _, x := range tr.Exchanges() {
				r := probeRequest{Method: x.Method, URL: red.String(x.URL), Headers: x.Headers, Answered: x.Answered,
					HTTPStatus: x.Status, BodyBytes: x.BodyBytes}
				if len(x.Body) > 0 {
					r.BodyExcerpt = safetext.ClipRunes(strings.TrimSpace(red.String(safetext.Clean(string(x.Body)))), maxExcerptRunes)
				}
				rep.Requests = append(rep.Requests, r)
			}
			rep.Verdict = string(res.Verdict)
			if res.Err != nil {
				rep.Error = red.String(res.Err.Error())
			}
			rep.Evidence = red.JSON(res.Evidence)
			if res.Verdict == probes.Found && res.Outcome != nil {
				rep.WouldStore = &probeOutcome{Code: res.Outcome.Code, Body: res.Outcome.Body}
				if rep.Stored != nil {
					rep.Mismatched = reconcile.MismatchedFields(rep.Stored.Body, res.Outcome.Body)
				}
			}
			if rep.Status == ledger.StatusCompleted && res.Verdict != probes.Found {
				rep.Note = "the ledger holds this key's outcome, so its effect exists: a probe that does not find it is broken, or the record was deleted or changed downstream since"
			} else if len(rep.Mismatched) > 0 {
				rep.Note = "the probe found the effect with other values than the stored outcome: a response_body mapping reading the wrong field, or the record changed downstream since"
			}
			checks, err := reconcile.StoredChecks(ctx, pool)
			if err != nil {
				return err
			}
			for _, c := range checks {
				if c.Tool == tool {
					rep.SelfCheck = &checkNote{Outcome: c.Outcome, CheckedAt: c.CheckedAt, Summary: c.Summary}
				}
			}
			if asJSON {
				return a.writeJSON(rep)
			}
			printProbeRun(a.stdout, rep)
			return nil
		},
	}
	cmd.Flags().StringVar(&tool, "tool", "", "probe with this tool's probe (required for a key not in the ledger)")
	cmd.Flags().BoolVar(&asJSON, "json", false, "print one JSON document")
	return cmd
}

// probeable refuses a tool that is not configured or has no probe: a
// usage error (exit 2), before anything is asked of the downstream.
func (a *app) probeable(tool string) error {
	t, configured := a.cfg.Tools[tool]
	_, registered := a.registry().Lookup(tool)
	switch {
	case registered:
		return nil
	case !configured:
		return usagef("unknown tool %q: it is not in the configuration's tools (configured: %s)", tool, strings.Join(a.cfg.ToolNames(), ", "))
	case t.Probe == nil:
		return usagef("tool %q has no probe: configure tools.%s.probe", tool, tool)
	}
	return nil
}

// probeEngine builds the engine only to reach the probes and the
// self-check exactly as the reconciler builds them; it is never run.
func (a *app) probeEngine(ctx context.Context, pool store.Pool) (*reconcile.Engine, io.Closer, error) {
	eng, closer, err := daemon.BuildEngine(ctx, a.cfg, pool, a.registry(), actor(""), a.logger, nil)
	if err != nil {
		return nil, nil, &configError{err}
	}
	return eng, closer, nil
}

// describeProbe fills in what the configuration says the probe asks.
func (a *app) describeProbe(rep *probeRunReport, tool string) {
	rep.ProbeType = "go"
	t, ok := a.cfg.Tools[tool]
	if !ok || t.Probe == nil {
		return
	}
	rep.ProbeType = t.Probe.Type
	if t.Probe.Type == "sql" {
		rep.Query, rep.QueryArgs = t.Probe.Query, t.Probe.Args
	}
}

func printProbeRun(w io.Writer, rep probeRunReport) {
	where := "not in the ledger: probed with no request body"
	if rep.InLedger {
		where = "status " + rep.Status + " in the ledger"
	}
	fmt.Fprintf(w, "probe run %s (tool %s, %s probe; %s). Nothing is written.\n", rep.Key, rep.Tool, rep.ProbeType, where)
	if rep.KeyTool != "" {
		fmt.Fprintf(w, "note: the key belongs to tool %s; probed with %s's probe as asked\n", rep.KeyTool, rep.Tool)
	}
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	row := func(name, format string, v ...any) { fmt.Fprintf(tw, "%s\t"+format+"\n", append([]any{name}, v...)...) }
	for _, r := range rep.Requests {
		row("request", "%s %s", r.Method, r.URL)
		if len(r.Headers) > 0 {
			row("headers", "%s (values not shown)", strings.Join(r.Headers, ", "))
		}
		if !r.Answered {
			row("answer", "none (no status line came back)")
			continue
		}
		row("answer", "%d %s, %d byte(s)", r.HTTPStatus, http.StatusText(r.HTTPStatus), r.BodyBytes)
		if r.BodyExcerpt != "" {
			row("body", "%s", oneLine(r.BodyExcerpt, 300))
		}
	}
	if rep.Query != "" {
		row("query", "%s", oneLine(rep.Query, 300))
		row("args", "%s", strings.Join(rep.QueryArgs, ", "))
	}
	if len(rep.Evidence) > 0 {
		row("evidence", "%s", oneLine(string(rep.Evidence), 300))
	}
	row("verdict", "%s", rep.Verdict)
	if rep.Error != "" {
		row("error", "%s", oneLine(rep.Error, 500))
	}
	if o := rep.WouldStore; o != nil {
		row("would store", "response_code %d, response_body %s", o.Code, oneLine(string(o.Body), 300))
	}
	if o := rep.Stored; o != nil {
		row("stored", "response_code %d, response_body %s", o.Code, oneLine(string(o.Body), 300))
		if rep.WouldStore != nil {
			if len(rep.Mismatched) > 0 {
				row("", "DIFFERS from what the probe found in: %s", strings.Join(rep.Mismatched, ", "))
			} else {
				row("", "the probe's fields match the stored outcome")
			}
		}
	}
	if rep.Note != "" {
		row("note", "%s", rep.Note)
	}
	row("took", "%.1f ms", rep.DurationMS)
	if c := rep.SelfCheck; c != nil {
		row("self-check", "%s at %s: %s", c.Outcome, ts(c.CheckedAt), oneLine(c.Summary, 300))
	} else {
		row("self-check", "none stored yet: a reconcile pass of the tool stores one ('ledgerkeeper probe check --tool %s' runs one now, storing nothing)", rep.Tool)
	}
	tw.Flush()
}

// probeCheckReport is `probe check`'s document.
type probeCheckReport struct {
	Tools []toolCheck `json:"tools"`
	// Trusted: every checked tool's probe is trusted.
	Trusted bool `json:"trusted"`
	// Witnessed: every checked tool that requires a witness saw a
	// present-side sample come back found, so its not_found verdicts are
	// believed.
	Witnessed bool `json:"witnessed"`
	// Written is always false: probe check stores nothing.
	Written bool `json:"written"`
}

type toolCheck struct {
	reconcile.CheckResult
	// SelfCheckDisabled: tools.T.probe.self_check.enabled is false, so
	// the reconciler acts on this probe unchecked whatever this says.
	SelfCheckDisabled bool `json:"self_check_disabled,omitempty"`
	// WitnessNotRequired: tools.T.probe.self_check.require_witness is
	// false, so not_found verdicts are believed without a witness.
	WitnessNotRequired bool `json:"witness_not_required,omitempty"`
}

func newProbeCheckCmd(a *app) *cobra.Command {
	var (
		tools  []string
		asJSON bool
	)
	cmd := &cobra.Command{
		Use:   "check [--tool T]... [--json]",
		Short: "Run the probes' self-check now; writes nothing",
		Long: `Run the self-check the reconciler runs before it acts on a tool's verdicts:
the probe must find up to self_check.samples keys its tool server completed
within self_check.max_age, with their stored values, and must not find a
made-up key (ledgerkeeper-self-check:...). Prints, per tool, the outcome
(trusted, untrusted or inconclusive), a summary and every probe made.

Default: every configured tool with a probe. Writes nothing: the stored
self-check, the alerts and the breaker are the reconciler's.

Exit 0 when every checked tool is trusted, 1 when any is untrusted or
inconclusive, 2 for an unknown tool or a tool without a probe.`,
		Args: args(cobra.NoArgs),
		RunE: func(cmd *cobra.Command, _ []string) error {
			ctx := cmd.Context()
			if err := a.load(); err != nil {
				return err
			}
			for _, t := range tools {
				if err := a.probeable(t); err != nil {
					return err
				}
			}
			pool, err := a.ledgerPool(ctx)
			if err != nil {
				return err
			}
			defer pool.Close()
			eng, closer, err := a.probeEngine(ctx, pool)
			if err != nil {
				return err
			}
			defer closer.Close()
			if len(tools) == 0 {
				for _, t := range a.cfg.ToolNames() {
					if eng.Policy(t).Probe != nil {
						tools = append(tools, t)
					}
				}
				for _, t := range a.registry().Tools() {
					if _, ok := a.cfg.Tools[t]; !ok {
						tools = append(tools, t)
					}
				}
				if len(tools) == 0 {
					return usagef("no configured tool has a probe: nothing to check")
				}
			}
			rep := probeCheckReport{Tools: []toolCheck{}, Trusted: true, Witnessed: true}
			var bad, unwitnessed []string
			for _, t := range tools {
				r, err := eng.SelfCheck(ctx, t)
				if err != nil {
					return fmt.Errorf("probe check of tool %q: %w", t, err)
				}
				tc := toolCheck{CheckResult: r}
				if p := a.cfg.Tools[t].Probe; p != nil && !p.SelfCheckEnabled() {
					tc.SelfCheckDisabled = true
				}
				tc.WitnessNotRequired = eng.Policy(t).WitnessNotRequired
				rep.Tools = append(rep.Tools, tc)
				if !r.Trusted() {
					rep.Trusted = false
					bad = append(bad, t+" "+r.Outcome)
				} else if r.PresentUnverified && !tc.WitnessNotRequired && !tc.SelfCheckDisabled {
					rep.Witnessed = false
					unwitnessed = append(unwitnessed, t)
				}
			}
			if asJSON {
				if err := a.writeJSON(rep); err != nil {
					return err
				}
			} else {
				printProbeCheck(a.stdout, rep)
			}
			if len(bad) > 0 {
				return fmt.Errorf("probe check: %s: while so, no key of the tool changes state (see runbook.md, probe_untrusted)", strings.Join(bad, ", "))
			}
			if len(unwitnessed) > 0 {
				return fmt.Errorf("probe check: %s: present side unverified: no sample came back found, so the probe's not_found verdicts are held "+
					"(see runbook.md, probe_unwitnessed); add a canary: ledgerkeeper probe canary add KEY --tool TOOL --reason TEXT", strings.Join(unwitnessed, ", "))
			}
			return nil
		},
	}
	cmd.Flags().StringArrayVar(&tools, "tool", nil, "check this tool's probe (repeatable; default: every tool with a probe)")
	cmd.Flags().BoolVar(&asJSON, "json", false, "print one JSON document")
	return cmd
}

func printProbeCheck(w io.Writer, rep probeCheckReport) {
	for i, t := range rep.Tools {
		if i > 0 {
			fmt.Fprintln(w)
		}
		fmt.Fprintf(w, "%s: %s\n", t.Tool, strings.ToUpper(t.Outcome))
		fmt.Fprintf(w, "  %s\n", t.Summary)
		switch {
		case t.Outcome == reconcile.CheckUntrusted:
			fmt.Fprintln(w, "  probe untrusted: no key of this tool changes state until a check passes")
		case t.Outcome == reconcile.CheckInconclusive:
			fmt.Fprintln(w, "  inconclusive: the downstream did not answer; no key of this tool changes state until it does")
		case t.Disagreements > 0:
			fmt.Fprintf(w, "  %d disagreement(s): a completed key the probe did not find as stored (deleted or changed downstream since?): inspect it with 'ledgerkeeper probe run KEY'\n", t.Disagreements)
		}
		if t.PresentUnverified {
			why := "no key of this tool was completed by its tool server within self_check.max_age, no canary is declared or marked, and no older completed key was found"
			if len(t.Samples) > 0 {
				why = "no present-side sample came back found"
			}
			fmt.Fprintln(w, "  present side unverified: "+why)
			switch {
			case t.SelfCheckDisabled:
			case t.WitnessNotRequired:
				fmt.Fprintln(w, "  note: tools."+t.Tool+".probe.self_check.require_witness is false: not_found verdicts are believed without a witness (dangerous)")
			default:
				fmt.Fprintln(w, "  not_found verdicts of this tool are held until a sample comes back found: add a canary with 'ledgerkeeper probe canary add KEY --tool "+t.Tool+" --reason TEXT'")
			}
		}
		if t.SelfCheckDisabled {
			fmt.Fprintln(w, "  note: tools."+t.Tool+".probe.self_check.enabled is false: the reconciler acts on this probe unchecked")
		}
		tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
		fmt.Fprintln(tw, "  KEY\tEXPECTED\tGOT\tPASSED\tMISMATCHED FIELDS\tERROR")
		for _, s := range append([]reconcile.SampleCheck{t.Absent}, t.Samples...) {
			passed := "yes"
			if !s.Passed {
				passed = "NO"
				if s.Unreachable {
					passed = "no answer"
				}
			}
			mism := strings.Join(s.Mismatched, ",")
			if mism == "" {
				mism = "-"
			}
			errText := s.Error
			if errText == "" {
				errText = "-"
			}
			fmt.Fprintf(tw, "  %s\t%s\t%s\t%s\t%s\t%s\n", s.Key, s.Expect, s.Verdict, passed, mism, oneLine(errText, 160))
		}
		tw.Flush()
	}
	verdict := "every checked probe is trusted"
	if !rep.Trusted {
		verdict = "NOT every checked probe is trusted"
	}
	fmt.Fprintf(w, "\n%d tool(s) checked: %s. Nothing was written.\n", len(rep.Tools), verdict)
}

// Canaries: effects known to exist downstream (a ticket kept for the
// purpose, never deleted there) that a probe's self-check must find. A
// tool's not_found verdicts are believed only when a present sample came
// back found; a canary is that sample for a tool with no key completed
// recently. Operators mark them here (stored in probe_canaries, audited);
// the configuration may declare more (tools.T.probe.self_check.canaries).

func newProbeCanaryCmd(a *app) *cobra.Command {
	cmd := &cobra.Command{
		Use:   "canary",
		Short: "Add, list or remove canaries: effects known to exist downstream, probed by the self-check",
		Long: `A canary is an effect known to exist downstream and to stay there (a ticket
kept for the purpose, never deleted downstream). The probes' self-check
probes a tool's canaries as present-side witnesses when no key of the tool
was completed recently by its tool server: a tool's not_found verdicts are
believed only when a present sample came back found.

  probe canary add KEY --tool T --reason TEXT     mark one (audited)
  probe canary list [--tool T]                    the marked and the configured ones
  probe canary remove KEY --tool T --reason TEXT  unmark one (audited)`,
	}
	cmd.AddCommand(newProbeCanaryAddCmd(a), newProbeCanaryListCmd(a), newProbeCanaryRemoveCmd(a))
	parentOnly(cmd, false)
	return cmd
}

func newProbeCanaryAddCmd(a *app) *cobra.Command {
	var tool, reason, request, actorFlag string
	cmd := &cobra.Command{
		Use:   "add KEY --tool T --reason TEXT [--request JSON] [--actor NAME]",
		Short: "Mark an effect known to exist downstream as a canary of a tool's probe (audited)",
		Long: `Mark KEY as a canary of tool T: an effect that exists downstream and will
stay (never deleted there), which the self-check probes with T's probe as a
present-side witness. KEY is the idempotency key as the probe addresses it;
it need not be in the ledger. --request is the request body the probe's
templates read ({request.…}), a JSON object; without it, the body of KEY's
ledger row of tool T is stored, if there is one.

Audited (canary_added) with --actor (default $USER) and --reason.

Exit 0 when added; 1 when T already has this canary (nothing changed:
remove it first to replace it) or the database is unreachable; 2 without
--tool or --reason, for a --request that is not a JSON object, or for a
tool that is not configured or has no probe.`,
		Args: args(cobra.ExactArgs(1)),
		RunE: func(cmd *cobra.Command, argv []string) error {
			key := argv[0]
			if err := canaryFlags("add", tool, reason); err != nil {
				return err
			}
			body, err := canaryRequest(request)
			if err != nil {
				return err
			}
			ctx := cmd.Context()
			if err := a.load(); err != nil {
				return err
			}
			if err := a.probeable(tool); err != nil {
				return err
			}
			pool, err := a.ledgerPool(ctx)
			if err != nil {
				return err
			}
			defer pool.Close()
			who := actor(actorFlag)
			c, err := store.AddCanary(ctx, pool, store.Canary{Tool: tool, Key: key, RequestBody: body, Reason: reason, Actor: who})
			switch {
			case errors.Is(err, store.ErrCanaryExists) && c.Actor == "":
				// Removed again between the refused insert and the read.
				return fmt.Errorf("refused: tool %s already had canary %q when you added it; nothing changed (see 'ledgerkeeper probe canary list --tool %s')", tool, key, tool)
			case errors.Is(err, store.ErrCanaryExists):
				return fmt.Errorf("refused: tool %s already has canary %q (added by %s at %s: %s); nothing changed. To replace it, remove it first: ledgerkeeper probe canary remove %s --tool %s --reason TEXT",
					tool, key, c.Actor, ts(c.CreatedAt), c.Reason, key, tool)
			case errors.Is(err, ledger.ErrInvalid):
				return &usageError{fmt.Errorf("probe canary add: %w", err)}
			case err != nil:
				return err
			}
			fmt.Fprintf(a.stdout, "canary %s added for tool %s (by %s: %s); the self-check will probe it as a present-side witness\n", key, tool, who, reason)
			if c.RequestBody == nil {
				fmt.Fprintf(a.stdout, "note: no request body stored (no --request, and %s is not in the ledger under tool %s): a probe whose templates read the request will not find it\n", key, tool)
			}
			if a.declaredCanary(tool, key) {
				fmt.Fprintf(a.stdout, "note: the configuration declares it too (tools.%s.probe.self_check.canaries)\n", tool)
			}
			return nil
		},
	}
	f := cmd.Flags()
	f.StringVar(&tool, "tool", "", "the tool whose probe must find KEY (required)")
	f.StringVar(&reason, "reason", "", "why the effect exists and will stay (recorded in the audit trail; required)")
	f.StringVar(&request, "request", "", "the request body the probe's templates read, a JSON object (default: KEY's ledger row's)")
	f.StringVar(&actorFlag, "actor", "", "operator name for the audit trail (default $USER)")
	return cmd
}

// canaryFlags refuses a canary change without its tool or reason (exit
// 2), before anything connects.
func canaryFlags(verb, tool, reason string) error {
	switch {
	case tool == "":
		return usagef("probe canary %s: --tool is required (the tool whose probe the canary witnesses)", verb)
	case reason == "":
		return usagef("probe canary %s: --reason is required (it goes into the audit trail)", verb)
	}
	return nil
}

// canaryRequest checks --request: absent (nil), or a JSON object, the
// shape of a request body the probe's templates read.
func canaryRequest(request string) (json.RawMessage, error) {
	if request == "" {
		return nil, nil
	}
	var v any
	if err := json.Unmarshal([]byte(request), &v); err != nil {
		return nil, usagef("probe canary add: --request is not valid JSON (%v): give the request body as a JSON object, e.g. '{\"title\":\"canary\"}'", err)
	}
	if _, ok := v.(map[string]any); !ok {
		return nil, usagef("probe canary add: --request must be a JSON object (the request body the probe's templates read), not %s", jsonKind(v))
	}
	return json.RawMessage(request), nil
}

// jsonKind names a decoded JSON value's type for a message.
func jsonKind(v any) string {
	switch v.(type) {
	case nil:
		return "null"
	case []any:
		return "an array"
	case string:
		return "a string"
	case float64:
		return "a number"
	case bool:
		return "a boolean"
	}
	return "an object"
}

// Canary sources in `probe canary list`.
const (
	canaryFromOperator = "operator"
	canaryFromConfig   = "config"
)

// canaryEntry is one line of `probe canary list` (its --json document's
// canaries). Actor, Reason and CreatedAt are an operator's canary's only.
type canaryEntry struct {
	Tool           string          `json:"tool"`
	Key            string          `json:"key"`
	Source         string          `json:"source"`
	Actor          string          `json:"actor,omitempty"`
	CreatedAt      *time.Time      `json:"created_at,omitempty"`
	Reason         string          `json:"reason,omitempty"`
	HasRequestBody bool            `json:"has_request_body"`
	RequestBody    json.RawMessage `json:"request_body,omitempty"`
}

// canaryList is `probe canary list --json`'s document.
type canaryList struct {
	Canaries []canaryEntry `json:"canaries"`
}

func newProbeCanaryListCmd(a *app) *cobra.Command {
	var (
		tool   string
		asJSON bool
	)
	cmd := &cobra.Command{
		Use:   "list [--tool T] [--json]",
		Short: "List the canaries: marked by operators, and declared in the configuration",
		Long: `List the canaries the self-check probes as present-side witnesses: those
operators marked with 'probe canary add' (source operator: who, when, why)
and those declared in the configuration (source config). Per canary: tool,
key, and whether a request body is stored for the probe's templates.

--tool lists one tool's (newest first); default: every tool's.`,
		Args: args(cobra.NoArgs),
		RunE: func(cmd *cobra.Command, _ []string) error {
			ctx := cmd.Context()
			if err := a.load(); err != nil {
				return err
			}
			pool, err := a.ledgerPool(ctx)
			if err != nil {
				return err
			}
			defer pool.Close()
			stored, err := store.Canaries(ctx, pool, tool)
			if err != nil {
				return err
			}
			list := canaryList{Canaries: []canaryEntry{}}
			for _, c := range stored {
				created := c.CreatedAt
				list.Canaries = append(list.Canaries, canaryEntry{Tool: c.Tool, Key: c.Key, Source: canaryFromOperator, Actor: c.Actor,
					CreatedAt: &created, Reason: c.Reason, HasRequestBody: c.RequestBody != nil, RequestBody: c.RequestBody})
			}
			list.Canaries = append(list.Canaries, a.configCanaries(tool)...)
			if asJSON {
				return a.writeJSON(list)
			}
			printCanaries(a.stdout, list, tool)
			return nil
		},
	}
	cmd.Flags().StringVar(&tool, "tool", "", "list this tool's canaries only")
	cmd.Flags().BoolVar(&asJSON, "json", false, "print one JSON document")
	return cmd
}

// configCanaries lists the canaries the configuration declares
// (tools.T.probe.self_check.canaries) for tool, or for every tool when
// tool is "", by tool then in the configuration's order.
func (a *app) configCanaries(tool string) []canaryEntry {
	var out []canaryEntry
	for _, name := range a.cfg.ToolNames() {
		if tool != "" && name != tool {
			continue
		}
		for _, c := range a.configCanaryList(name) {
			out = append(out, canaryEntry{Tool: name, Key: c.Key, Source: canaryFromConfig,
				HasRequestBody: len(c.Request) > 0, RequestBody: json.RawMessage(c.Request)})
		}
	}
	return out
}

// configCanaryList is a tool's declared canaries (none without a probe).
func (a *app) configCanaryList(tool string) []config.Canary {
	t, ok := a.cfg.Tools[tool]
	if !ok || t.Probe == nil {
		return nil
	}
	return t.Probe.SelfCheck.Canaries
}

// declaredCanary reports whether the configuration declares key as a
// canary of tool.
func (a *app) declaredCanary(tool, key string) bool {
	return slices.ContainsFunc(a.configCanaryList(tool), func(c config.Canary) bool { return c.Key == key })
}

func printCanaries(w io.Writer, list canaryList, tool string) {
	if len(list.Canaries) == 0 {
		scope := ""
		if tool != "" {
			scope = " for tool " + tool
		}
		fmt.Fprintf(w, "no canaries%s: add one with 'ledgerkeeper probe canary add KEY --tool T --reason TEXT'\n", scope)
		return
	}
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "TOOL\tKEY\tSOURCE\tBY\tCREATED\tREQUEST BODY\tREASON")
	for _, c := range list.Canaries {
		by, created, reason := "-", "-", "-"
		if c.Source == canaryFromOperator {
			by, reason = c.Actor, oneLine(c.Reason, 200)
		}
		if c.CreatedAt != nil {
			created = ts(*c.CreatedAt)
		}
		body := "none"
		if c.HasRequestBody {
			body = "stored"
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\t%s\n", c.Tool, c.Key, c.Source, by, created, body, reason)
	}
	tw.Flush()
}

func newProbeCanaryRemoveCmd(a *app) *cobra.Command {
	var tool, reason, actorFlag string
	cmd := &cobra.Command{
		Use:   "remove KEY --tool T --reason TEXT [--actor NAME]",
		Short: "Remove an operator's canary (audited)",
		Long: `Remove canary KEY of tool T, marked with 'probe canary add' (one the
configuration declares is removed from the configuration). Audited
(canary_removed) with --actor (default $USER) and --reason; the audit row
keeps who added it, when and why.

Exit 0 when removed; 1 when T has no such canary (nothing changed) or the
database is unreachable; 2 without --tool or --reason.`,
		Args: args(cobra.ExactArgs(1)),
		RunE: func(cmd *cobra.Command, argv []string) error {
			key := argv[0]
			if err := canaryFlags("remove", tool, reason); err != nil {
				return err
			}
			ctx := cmd.Context()
			pool, err := a.ledgerPool(ctx)
			if err != nil {
				return err
			}
			defer pool.Close()
			who := actor(actorFlag)
			c, err := store.RemoveCanary(ctx, pool, tool, key, who, reason)
			switch {
			case errors.Is(err, ledger.ErrNotFound) && a.declaredCanary(tool, key):
				return fmt.Errorf("canary %q of tool %s is declared in the configuration, not marked by an operator; nothing changed: remove it from tools.%s.probe.self_check.canaries", key, tool, tool)
			case errors.Is(err, ledger.ErrNotFound):
				return fmt.Errorf("tool %s has no canary %q marked by an operator; nothing changed (see 'ledgerkeeper probe canary list --tool %s')", tool, key, tool)
			case errors.Is(err, ledger.ErrInvalid):
				return &usageError{fmt.Errorf("probe canary remove: %w", err)}
			case err != nil:
				return err
			}
			fmt.Fprintf(a.stdout, "canary %s removed from tool %s (by %s: %s); it was added by %s at %s: %s\n",
				key, tool, who, reason, c.Actor, ts(c.CreatedAt), c.Reason)
			return nil
		},
	}
	f := cmd.Flags()
	f.StringVar(&tool, "tool", "", "the canary's tool (required)")
	f.StringVar(&reason, "reason", "", "why (recorded in the audit trail; required)")
	f.StringVar(&actorFlag, "actor", "", "operator name for the audit trail (default $USER)")
	return cmd
}
