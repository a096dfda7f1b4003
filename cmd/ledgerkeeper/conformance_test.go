package main

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/ledgerkeeper/ledgerkeeper/internal/exampletool"
	"github.com/ledgerkeeper/ledgerkeeper/internal/pgtest"
	"github.com/ledgerkeeper/ledgerkeeper/ledger/mcpkey"
)

// conformanceServer starts the example tool server on a real database; with
// ignoreArgs its POST hands the middleware each key's first arguments, a
// server that ignores the fingerprint.
func conformanceServer(t *testing.T, ignoreArgs bool) (*httptest.Server, *pgtest.DB) {
	t.Helper()
	db := pgtest.New(t)
	tool := exampletool.New(exampletool.Config{Ledger: db.Pool, Sink: db.Pool})
	if err := tool.Migrate(context.Background()); err != nil {
		t.Fatal(err)
	}
	h := tool.Handler()
	if ignoreArgs {
		real := h
		var mu sync.Mutex
		first := map[string][]byte{}
		h = http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			if r.Method == http.MethodPost {
				b, _ := io.ReadAll(r.Body)
				mu.Lock()
				if f, ok := first[r.Header.Get("Idempotency-Key")]; ok && r.Header.Get("Idempotency-Key") != "" {
					b = f
				} else {
					first[r.Header.Get("Idempotency-Key")] = b
				}
				mu.Unlock()
				r.Body, r.ContentLength = io.NopCloser(bytes.NewReader(b)), int64(len(b))
			}
			real.ServeHTTP(w, r)
		})
	}
	srv := httptest.NewServer(h)
	t.Cleanup(srv.Close)
	t.Setenv("TOOL_URL", srv.URL)
	t.Setenv("SLACK_API_URL", "http://127.0.0.1:1/api/")
	return srv, db
}

const conformanceBody = `{"title":"Printer on fire","account_id":"A-7"}`

// `conformance --profile ledgerkeeper` on the demo's configuration passes
// the example tool server, markers included: exit 0, one line per
// assertion, keys under the prefix, one ticket each. The default profile
// with --key-format raw (ledger.Middleware takes the header's bytes as the
// key) passes it too, without the marker assertions.
func TestConformancePassesExampleTool(t *testing.T) {
	srv, db := conformanceServer(t, false)
	cfg := writeFile(t, "demo.yaml", string(demoConfig))
	code, out, stderr := cli(t, "conformance", srv.URL+"/tools/create_ticket", "--tool", "create_ticket", "--config", cfg,
		"--body", conformanceBody, "--key-prefix", "ci-1:", "--profile", "ledgerkeeper")
	if code != 0 || strings.Contains(out, "FAIL ") || !strings.Contains(out, "PASS concurrent/exactly one request executed: verdict found") ||
		!strings.Contains(out, "PASS ledgerkeeper/same-key-twice/second answer says idempotent_replay true") ||
		!strings.Contains(out, "SKIP client-deadline/") || !strings.Contains(out, "--slow-body") || !strings.Contains(out, "--fail-body") ||
		!strings.Contains(out, "(profile ledgerkeeper, keys raw; keys ci-1:*)") {
		t.Fatalf("conformance: %d\n%s\n%s", code, out, stderr)
	}
	var n int
	if err := db.Pool.QueryRow(context.Background(), `SELECT count(*) FROM tickets WHERE idempotency_key LIKE 'ci-1:%'`).Scan(&n); err != nil || n != 3 {
		t.Fatalf("tickets under the prefix = %d (%v), want 3 (same-key-twice, other-arguments, concurrent)", n, err)
	}
	if err := db.Pool.QueryRow(context.Background(), `SELECT count(*) FROM idempotency_keys WHERE key LIKE 'ci-1:%'`).Scan(&n); err != nil || n != 3 {
		t.Fatalf("keys under the prefix = %d (%v), want 3", n, err)
	}
	t.Logf("conformance on the example tool:\n%s", out)

	code, out, stderr = cli(t, "conformance", srv.URL+"/tools/create_ticket", "--tool", "create_ticket", "--config", cfg,
		"--body", conformanceBody, "--key-prefix", "ci-2:", "--key-format", "raw", "--concurrency", "5")
	if code != 0 || strings.Contains(out, "FAIL ") || strings.Contains(out, "ledgerkeeper/") || !strings.Contains(out, "(profile draft-07, keys raw;") {
		t.Fatalf("conformance --key-format raw: %d\n%s\n%s", code, out, stderr)
	}
}

