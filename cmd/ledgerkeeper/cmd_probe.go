package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/spf13/cobra"

	"github.com/ledgerkeeper/ledgerkeeper/internal/daemon"
	"github.com/ledgerkeeper/ledgerkeeper/internal/safetext"
	"github.com/ledgerkeeper/ledgerkeeper/ledger"
	"github.com/ledgerkeeper/ledgerkeeper/probes"
	"github.com/ledgerkeeper/ledgerkeeper/reconcile"
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
		Short: "Probe a key by hand, or run the probes' self-check now (writes nothing)",
		Long: `Ask a tool's downstream what the reconciler would ask it, writing nothing:

  probe run KEY     probe one key, whatever its status, and show the request
                    made, the answer, the verdict and the outcome that would
                    be stored;
  probe check       run the probes' self-check now: completed keys must come
                    back found with their stored values, a made-up key must
                    come back not_found.

Neither writes to the ledger, the audit trail, the alert outbox or the
self-check record: what the reconciler does is unchanged.`,
	}
	cmd.AddCommand(newProbeRunCmd(a), newProbeCheckCmd(a))
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
func (a *app) probeEngine(ctx context.Context, pool *pgxpool.Pool) (*reconcile.Engine, io.Closer, error) {
	eng, closer, err := daemon.BuildEngine(ctx, a.cfg, pool, a.registry(), "operator:"+actor(""), a.logger, nil)
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
		row("self-check", "none stored yet: run 'ledgerkeeper probe check --tool %s'", rep.Tool)
	}
	tw.Flush()
}

// probeCheckReport is `probe check`'s document.
type probeCheckReport struct {
	Tools []toolCheck `json:"tools"`
	// Trusted: every checked tool's probe is trusted.
	Trusted bool `json:"trusted"`
	// Written is always false: probe check stores nothing.
	Written bool `json:"written"`
}

type toolCheck struct {
	reconcile.CheckResult
	// SelfCheckDisabled: tools.T.probe.self_check.enabled is false, so
	// the reconciler acts on this probe unchecked whatever this says.
	SelfCheckDisabled bool `json:"self_check_disabled,omitempty"`
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
			rep := probeCheckReport{Tools: []toolCheck{}, Trusted: true}
			var bad []string
			for _, t := range tools {
				r, err := eng.SelfCheck(ctx, t)
				if err != nil {
					return fmt.Errorf("probe check of tool %q: %w", t, err)
				}
				tc := toolCheck{CheckResult: r}
				if p := a.cfg.Tools[t].Probe; p != nil && !p.SelfCheckEnabled() {
					tc.SelfCheckDisabled = true
				}
				rep.Tools = append(rep.Tools, tc)
				if !r.Trusted() {
					rep.Trusted = false
					bad = append(bad, t+" "+r.Outcome)
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
			fmt.Fprintln(w, "  present side unverified: no key of this tool was completed by its tool server within self_check.max_age")
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
