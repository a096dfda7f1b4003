package interop_test

// `ledgerkeeper conformance --mcp-tool` against an MCP tool server written
// with the official TypeScript SDK (mcp-ts/server.mjs: McpServer over
// stateless streamable HTTP, the contract in its own in-memory store, no
// ledgerkeeper code). Its refusals are tool errors, the only style
// McpServer has for errors a handler throws, and its in-flight answer is a
// tool error with _meta.retryAfter: the battery must accept both and judge
// effects at its sink.

import (
	"bufio"
	"context"
	"encoding/json"
	"os/exec"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/ledgerkeeper/ledgerkeeper/conformance"
	"github.com/ledgerkeeper/ledgerkeeper/internal/config"
	"github.com/ledgerkeeper/ledgerkeeper/internal/daemon"
	"github.com/ledgerkeeper/ledgerkeeper/ledger/ledgertest/testwait"
	"github.com/ledgerkeeper/ledgerkeeper/probes"
)

// tsServerProbe is create_ticket's probe of the TypeScript server's sink,
// reading the title from the request as mcpkey stores it
// (request.arguments.title), as a production probe of an MCP tool does.
const tsServerProbe = `
tools:
  create_ticket:
    processing_window: 1s
    probe:
      type: http
      url: "${TOOL_URL}/v1/tickets?idempotency_key={key}&title={request.arguments.title}"
      timeout: 3s
      match: "data"
      response_code: 200
retention:
  min_age: 24h
`

// startTSServer runs mcp-ts/server.mjs and returns its base URL.
func startTSServer(t *testing.T, node string) string {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	cmd := exec.CommandContext(ctx, node, "server.mjs")
	cmd.Dir = clientDir
	var stderr strings.Builder
	cmd.Stderr = &stderr
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatalf("node server.mjs: %v", err)
	}
	t.Cleanup(func() {
		cancel()
		_ = cmd.Wait() // killed: its exit status says so
		if t.Failed() {
			t.Logf("server.mjs stderr:\n%s", stderr.String())
		}
	})
	ports := make(chan int, 1)
	go func() {
		var hello struct{ Port int }
		line, err := bufio.NewReader(out).ReadString('\n')
		if err == nil && json.Unmarshal([]byte(line), &hello) == nil {
			ports <- hello.Port
		}
		close(ports)
	}()
	if port := testwait.Recv(t, ports, 30*time.Second); port != 0 {
		return "http://127.0.0.1:" + strconv.Itoa(port)
	}
	t.Fatal("server.mjs did not say its port (its stderr follows)")
	return ""
}

func tsProbe(t *testing.T, baseURL string) probes.Probe {
	t.Helper()
	cfg, err := config.Parse("ts-server.yaml", []byte(tsServerProbe), func(k string) (string, bool) {
		return baseURL, k == "TOOL_URL"
	})
	if err == nil {
		err = daemon.Settle(cfg)
	}
	if err != nil {
		t.Fatal(err)
	}
	built, closer, err := daemon.BuildProbes(context.Background(), cfg, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = closer.Close() })
	return built["create_ticket"]
}

// The TypeScript SDK server passes every assertion of the default profile,
// every scenario run (slow path and deliberate tool error included); under
// the ledgerkeeper profile only marker assertions fail (it has none of
// mcpkey's markers), which keeps the two sets apart.
func TestConformancePassesTypeScriptServer(t *testing.T) {
	node := requireNode(t)
	base := startTSServer(t, node)
	probe := tsProbe(t, base)
	run := func(profile string) conformance.Report {
		rep, err := conformance.Run(context.Background(), conformance.Config{
			URL: base + "/mcp", MCPTool: "create_ticket", Tool: "create_ticket", Probe: probe, Profile: profile,
			KeyPrefix: "ts-" + profile + ":",
			Body:      json.RawMessage(`{"title":"SSO broken","account_id":"A-1029"}`),
			OtherBody: json.RawMessage(`{"title":"SSO fixed","account_id":"A-1029"}`),
			SlowBody:  json.RawMessage(`{"title":"slow","account_id":"A-8"}`), SlowDeadline: 200 * time.Millisecond,
			FailBody:    json.RawMessage(`{"title":"fail","account_id":"A-9"}`),
			Concurrency: 10, Timeout: 10 * time.Second, Settle: 20 * time.Second,
		})
		if err != nil {
			t.Fatal(err)
		}
		var out strings.Builder
		_ = conformance.Print(&out, rep)
		t.Logf("conformance --mcp-tool against the TypeScript SDK server:\n%s", out.String())
		return rep
	}
	rep := run(conformance.ProfileDraft07)
	if !rep.OK() || rep.Skipped != 0 || rep.Passed < 17 {
		t.Fatalf("the TypeScript SDK server should pass the default profile: failed %d, skipped %d, passed %d", rep.Failed, rep.Skipped, rep.Passed)
	}
	for _, a := range rep.Assertions {
		if strings.HasPrefix(a.Name, "other-arguments/the key with other arguments is refused") && !strings.HasPrefix(a.Seen, "tool error ") {
			t.Errorf("the refusal should be a tool error (McpServer's style): %s", a.Seen)
		}
	}
	rep = run(conformance.ProfileLedgerkeeper)
	for _, a := range rep.Assertions {
		if a.Status == conformance.Fail && !strings.HasPrefix(a.Name, "ledgerkeeper/") {
			t.Errorf("under the ledgerkeeper profile a contract assertion failed: %s: %s", a.Name, a.Seen)
		}
	}
	if rep.OK() {
		t.Error("the ledgerkeeper profile should fail a server without mcpkey's markers")
	}
}
