package conformance_test

import (
	"context"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"sync"
	"testing"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/ledgerkeeper/ledgerkeeper/conformance"
	"github.com/ledgerkeeper/ledgerkeeper/internal/pgtest"
	"github.com/ledgerkeeper/ledgerkeeper/ledger/mcpkey"
)

// mcpSink counts the MCP tool's effects per key and serves them as
// GET /v1/tickets?idempotency_key=K → {"data":[...]} for the http probe.
type mcpSink struct {
	mu      sync.Mutex
	effects map[string][]map[string]any
}

func (s *mcpSink) handle(ctx context.Context, req *mcp.CallToolRequest) (*mcp.CallToolResult, error) {
	key := ""
	if v, ok := req.Params.Meta[mcpkey.MetaKey].(string); ok {
		key = v
	}
	s.mu.Lock()
	n := len(s.effects[key]) + 1
	s.effects[key] = append(s.effects[key], map[string]any{"id": key, "created_at": "2026-01-01T00:00:00Z", "n": n})
	s.mu.Unlock()
	return &mcp.CallToolResult{
		Content:           []mcp.Content{&mcp.TextContent{Text: "ticket created"}},
		StructuredContent: map[string]any{"ticket": n, "arguments": req.Params.Arguments},
	}, nil
}

func (s *mcpSink) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	s.mu.Lock()
	data := s.effects[r.URL.Query().Get("idempotency_key")]
	if data == nil {
		data = []map[string]any{}
	}
	b, _ := json.Marshal(map[string]any{"data": data})
	s.mu.Unlock()
	w.Header().Set("Content-Type", "application/json")
	_, _ = w.Write(b)
}

// mcpWorld serves create_ticket over streamable HTTP, wrapped by mcpkey
// when keyed, its effects in a sink the http probe counts.
func mcpWorld(t *testing.T, keyed bool) conformance.Report {
	t.Helper()
	sink := &mcpSink{effects: map[string][]map[string]any{}}
	sinkSrv := httptest.NewServer(sink)
	t.Cleanup(sinkSrv.Close)
	server := mcp.NewServer(&mcp.Implementation{Name: "tickets", Version: "test"}, nil)
	tool := &mcp.Tool{Name: "create_ticket", InputSchema: map[string]any{"type": "object"}}
	if keyed {
		db := pgtest.New(t)
		mcpkey.AddTool(server, tool, mcpkey.Config{DB: db.Pool}, sink.handle)
	} else {
		server.AddTool(tool, sink.handle)
	}
	srv := httptest.NewServer(mcp.NewStreamableHTTPHandler(func(*http.Request) *mcp.Server { return server }, nil))
	t.Cleanup(srv.Close)
	rep, err := conformance.Run(context.Background(), conformance.Config{
		URL: srv.URL, MCPTool: "create_ticket", Tool: "create_ticket", Probe: buildProbe(t, sinkSrv.URL),
		KeyPrefix: "mcp-conf:", Body: json.RawMessage(body), Concurrency: 10,
	})
	if err != nil {
		t.Fatal(err)
	}
	return rep
}

func TestMCPToolPasses(t *testing.T) {
	rep := mcpWorld(t, true)
	if !rep.OK() {
		t.Fatalf("failed: %v\n%+v", failed(rep), rep.Assertions)
	}
	if rep.Passed == 0 || rep.Skipped != 1 {
		t.Fatalf("want passes and one skip (client-deadline): %+v", rep)
	}
}

func TestMCPCatchesUnprotectedTool(t *testing.T) {
	rep := mcpWorld(t, false)
	wantFailed(t, rep, "same-key-twice/second result has _meta[\"ledgerkeeper/idempotentReplay\"] true",
		"same-key-twice/one effect", "concurrent/exactly one call executed", "concurrent/exactly one effect")
}