// A server that ignores the fingerprint: exit 1, the failed assertion named;
// --json is one document saying the same.
func TestConformanceFailsNamingTheAssertion(t *testing.T) {
	srv, _ := conformanceServer(t, true)
	cfg := writeFile(t, "demo.yaml", string(demoConfig))
	code, out, stderr := cli(t, "conformance", srv.URL+"/tools/create_ticket", "--tool", "create_ticket", "--config", cfg,
		"--body", conformanceBody, "--concurrency", "5", "--key-format", "raw", "--json")
	if code != 1 {
		t.Fatalf("exit %d, want 1\n%s\n%s", code, out, stderr)
	}
	var rep struct {
		KeyPrefix  string `json:"key_prefix"`
		Profile    string `json:"profile"`
		KeyFormat  string `json:"key_format"`
		Failed     int    `json:"failed"`
		Assertions []struct{ Status, Name, Seen string }
	}
	if err := json.Unmarshal([]byte(out), &rep); err != nil {
		t.Fatalf("not one JSON document: %v\n%s", err, out)
	}
	if rep.Failed != 1 || !strings.HasPrefix(rep.KeyPrefix, "conformance-") || rep.Profile != "draft-07" || rep.KeyFormat != "raw" {
		t.Fatalf("report: %+v", rep)
	}
	for _, a := range rep.Assertions {
		if a.Status == "FAIL" && (a.Name != "other-arguments/the key with other arguments gets 422" || !strings.HasPrefix(a.Seen, "201 ")) {
			t.Errorf("unexpected failure %+v", a)
		}
	}
}

// A dead URL stops before the battery: one error on stderr, nothing on
// stdout, exit 1.
func TestConformanceDeadURLIsOneError(t *testing.T) {
	srv, _ := conformanceServer(t, false)
	dead := httptest.NewServer(http.NotFoundHandler())
	deadURL := dead.URL + "/tools/create_ticket"
	dead.Close()
	cfg := writeFile(t, "demo.yaml", string(demoConfig))
	for _, url := range []string{deadURL, srv.URL + "/tools/nope"} {
		code, out, stderr := cli(t, "conformance", url, "--tool", "create_ticket", "--config", cfg, "--body", conformanceBody)
		lines := strings.Split(strings.TrimSpace(stderr), "\n")
		if code != 1 || out != "" || len(lines) != 1 || !strings.HasPrefix(lines[0], "ledgerkeeper: conformance: ") || !strings.HasSuffix(lines[0], "nothing was judged") {
			t.Errorf("%s: exit %d, want 1 with one error line\nstdout: %q\nstderr: %q", url, code, out, stderr)
		}
	}
}

// Usage mistakes exit 2 before anything is sent.
func TestConformanceUsage(t *testing.T) {
	srv, db := conformanceServer(t, false)
	cfg := writeFile(t, "demo.yaml", string(demoConfig))
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"conformance", srv.URL, "--body", conformanceBody}, "--tool is required"},
		{[]string{"conformance", srv.URL, "--tool", "create_ticket", "--body", "{nope"}, "--body must be a valid JSON"},
		{[]string{"conformance", srv.URL, "--tool", "charge_card", "--body", conformanceBody}, `unknown tool "charge_card"`},
		{[]string{"conformance", "ftp://x", "--tool", "create_ticket", "--body", conformanceBody}, "not an http(s) URL"},
		{[]string{"conformance", srv.URL, "--tool", "create_ticket", "--body", `[1]`}, "--other-body"},
		{[]string{"conformance", srv.URL, "--tool", "create_ticket", "--body", conformanceBody, "--profile", "draft-06"}, `--profile "draft-06"`},
		{[]string{"conformance", srv.URL, "--tool", "create_ticket", "--body", conformanceBody, "--key-format", "token"}, `--key-format "token"`},
		{[]string{"conformance", srv.URL, "--tool", "create_ticket", "--body", conformanceBody, "--fail-body", "{"}, "fail body: not valid JSON"},
	} {
		code, out, stderr := cli(t, append(c.args, "--config", cfg)...)
		if code != 2 || !strings.Contains(stderr, c.want) {
			t.Errorf("%v: exit %d, want 2 with %q\n%s\n%s", c.args, code, c.want, out, stderr)
		}
	}
	if n := db.Count(t, "tickets"); n != 0 {
		t.Fatalf("a usage error sent requests: %d tickets", n)
	}
}

