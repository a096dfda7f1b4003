package reconcile_test

// The MCP binding (ledger/mcpkey) and the reconciler together: this test
// lives in the daemon's module because the tool module (ledger/go.mod) does
// not depend on the reconciler.

import (
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"net/http/httptest"
	"sync"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/jsonrpc"
	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/ledgerkeeper/ledgerkeeper/internal/pgtest"
	"github.com/ledgerkeeper/ledgerkeeper/ledger"
	"github.com/ledgerkeeper/ledgerkeeper/ledger/mcpkey"
	"github.com/ledgerkeeper/ledgerkeeper/probes"
	"github.com/ledgerkeeper/ledgerkeeper/reconcile"
)

// mcpSink is an MCP tool's downstream: effects counted per key; the first
// call crashes (panics) right after its effect.
type mcpSink struct {
	mu      sync.Mutex
	effects map[string]int
	crashed bool
}

func (s *mcpSink) handle(ctx context.Context, _ *mcp.CallToolRequest) (*mcp.CallToolResult, error) {
	a, _ := ledger.AttemptFromContext(ctx)
	s.mu.Lock()
	s.effects[a.Key]++
	n := s.effects[a.Key]
	crash := !s.crashed
	s.crashed = true
	s.mu.Unlock()
	if crash {
		panic("crash after the effect")
	}
	return &mcp.CallToolResult{
		Content:           []mcp.Content{&mcp.TextContent{Text: "ticket created"}},
		StructuredContent: map[string]any{"ticket": n, "key": a.Key},
	}, nil
}

func (s *mcpSink) of(key string) int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.effects[key]
}

// The whole crash story with the real reconciler: the handler performs its
// effect at the sink and crashes, so the key stays processing; once the key
// is past its window a reconcile pass probes the sink, finds the effect and
// stores its outcome; the client's retry with the same key, over the
// streamable HTTP transport, gets that outcome as a replay, and the sink
// still counts exactly one effect.
func TestCrashAfterEffectReconciledThenReplayed(t *testing.T) {
	db := pgtest.New(t)
	sink := &mcpSink{effects: map[string]int{}}
	server := mcp.NewServer(&mcp.Implementation{Name: "tickets", Version: "test"}, nil)
	mcpkey.AddTool(server, &mcp.Tool{Name: "create_ticket", InputSchema: map[string]any{"type": "object"}},
		mcpkey.Config{DB: db.Pool, Tool: "tickets"}, sink.handle)
	srv := httptest.NewServer(mcp.NewStreamableHTTPHandler(func(*http.Request) *mcp.Server { return server }, nil))
	t.Cleanup(srv.Close)
	client := mcp.NewClient(&mcp.Implementation{Name: "orchestrator", Version: "test"}, nil)
	cs, err := client.Connect(bg, &mcp.StreamableClientTransport{Endpoint: srv.URL, DisableStandaloneSSE: true}, nil)
	if err != nil {
		t.Fatalf("connect: %v", err)
	}
	t.Cleanup(func() { _ = cs.Close() })
	call := func() (*mcp.CallToolResult, error) {
		return cs.CallTool(bg, &mcp.CallToolParams{
			Name:      "create_ticket",
			Arguments: map[string]any{"title": "SSO broken", "account_id": "A-1029"},
			Meta:      mcp.Meta{mcpkey.MetaKey: "k-x"},
		})
	}

	_, err = call()
	var rpcErr *jsonrpc.Error
	if !errors.As(err, &rpcErr) || rpcErr.Code != jsonrpc.CodeInternalError {
		t.Fatalf("crashing handler: want JSON-RPC error %d, got %v", jsonrpc.CodeInternalError, err)
	}
	if k := row(t, db, "k-x"); k.Status != ledger.StatusProcessing {
		t.Fatalf("after the crash: status %s, want processing", k.Status)
	}

	// Age the key well past its window (1s + the default grace).
	db.Exec(t, `UPDATE idempotency_keys SET claimed_at = now() - interval '10 minutes',
		 created_at = now() - interval '10 minutes' WHERE key = $1`, "k-x")

	// The tool's probe looks the key up at the sink, as an http or sql probe
	// would at the real downstream.
	probe := probes.ProbeFunc(func(_ context.Context, k probes.Key) probes.Result {
		n := sink.of(k.Key)
		if n == 0 {
			return probes.Result{Verdict: probes.NotFound, Evidence: json.RawMessage(`{"effects":0}`)}
		}
		body, err := json.Marshal(map[string]any{"ticket": n, "key": k.Key})
		if err != nil {
			return probes.Result{Verdict: probes.Unknown, Err: err}
		}
		return probes.Result{Verdict: probes.Found, Outcome: &probes.Outcome{Code: 200, Body: body},
			Evidence: json.RawMessage(`{"effects":1}`)}
	})
	eng := reconcile.New(reconcile.Config{
		Actor: "mcpkey-test",
		Tools: map[string]reconcile.Policy{"tickets": {
			ProcessingWindow:  time.Second,
			Probe:             probe,
			SelfCheckDisabled: true,
		}},
	}, db.Pool, nil, nil)
	rep := run(t, eng, reconcile.Options{})
	if rep.Actions[reconcile.ActionCompleted] != 1 {
		t.Fatalf("reconcile actions = %v, want one %s", rep.Actions, reconcile.ActionCompleted)
	}
	k := row(t, db, "k-x")
	if k.Status != ledger.StatusCompleted || k.ResponseCode == nil || *k.ResponseCode != 200 {
		t.Fatalf("after reconcile: status %s code %v, want completed 200", k.Status, k.ResponseCode)
	}

	res, err := call()
	if err != nil {
		t.Fatalf("retry: %v", err)
	}
	sc, _ := res.StructuredContent.(map[string]any)
	if res.IsError || res.Meta[mcpkey.MetaReplay] != true || sc["ticket"] != float64(1) || sc["key"] != "k-x" {
		t.Fatalf("retry: want the reconciled outcome replayed, got %+v", res)
	}
	if got := sink.of("k-x"); got != 1 {
		t.Fatalf("effects = %d, want 1", got)
	}
}
