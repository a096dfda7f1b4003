package main

import (
	"context"
	"fmt"
	"net"
	"net/http"
	"sync/atomic"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/ledgerkeeper/ledgerkeeper/ledger/mcpkey"
)

// mcpStep shows the MCP binding: one keyed tool on the SDK's streamable
// HTTP server on loopback, called twice with one _meta.idempotencyKey. The
// first call runs the tool once; the second is a replay of its result.
func (d *demo) mcpStep(ctx context.Context) error {
	d.say("\n-- 7. the same contract for an MCP tool (ledger/mcpkey), over streamable HTTP --")
	var effects atomic.Int64
	server := mcp.NewServer(&mcp.Implementation{Name: "demo-notes", Version: "demo"}, nil)
	mcpkey.AddTool(server, &mcp.Tool{Name: "add_note", InputSchema: map[string]any{"type": "object"}},
		mcpkey.Config{DB: d.pool, Tool: "add_note"},
		func(context.Context, *mcp.CallToolRequest) (*mcp.CallToolResult, error) {
			n := effects.Add(1)
			return &mcp.CallToolResult{Content: []mcp.Content{&mcp.TextContent{Text: fmt.Sprintf("note %d added", n)}}}, nil
		})
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return fmt.Errorf("demo MCP server: %w", err)
	}
	srv := &http.Server{Handler: mcp.NewStreamableHTTPHandler(func(*http.Request) *mcp.Server { return server }, nil),
		ReadHeaderTimeout: 5 * time.Second}
	go func() { _ = srv.Serve(ln) }()
	defer srv.Close()

	client := mcp.NewClient(&mcp.Implementation{Name: "demo-orchestrator", Version: "demo"}, nil)
	cs, err := client.Connect(ctx, &mcp.StreamableClientTransport{Endpoint: "http://" + ln.Addr().String(), DisableStandaloneSSE: true}, nil)
	if err != nil {
		return fmt.Errorf("demo MCP client: %w", err)
	}
	defer func() { _ = cs.Close() }()
	const key = "wf-6:step-1:add_note"
	for _, label := range []string{"first call", "retry     "} {
		res, err := cs.CallTool(ctx, &mcp.CallToolParams{Name: "add_note", Arguments: map[string]any{"text": "call back A-7"},
			Meta: mcp.Meta{mcpkey.MetaKey: key}})
		if err != nil {
			return fmt.Errorf("demo MCP call: %w", err)
		}
		text := ""
		if len(res.Content) > 0 {
			if tc, ok := res.Content[0].(*mcp.TextContent); ok {
				text = tc.Text
			}
		}
		d.say("%s %s -> %q replay=%v", label, key, text, res.Meta[mcpkey.MetaReplay] == true)
	}
	if n := effects.Load(); n != 1 {
		return fmt.Errorf("demo MCP step: add_note ran %d times for one key, want 1", n)
	}
	d.say("add_note ran %d time(s) for one key", effects.Load())
	return nil
}