// mcpTicketSink is an MCP create_ticket's downstream: effects per key,
// served as GET /v1/tickets?idempotency_key=K → {"data":[...]}, the demo
// configuration's probe.
type mcpTicketSink struct {
	mu      sync.Mutex
	effects map[string][]map[string]any
}

func (s *mcpTicketSink) handle(ctx context.Context, req *mcp.CallToolRequest) (*mcp.CallToolResult, error) {
	key, _ := req.Params.Meta[mcpkey.MetaKey].(string)
	s.mu.Lock()
	s.effects[key] = append(s.effects[key], map[string]any{"id": key, "created_at": "2026-01-01T00:00:00Z"})
	n := len(s.effects[key])
	s.mu.Unlock()
	return &mcp.CallToolResult{Content: []mcp.Content{&mcp.TextContent{Text: "ticket created"}}, StructuredContent: map[string]any{"ticket": n}}, nil
}

func (s *mcpTicketSink) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	s.mu.Lock()
	data := s.effects[r.URL.Query().Get("idempotency_key")]
	if data == nil {
		data = []map[string]any{}
	}
	b, _ := json.Marshal(map[string]any{"data": data})
	s.mu.Unlock()
	_, _ = w.Write(b)
}

func mcpConformanceServer(t *testing.T, keyed bool) string {
	t.Helper()
	sink := &mcpTicketSink{effects: map[string][]map[string]any{}}
	sinkSrv := httptest.NewServer(sink)
	t.Cleanup(sinkSrv.Close)
	server := mcp.NewServer(&mcp.Implementation{Name: "tickets", Version: "test"}, nil)
	tool := &mcp.Tool{Name: "open_ticket", InputSchema: map[string]any{"type": "object"}}
	if keyed {
		mcpkey.AddTool(server, tool, mcpkey.Config{DB: pgtest.New(t).Pool, Tool: "create_ticket"}, sink.handle)
	} else {
		server.AddTool(tool, sink.handle)
	}
	srv := httptest.NewServer(mcp.NewStreamableHTTPHandler(func(*http.Request) *mcp.Server { return server }, nil))
	t.Cleanup(srv.Close)
	t.Setenv("TOOL_URL", sinkSrv.URL)
	t.Setenv("SLACK_API_URL", "http://127.0.0.1:1/api/")
	return srv.URL
}

// `conformance --mcp-tool` passes an mcpkey tool over streamable HTTP and
// fails, naming the assertions, a tool that runs every call.
func TestConformanceMCP(t *testing.T) {
	cfg := writeFile(t, "demo.yaml", string(demoConfig))
	url := mcpConformanceServer(t, true)
	code, out, stderr := cli(t, "conformance", url, "--mcp-tool", "open_ticket", "--tool", "create_ticket", "--config", cfg,
		"--body", conformanceBody, "--concurrency", "8", "--profile", "ledgerkeeper")
	if code != 0 || strings.Contains(out, "FAIL ") || !strings.Contains(out, "PASS concurrent/exactly one call executed: verdict found") ||
		!strings.Contains(out, `PASS ledgerkeeper/same-key-twice/second result has _meta["ledgerkeeper/idempotentReplay"] true`) {
		t.Fatalf("conformance on an mcpkey tool: %d\n%s\n%s", code, out, stderr)
	}
	url = mcpConformanceServer(t, false)
	code, out, stderr = cli(t, "conformance", url, "--mcp-tool", "open_ticket", "--tool", "create_ticket", "--config", cfg,
		"--body", conformanceBody, "--concurrency", "8")
	for _, want := range []string{
		"FAIL same-key-twice/second call gets the first result replayed (same content)",
		"FAIL same-key-twice/one effect: verdict duplicate",
		"FAIL concurrent/exactly one call executed: verdict duplicate",
		"FAIL missing-key/a call without _meta.idempotencyKey is refused",
	} {
		if code != 1 || !strings.Contains(out, want) {
			t.Errorf("unprotected MCP tool: exit %d, want 1 with %q\n%s\n%s", code, want, out, stderr)
		}
	}
}
