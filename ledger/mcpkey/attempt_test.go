package mcpkey_test

import (
	"context"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/ledgerkeeper/ledgerkeeper/ledger"
	"github.com/ledgerkeeper/ledgerkeeper/ledger/ledgertest"
	"github.com/ledgerkeeper/ledgerkeeper/ledger/mcpkey"
)

// An MCP handler finds its attempt with ledger.AttemptFromContext, as an
// HTTP handler under ledger.Middleware does: one Attempt, one context key,
// naming the claim the row holds.
func TestLedgerAttemptFromContextInsideAnMCPHandler(t *testing.T) {
	db := ledgertest.New(t)
	type report struct {
		attempt ledger.Attempt
		beat    error // the attempt's own heartbeat, from inside the handler
	}
	seen := make(chan report, 1)
	server := mcp.NewServer(&mcp.Implementation{Name: "tickets", Version: "test"}, nil)
	mcpkey.AddTool(server, &mcp.Tool{Name: "create_ticket", InputSchema: objectSchema}, mcpkey.Config{DB: db.Pool, Tool: "tickets"},
		func(ctx context.Context, _ *mcp.CallToolRequest) (*mcp.CallToolResult, error) {
			a, ok := ledger.AttemptFromContext(ctx)
			if !ok {
				return &mcp.CallToolResult{IsError: true, Content: []mcp.Content{&mcp.TextContent{Text: "no attempt in the context"}}}, nil
			}
			seen <- report{a, a.Heartbeat(ctx)}
			return &mcp.CallToolResult{Content: []mcp.Content{&mcp.TextContent{Text: "ticket created"}}}, nil
		})
	srv := httptest.NewServer(mcp.NewStreamableHTTPHandler(func(*http.Request) *mcp.Server { return server }, nil))
	t.Cleanup(srv.Close)
	cs := (&bundle{db: db, srv: srv}).connect(t, "")

	if res := mustCall(t, cs, "k-a", args); res.IsError {
		t.Fatalf("call: %+v", res)
	}
	var got report
	select {
	case got = <-seen:
	default:
		t.Fatal("the handler did not report its attempt")
	}
	k := row(t, db, "k-a")
	if a := got.attempt; a.Key != "k-a" || a.Tool != "tickets" || !a.ClaimedAt.Equal(k.ClaimedAt) {
		t.Fatalf("attempt = %+v, want key k-a, tool tickets, claimed_at %s", a, k.ClaimedAt.Format(time.RFC3339Nano))
	}
	if got.beat != nil || k.HeartbeatAt == nil {
		t.Fatalf("the attempt's heartbeat from the handler: %v, heartbeat_at %v; want it recorded", got.beat, k.HeartbeatAt)
	}
}
