package main

import (
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"net/url"
	"time"

	"github.com/spf13/cobra"

	"github.com/ledgerkeeper/ledgerkeeper/conformance"
	"github.com/ledgerkeeper/ledgerkeeper/internal/daemon"
)

func newConformanceCmd(a *app) *cobra.Command {
	var (
		tool, mcpTool, keyPrefix, body, otherBody, slowBody, failBody, profile, keyFormat string
		slowDeadline                                                                      time.Duration
		concurrency                                                                       int
		allowMissingKey, asJSON                                                           bool
	)
	cmd := &cobra.Command{
		Use:   "conformance URL --tool T --body JSON [--profile draft-07|ledgerkeeper] [--key-format sf-string|raw] [--mcp-tool NAME] [--slow-body JSON] [--fail-body JSON] [--key-prefix P] [--json]",
		Short: "Test a live HTTP or MCP tool endpoint against the idempotency contract, counting effects with its probe",
		Long: `Run the contract's test battery against a live HTTP tool endpoint, whatever
language or library the tool server is built with: every request is a POST
to URL with an Idempotency-Key header and --body (a valid request of the
tool). Effects are counted with the tool's probe from the configuration file
(tools.T.probe, built as serve builds it): after each scenario the effect
for its key must be found exactly once, never duplicate.

The battery judges the contract, not ledgerkeeper's envelope: a replay is
the first answer again (same status and body) with the effect counted once
at the sink. --profile draft-07 (the default) runs the contract's
assertions: draft-ietf-httpapi-idempotency-key-header-07's MUSTs and
SHOULDs, keys sent as Structured Field Strings ("key"; --key-format raw
for servers that take bare keys), plus the rule that a 5xx is never
replayed. --profile ledgerkeeper adds the markers of ledger.Middleware and
ledger/mcpkey (idempotent_replay, Idempotency-Replayed, _meta replay flag,
-32602 refusals) as assertions named ledgerkeeper/..., and sends bare keys
unless --key-format says otherwise.

Scenarios: probe-control (a key never sent is not_found), same-key-twice
(the first answer 2xx, the second the same status and body, one effect),
key-format (with sf-string keys: the server reads the string's value as
the key), other-arguments (422, still one effect; --other-body, default
--body with a member "_conformance_variant" added), concurrent
(--concurrency requests with one key released together: exactly one
executed, judged at the sink; the 2xx answers all one answer; every other
answer a 409), missing-key (400, skipped with --allow-missing-key),
client-deadline (a --slow-body request whose client gives up after
--slow-deadline: the retry gets 409 or the stored answer, once finished one
stored answer, one effect; skipped without --slow-body), no-cached-5xx (a
--fail-body request the tool answers with a 5xx, retried with its key: the
retry is not that 5xx replayed; skipped without --fail-body).

Keys are --key-prefix + the scenario's name (default conformance-<random>:),
so they can be found and cleaned afterwards. Each scenario really executes
the tool once: point it at a test or staging endpoint.

MCP tool servers: with --mcp-tool NAME, URL is a streamable HTTP MCP
endpoint and every request is a tools/call of NAME with --body as its
arguments and the key in _meta.idempotencyKey; the probe is given the
request as ledger/mcpkey stores it ({"tool": NAME, "arguments": --body},
so request.arguments.PATH). The same scenarios in MCP terms: the replay is
the same result; other arguments and a missing key are refused in either
MCP error style (a JSON-RPC error, or a tool error result); an in-flight
answer is an error carrying a retry-after; no-cached-tool-error retries a
--fail-body call the tool answers with a tool error. --tool still names
the ledger tool whose probe counts effects.

Prints one line per assertion: PASS|FAIL|SKIP name: what was seen, bodies
quoted and clipped (--json: one document). A dead or wrong URL (no answer,
404, 405, an MCP server without the tool) or a probe that cannot answer
stops before the battery with one error. Exit 0 when every assertion
passed, 1 when one failed or nothing could be judged, 2 on a usage or
configuration error.`,
		Args: args(cobra.ExactArgs(1)),
		RunE: func(cmd *cobra.Command, argv []string) error {
			ctx := cmd.Context()
			u, err := url.Parse(argv[0])
			if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
				return usagef("conformance: URL %q is not an http(s) URL", argv[0])
			}
			if tool == "" {
				return usagef("conformance: --tool is required (the tool whose probe counts the effects)")
			}
			if body == "" || !json.Valid([]byte(body)) {
				return usagef("conformance: --body must be a valid JSON request of the tool")
			}
			if concurrency < 2 {
				return usagef("conformance: --concurrency must be at least 2, got %d", concurrency)
			}
			if slowDeadline <= 0 {
				return usagef("conformance: --slow-deadline must be positive")
			}
			if profile != conformance.ProfileDraft07 && profile != conformance.ProfileLedgerkeeper {
				return usagef("conformance: --profile %q: want %s or %s", profile, conformance.ProfileDraft07, conformance.ProfileLedgerkeeper)
			}
			if keyFormat != "" && keyFormat != conformance.KeyFormatSFString && keyFormat != conformance.KeyFormatRaw {
				return usagef("conformance: --key-format %q: want %s or %s", keyFormat, conformance.KeyFormatSFString, conformance.KeyFormatRaw)
			}
			if err := a.load(); err != nil {
				return err
			}
			if err := a.probeable(tool); err != nil {
				return err
			}
			built, closer, err := daemon.BuildProbes(ctx, a.cfg, a.registry())
			if err != nil {
				return &configError{err}
			}
			defer closer.Close()
			if keyPrefix == "" {
				b := make([]byte, 4)
				_, _ = rand.Read(b)
				keyPrefix = "conformance-" + hex.EncodeToString(b) + ":"
			}
			cfg := conformance.Config{
				URL: argv[0], MCPTool: mcpTool, Tool: tool, Probe: built[tool], KeyPrefix: keyPrefix,
				Profile: profile, KeyFormat: keyFormat,
				Body: json.RawMessage(body), SlowDeadline: slowDeadline, AllowMissingKey: allowMissingKey,
				Concurrency: concurrency,
			}
			if otherBody != "" {
				cfg.OtherBody = json.RawMessage(otherBody)
			}
			if slowBody != "" {
				cfg.SlowBody = json.RawMessage(slowBody)
			}
			if failBody != "" {
				cfg.FailBody = json.RawMessage(failBody)
			}
			if err := cfg.Validate(); err != nil {
				return usagef("conformance: %w", err)
			}
			rep, err := conformance.Run(ctx, cfg)
			if err != nil {
				// Nothing was judged (a dead or wrong URL, a probe that
				// cannot answer): one error, exit 1.
				return fmt.Errorf("conformance: %w", err)
			}
			if asJSON {
				err = a.writeJSON(rep)
			} else {
				err = conformance.Print(a.stdout, rep)
			}
			if err != nil {
				return fmt.Errorf("conformance: write report: %w", err)
			}
			if !rep.OK() {
				return errSilentFailure
			}
			return nil
		},
	}
	f := cmd.Flags()
	f.StringVar(&tool, "tool", "", "the tool whose configured probe counts the effects (required)")
	f.StringVar(&mcpTool, "mcp-tool", "", "test an MCP server over streamable HTTP: the MCP tool to call (tools/call, --body its arguments, the key in _meta.idempotencyKey)")
	f.StringVar(&body, "body", "", "a valid request of the tool, JSON (required)")
	f.StringVar(&otherBody, "other-body", "", "the same request with other arguments, JSON (default: --body plus a member _conformance_variant)")
	f.StringVar(&slowBody, "slow-body", "", "a request that takes longer than --slow-deadline to process, JSON (without it client-deadline is skipped)")
	f.StringVar(&failBody, "fail-body", "", "a request the tool answers with a 5xx (MCP: a tool error), JSON; no-cached-5xx retries it (without it no-cached-5xx is skipped)")
	f.StringVar(&profile, "profile", conformance.ProfileDraft07, "which assertions: draft-07 (the contract, any server) or ledgerkeeper (adds ledger.Middleware's and mcpkey's markers)")
	f.StringVar(&keyFormat, "key-format", "", "how keys are sent in Idempotency-Key: sf-string (a quoted Structured Field String, as draft-07 requires) or raw (default: sf-string under --profile draft-07, raw under --profile ledgerkeeper)")
	f.DurationVar(&slowDeadline, "slow-deadline", conformance.DefaultSlowDeadline, "the client deadline of the --slow-body request")
	f.StringVar(&keyPrefix, "key-prefix", "", "prefix of every key sent (default conformance-<random>:)")
	f.IntVar(&concurrency, "concurrency", conformance.DefaultConcurrency, "concurrent requests with one key")
	f.BoolVar(&allowMissingKey, "allow-missing-key", false, "the tool accepts requests without Idempotency-Key: skip the 400 check")
	f.BoolVar(&asJSON, "json", false, "print one JSON document")
	return cmd
}
