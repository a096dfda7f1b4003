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
		tool, mcpTool, keyPrefix, body, otherBody, slowBody string
		slowDeadline                                        time.Duration
		concurrency                                         int
		allowMissingKey, asJSON                             bool
	)
	cmd := &cobra.Command{
		Use:   "conformance URL --tool T --body JSON [--mcp-tool NAME] [--key-prefix P] [--slow-body JSON] [--json]",
		Short: "Test a live HTTP or MCP tool endpoint against the idempotency contract, counting effects with its probe",
		Long: `Run the contract's test battery against a live HTTP tool endpoint, whatever
language the tool server is written in: every request is a POST to URL with
an Idempotency-Key header and --body (a valid request of the tool). Effects
are counted with the tool's probe from the configuration file (tools.T.probe,
built as serve builds it): after each scenario the effect for its key must be
found exactly once, never duplicate.

Scenarios: probe-control (a key never sent is not_found), same-key-twice
(2xx both, the second a replay: idempotent_replay true and the
Idempotency-Replayed header, identical bodies after normalisation),
other-arguments (422, still one effect; --other-body, default --body with a
member "_conformance_variant" added), concurrent (--concurrency requests with
one key released together: one execution, every other answer a 409 or a
replay, one effect), missing-key (400, skipped with --allow-missing-key),
client-deadline (a --slow-body request whose client gives up after
--slow-deadline: the retry gets 409, never a second effect; skipped without
--slow-body), no-cached-5xx (no replayed answer is a 5xx).

Keys are --key-prefix + the scenario's name (default conformance-<random>:),
so they can be found and cleaned afterwards. Each scenario really executes
the tool once: point it at a test or staging endpoint.

MCP tool servers: with --mcp-tool NAME, URL is a streamable HTTP MCP
endpoint and every request is a tools/call of NAME with --body as its
arguments and the key in _meta.idempotencyKey (the ledger/mcpkey contract).
The same scenarios in MCP terms: the replay is a result with
_meta["ledgerkeeper/idempotentReplay"] true and identical content; other
arguments and a missing key get a JSON-RPC invalid-params error (-32602); a
call with the key in flight gets a tool error (IsError); no-cached-5xx does
not apply. --tool still names the ledger tool whose probe counts effects.

Prints one line per assertion: PASS|FAIL|SKIP name: what was seen (--json:
one document). Exit 0 when every assertion passed, 1 when one failed, 2 on
a usage or configuration error.`,
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
				Body: json.RawMessage(body), SlowDeadline: slowDeadline, AllowMissingKey: allowMissingKey,
				Concurrency: concurrency,
			}
			if otherBody != "" {
				cfg.OtherBody = json.RawMessage(otherBody)
			}
			if slowBody != "" {
				cfg.SlowBody = json.RawMessage(slowBody)
			}
			if err := cfg.Validate(); err != nil {
				return usagef("conformance: %w", err)
			}
			rep, err := conformance.Run(ctx, cfg)
			if err != nil {
				return err
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
	f.DurationVar(&slowDeadline, "slow-deadline", conformance.DefaultSlowDeadline, "the client deadline of the --slow-body request")
	f.StringVar(&keyPrefix, "key-prefix", "", "prefix of every key sent (default conformance-<random>:)")
	f.IntVar(&concurrency, "concurrency", conformance.DefaultConcurrency, "concurrent requests with one key")
	f.BoolVar(&allowMissingKey, "allow-missing-key", false, "the tool accepts requests without Idempotency-Key: skip the 400 check")
	f.BoolVar(&asJSON, "json", false, "print one JSON document")
	return cmd
}
