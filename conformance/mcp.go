package conformance

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"sort"
	"strings"
	"time"

	"github.com/modelcontextprotocol/go-sdk/jsonrpc"
	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/ledgerkeeper/ledgerkeeper/ledger/mcpkey"
)

// mcpTransport calls the MCP tool cfg.MCPTool over streamable HTTP, the key
// in _meta.idempotencyKey. It judges answers by the contract in MCP terms:
// a replay is the same result; a refusal is either of MCP's two error
// styles (a JSON-RPC error, or a result with isError); an in-flight answer
// is an error carrying a retry-after. package mcpkey's markers (the replay
// flag in _meta, refusals as -32602) are findings for the ledgerkeeper
// profile only.
type mcpTransport struct {
	tool string
	cs   *mcp.ClientSession
}

// dialMCP opens the session every call of the battery goes through, and
// checks that the server has the tool: otherwise nothing can be judged.
func dialMCP(ctx context.Context, cfg Config) (*mcpTransport, error) {
	client := mcp.NewClient(&mcp.Implementation{Name: "ledgerkeeper-conformance", Version: "1"}, nil)
	tr := &mcp.StreamableClientTransport{Endpoint: cfg.URL, HTTPClient: cfg.Client, DisableStandaloneSSE: true}
	ctx, cancel := context.WithTimeout(ctx, cfg.Timeout)
	defer cancel()
	cs, err := client.Connect(ctx, tr, nil)
	if err != nil {
		return nil, notReached("cannot open an MCP session with %s over streamable HTTP: %v", redact(cfg.URL), err)
	}
	var names []string
	for tool, err := range cs.Tools(ctx, nil) {
		if err != nil {
			_ = cs.Close()
			return nil, notReached("MCP server at %s: tools/list: %v", redact(cfg.URL), err)
		}
		if tool.Name == cfg.MCPTool {
			return &mcpTransport{tool: cfg.MCPTool, cs: cs}, nil
		}
		names = append(names, tool.Name)
	}
	_ = cs.Close()
	sort.Strings(names)
	return nil, notReached("the MCP server at %s has no tool %q (its tools: %s)", redact(cfg.URL), cfg.MCPTool, strings.Join(names, ", "))
}

func (t *mcpTransport) close() { _ = t.cs.Close() }

func (t *mcpTransport) terms() terms {
	return terms{
		unit:        "call",
		ok:          "call a result",
		oks:         "results",
		inFlight:    "an in-flight error (an error with a retry-after)",
		inFlights:   "in-flight errors",
		retry:       "is an in-flight error",
		outcome:     "result",
		replay:      "second call gets the first result replayed (same content)",
		otherArgs:   "is refused (a JSON-RPC error or a tool error)",
		missingKey:  "a call without _meta." + mcpkey.MetaKey + " is refused (a JSON-RPC error or a tool error)",
		failure:     "a tool error",
		failureNoun: "tool error",
		noCached:    "no-cached-tool-error",
		failureHint: "a request id in the error's text tells them apart",
	}
}

func (t *mcpTransport) headerKeys() bool { return false }

// stored is the request as package mcpkey stores it (request_body) and the
// probe is given it: the canonical JSON of {"tool": the MCP tool's name,
// "arguments": the arguments}, so a probe reads request.arguments.PATH.
func (t *mcpTransport) stored(body json.RawMessage) json.RawMessage {
	return mcpRequest(t.tool, body)
}

