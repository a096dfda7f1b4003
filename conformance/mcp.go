package conformance

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/modelcontextprotocol/go-sdk/jsonrpc"
	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/ledgerkeeper/ledgerkeeper/ledger/mcpkey"
)

// mcpTransport calls the MCP tool cfg.MCPTool over streamable HTTP, the key
// in _meta.idempotencyKey; it reads the answers as package mcpkey writes
// them (the replay marker in _meta, the in-flight tool error, invalid
// params for refusals).
type mcpTransport struct {
	tool string
	cs   *mcp.ClientSession
}

// dialMCP opens the session every call of the battery goes through.
func dialMCP(ctx context.Context, cfg Config) (*mcpTransport, error) {
	client := mcp.NewClient(&mcp.Implementation{Name: "ledgerkeeper-conformance", Version: "1"}, nil)
	tr := &mcp.StreamableClientTransport{Endpoint: cfg.URL, HTTPClient: cfg.Client, DisableStandaloneSSE: true}
	ctx, cancel := context.WithTimeout(ctx, cfg.Timeout)
	defer cancel()
	cs, err := client.Connect(ctx, tr, nil)
	if err != nil {
		return nil, err
	}
	return &mcpTransport{tool: cfg.MCPTool, cs: cs}, nil
}

func (t *mcpTransport) close() { _ = t.cs.Close() }

func (t *mcpTransport) terms() terms {
	const invalidParams = "invalid params (-32602)"
	return terms{
		unit:         "call",
		ok:           "call a result",
		firsts:       "first results",
		inFlight:     "an in-flight tool error",
		inFlights:    "in-flight tool errors",
		retry:        "is an in-flight tool error",
		deadlineSkip: "is an in-flight tool error or a replay, never a second effect",
		outcome:      "result",
		identical:    "identical content",
		otherArgs:    "gets " + invalidParams,
		missingKey:   "a call without _meta." + mcpkey.MetaKey + " gets " + invalidParams,

		otherArgsCode:  jsonrpc.CodeInvalidParams,
		missingKeyCode: jsonrpc.CodeInvalidParams,
	}
}

func (t *mcpTransport) call(ctx context.Context, key string, body json.RawMessage, timeout time.Duration) reply {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	p := &mcp.CallToolParams{Name: t.tool, Arguments: body}
	if key != "" {
		p.Meta = mcp.Meta{mcpkey.MetaKey: key}
	}
	res, err := t.cs.CallTool(ctx, p)
	return mcpAnswer{res: res, err: err}.reply()
}

// finally has nothing to add: an MCP answer has no 5xx to replay.
func (t *mcpTransport) finally() []finding { return nil }

// mcpAnswer is one tools/call outcome.
type mcpAnswer struct {
	res *mcp.CallToolResult
	err error
}

func (a mcpAnswer) ok() bool     { return a.err == nil && a.res != nil && !a.res.IsError }
func (a mcpAnswer) replay() bool { return a.ok() && a.res.Meta[mcpkey.MetaReplay] == true }

func (a mcpAnswer) code() int64 {
	var e *jsonrpc.Error
	if errors.As(a.err, &e) {
		return e.Code
	}
	return 0
}

func (a mcpAnswer) String() string {
	switch {
	case a.err != nil:
		if c := a.code(); c != 0 {
			return fmt.Sprintf("JSON-RPC error %d: %s", c, excerpt([]byte(a.err.Error())))
		}
		return "no answer: " + a.err.Error()
	case a.res == nil:
		return "no result"
	case a.res.IsError:
		return "tool error " + excerpt(contentJSON(a.res))
	case a.replay():
		return "result (replay)"
	}
	return "result"
}

// reply reads the answer for the battery: a replay is marked once, in
// _meta.
func (a mcpAnswer) reply() reply {
	r := reply{
		err:      a.err,
		ok:       a.ok(),
		replay:   a.replay(),
		inFlight: a.err == nil && a.res != nil && a.res.IsError,
		code:     a.code(),
		shown:    excerpt(contentJSON(a.res)),
		text:     a.String(),
		detail:   a.String(),
		markers: []finding{
			{name: "result has _meta[\"" + mcpkey.MetaReplay + "\"] true", ok: a.replay(), seen: a.String()},
		},
	}
	if r.ok {
		r.content = "result " + string(contentJSON(a.res))
	}
	return r
}

// contentJSON is the result's content and structured content, replay
// marker aside, as JSON.
func contentJSON(res *mcp.CallToolResult) []byte {
	if res == nil {
		return nil
	}
	b, err := json.Marshal(struct {
		Content    []mcp.Content `json:"content"`
		Structured any           `json:"structuredContent,omitempty"`
	}{res.Content, res.StructuredContent})
	if err != nil {
		return nil
	}
	return b
}