func mcpRequest(tool string, args json.RawMessage) json.RawMessage {
	b, err := mcpkey.RequestBody(tool, args)
	if err != nil {
		return args
	}
	return b
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

// reached: the session opened and the tool exists (dialMCP); a call with no
// answer at all means the server went away.
func (t *mcpTransport) reached(first reply) error {
	var e *jsonrpc.Error
	if first.err != nil && !errors.As(first.err, &e) {
		return notReached("the first tools/call of %q got no answer: %v", t.tool, first.err)
	}
	return nil
}

// refused: either MCP error style, but not an in-flight answer. The
// ledgerkeeper profile wants mcpkey's style: invalid params (-32602).
func (t *mcpTransport) refused(a reply, _ refusal) (bool, *finding) {
	var e *jsonrpc.Error
	rpc := errors.As(a.err, &e)
	ok := (rpc || a.toolError) && !a.inFlight
	code := int64(0)
	if rpc {
		code = e.Code
	}
	return ok, &finding{name: "the refusal is a JSON-RPC invalid-params error (-32602)", ok: code == jsonrpc.CodeInvalidParams, seen: a.detail}
}

// finally has nothing to add: an MCP answer has no 5xx to mark.
func (t *mcpTransport) finally() []finding { return nil }

// mcpAnswer is one tools/call outcome.
type mcpAnswer struct {
	res *mcp.CallToolResult
	err error
}

func (a mcpAnswer) rpcError() (*jsonrpc.Error, bool) {
	var e *jsonrpc.Error
	ok := errors.As(a.err, &e)
	return e, ok
}

func (a mcpAnswer) ok() bool     { return a.err == nil && a.res != nil && !a.res.IsError }
func (a mcpAnswer) marked() bool { return a.ok() && a.res.Meta[mcpkey.MetaReplay] == true }

// retryAfter is the answer's retry-after, if it is an error that carries
// one: in the tool error's _meta, or in the JSON-RPC error's data.
func (a mcpAnswer) retryAfter() (float64, bool) {
	if e, ok := a.rpcError(); ok {
		var data map[string]any
		if json.Unmarshal(e.Data, &data) != nil {
			return 0, false
		}
		return retryAfter(data)
	}
	if a.err == nil && a.res != nil && a.res.IsError {
		return retryAfter(a.res.Meta)
	}
	return 0, false
}

// retryAfter finds a retry-after in m: a member named retryAfter or
// retryAfterSeconds (any case), bare or after a "vendor/" prefix as MCP's
// _meta names go (mcpkey's is "ledgerkeeper/retryAfterSeconds"), whose
// value is a number of seconds, zero or more.
func retryAfter(m map[string]any) (float64, bool) {
	for k, v := range m {
		name := k[strings.LastIndexByte(k, '/')+1:]
		if !strings.EqualFold(name, "retryAfter") && !strings.EqualFold(name, "retryAfterSeconds") {
			continue
		}
		switch n := v.(type) {
		case float64:
			if n >= 0 {
				return n, true
			}
		case int:
			if n >= 0 {
				return float64(n), true
			}
		case json.Number:
			if f, err := n.Float64(); err == nil && f >= 0 {
				return f, true
			}
		}
	}
	return 0, false
}

func (a mcpAnswer) String() string {
	if e, ok := a.rpcError(); ok {
		return fmt.Sprintf("JSON-RPC error %d %s", e.Code, quote([]byte(e.Message)))
	}
	switch {
	case a.err != nil:
		return "no answer: " + a.err.Error()
	case a.res == nil:
		return "no result"
	case a.res.IsError:
		s := "tool error " + quote(contentJSON(a.res))
		if n, ok := a.retryAfter(); ok {
			s += fmt.Sprintf(" (retry after %gs)", n)
		}
		return s
	}
	return "result " + quote(contentJSON(a.res))
}

// reply reads the answer for the battery: the contract judges the result's
// content; mcpkey's replay flag in _meta is a finding for the ledgerkeeper
// profile.
func (a mcpAnswer) reply() reply {
	_, inFlight := a.retryAfter()
	e, rpc := a.rpcError()
	toolError := a.err == nil && a.res != nil && a.res.IsError
	r := reply{
		err:       a.err,
		ok:        a.ok(),
		inFlight:  inFlight,
		toolError: toolError,
		failed:    (toolError || rpc) && !inFlight,
		text:      a.String(),
		detail:    a.String(),
		marked:    a.marked(),
		markers: []finding{
			{name: "result has _meta[\"" + mcpkey.MetaReplay + "\"] true", ok: a.marked(), seen: a.String()},
		},
	}
	r.shown = r.text
	switch {
	case rpc:
		r.content = fmt.Sprintf("error %d %s", e.Code, e.Message)
	case a.err == nil && a.res != nil:
		r.content = "result " + string(contentJSON(a.res))
	}
	return r
}

// contentJSON is what a replay of the result must reproduce: its content,
// structured content and isError (the _meta, where mcpkey marks replays,
// aside), as JSON.
func contentJSON(res *mcp.CallToolResult) []byte {
	if res == nil {
		return nil
	}
	b, err := json.Marshal(struct {
		Content    []mcp.Content `json:"content"`
		Structured any           `json:"structuredContent,omitempty"`
		IsError    bool          `json:"isError,omitempty"`
	}{res.Content, res.StructuredContent, res.IsError})
	if err != nil {
		return nil
	}
	return b
}
