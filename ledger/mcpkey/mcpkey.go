package mcpkey

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"strconv"
	"time"

	"github.com/modelcontextprotocol/go-sdk/jsonrpc"
	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/ledgerkeeper/ledgerkeeper/ledger"
)

// MetaKey is the _meta field of tools/call that carries the idempotency key
// (the name SEP-3182 proposed).
const MetaKey = "idempotencyKey"

// MetaReplay is the _meta field set to true on a replayed result.
const MetaReplay = "ledgerkeeper/idempotentReplay"

// MetaRetryAfter is the _meta field of the in-flight tool error: the number
// of seconds to wait before retrying.
const MetaRetryAfter = "ledgerkeeper/retryAfterSeconds"

// Config configures Wrap for one tool.
type Config struct {
	// DB is the ledger's pool. Required.
	DB ledger.DBTX
	// Tool is the tool name stored in idempotency_keys.tool (the name the
	// reconciler's tools config knows). Default: the MCP tool name.
	Tool string
	// TTL sets expires_at = claim time + TTL. Default ledger.DefaultTTL.
	TTL time.Duration
	// RetryAfter is the wait the in-flight answer asks for. Default
	// ledger.DefaultRetryAfter.
	RetryAfter time.Duration
	// AllowMissingKey lets a call without a key run the handler with no
	// ledger row (no protection at all). Default false: a call without a
	// key is refused, because an unkeyed retry of a side-effecting tool is
	// exactly the duplicate the contract exists to prevent. Set it only for
	// tools without side effects.
	AllowMissingKey bool
	// HeartbeatInterval, when > 0, heartbeats the key while the handler
	// runs. Keep it well under the tool's heartbeat_timeout.
	HeartbeatInterval time.Duration
	// Logger receives errors the client cannot see. Default: discard.
	Logger *slog.Logger
}

// Attempt identifies the claim a handler runs under.
//
// Deprecated: it is ledger.Attempt (this name is an alias of it); use that.
type Attempt = ledger.Attempt

// AttemptFromContext returns the attempt Wrap claimed for this call.
//
// Deprecated: use ledger.AttemptFromContext, which works under Wrap and
// ledger.Middleware alike.
func AttemptFromContext(ctx context.Context) (Attempt, bool) {
	return ledger.AttemptFromContext(ctx)
}

// AddTool adds tool t to s with handler h behind Wrap.
func AddTool(s *mcp.Server, t *mcp.Tool, cfg Config, h mcp.ToolHandler) {
	s.AddTool(t, Wrap(cfg, h))
}

// Wrap applies the idempotency contract to a tools/call handler. See the
// package documentation for each answer.
func Wrap(cfg Config, next mcp.ToolHandler) mcp.ToolHandler {
	if cfg.DB == nil || next == nil {
		panic("mcpkey: Wrap needs DB and a handler")
	}
	if cfg.RetryAfter <= 0 {
		cfg.RetryAfter = ledger.DefaultRetryAfter
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	return func(ctx context.Context, req *mcp.CallToolRequest) (*mcp.CallToolResult, error) {
		key, err := keyOf(req)
		if err != nil {
			return nil, invalidParams(err.Error())
		}
		if key == "" {
			if cfg.AllowMissingKey {
				return next(ctx, req)
			}
			return nil, invalidParams("missing idempotency key: set _meta." + MetaKey +
				" (or the " + ledger.HeaderIdempotencyKey + " header) from the orchestrator's durable step; a key in the arguments is ignored")
		}
		tool := cfg.Tool
		if tool == "" {
			tool = req.Params.Name
		}
		canon, err := requestOf(req.Params.Name, req.Params.Arguments)
		if err != nil {
			return nil, invalidParams("arguments must be one JSON value")
		}
		var panicked any
		var out *mcp.CallToolResult
		var herr error
		res, err := ledger.Run(ctx, cfg.DB, ledger.Call{
			Key: key, Tool: tool, Request: canon, TTL: cfg.TTL,
			HeartbeatInterval: cfg.HeartbeatInterval, Logger: cfg.Logger,
		}, func(ctx context.Context) ledger.Response {
			out, herr, panicked = run(ctx, next, req)
			if panicked != nil || herr != nil || out == nil || out.IsError {
				// A protocol error or a tool error result cannot be told
				// from a technical failure after the effect: nothing is
				// stored, the key stays processing for the reconciler (or
				// the handler called Attempt.Abandon).
				return ledger.Response{IsError: true}
			}
			body, err := json.Marshal(out)
			if err != nil {
				cfg.Logger.Error("encode tool result; key left processing", "tool", tool, "err", err)
				return ledger.Response{IsError: true}
			}
			return ledger.Response{Code: 200, Body: body}
		})
		if err != nil {
			cfg.Logger.Error("claim idempotency key", "tool", tool, "err", err)
			return nil, &jsonrpc.Error{Code: jsonrpc.CodeInternalError, Message: "idempotency ledger unavailable"}
		}
		switch res.Claim {
		case ledger.FingerprintMismatch:
			return nil, invalidParams("idempotency key was already used with different arguments")
		case ledger.InFlight:
			secs := int((cfg.RetryAfter + time.Second - 1) / time.Second)
			return &mcp.CallToolResult{
				Meta:    mcp.Meta{MetaRetryAfter: secs},
				Content: []mcp.Content{&mcp.TextContent{Text: "a call with this idempotency key is still being processed; retry after " + strconv.Itoa(secs) + " seconds with the same key"}},
				IsError: true,
			}, nil
		case ledger.Replay:
			return replay(res.Response.Body)
		}
		if panicked != nil {
			cfg.Logger.Error("tool handler panicked; key left processing", "tool", tool, "panic", fmt.Sprint(panicked))
			return nil, &jsonrpc.Error{Code: jsonrpc.CodeInternalError, Message: "tool failed; its outcome is unknown and the key stays processing until it is reconciled"}
		}
		return out, herr
	}
}

// keyOf reads the key from _meta, else from the HTTP header; never from the
// arguments.
func keyOf(req *mcp.CallToolRequest) (string, error) {
	var key string
	if v, ok := req.Params.Meta[MetaKey]; ok {
		s, isString := v.(string)
		if !isString {
			return "", fmt.Errorf("_meta.%s must be a string", MetaKey)
		}
		key = s
	}
	if req.Extra != nil && req.Extra.Header != nil {
		if h := req.Extra.Header.Get(ledger.HeaderIdempotencyKey); h != "" {
			if key != "" && key != h {
				return "", fmt.Errorf("_meta.%s and the %s header differ", MetaKey, ledger.HeaderIdempotencyKey)
			}
			key = h
		}
	}
	if len(key) > ledger.MaxKeyLength {
		return "", fmt.Errorf("idempotency key longer than %d bytes", ledger.MaxKeyLength)
	}
	return key, nil
}

// requestOf is the canonical JSON of {tool name, arguments}: the request_body
// and, hashed, the request_hash.
func requestOf(name string, args json.RawMessage) ([]byte, error) {
	a, err := ledger.Canonical(args)
	if err != nil {
		return nil, err
	}
	b, err := json.Marshal(struct {
		Tool      string          `json:"tool"`
		Arguments json.RawMessage `json:"arguments"`
	}{name, a})
	if err != nil {
		return nil, err
	}
	return ledger.Canonical(b)
}

// replay answers with a stored outcome. A body Wrap stored is a
// CallToolResult (an object with "content"); any other body was stored by
// the reconciler or an operator from the probe's outcome, and is replayed as
// the result's structured content and its JSON text.
func replay(stored json.RawMessage) (*mcp.CallToolResult, error) {
	var shape map[string]json.RawMessage
	var out mcp.CallToolResult
	if json.Unmarshal(stored, &shape) == nil && shape["content"] != nil {
		if err := json.Unmarshal(stored, &out); err != nil {
			return nil, &jsonrpc.Error{Code: jsonrpc.CodeInternalError, Message: "the stored result of this idempotency key cannot be replayed"}
		}
	} else {
		body := stored
		if len(body) == 0 {
			body = json.RawMessage("null")
		}
		out = mcp.CallToolResult{Content: []mcp.Content{&mcp.TextContent{Text: string(body)}}, StructuredContent: body}
	}
	if out.Meta == nil {
		out.Meta = mcp.Meta{}
	}
	out.Meta[MetaReplay] = true
	return &out, nil
}

func run(ctx context.Context, next mcp.ToolHandler, req *mcp.CallToolRequest) (out *mcp.CallToolResult, err error, panicked any) { //nolint:staticcheck // ST1008: the handler's own (result, error), then what it panicked with
	defer func() {
		// The SDK does not recover handler panics (one would end the
		// server); the effect may have happened, so the key is left
		// processing and the call fails.
		if p := recover(); p != nil {
			panicked = p
		}
	}()
	out, err = next(ctx, req)
	return out, err, nil
}

func invalidParams(msg string) error {
	return &jsonrpc.Error{Code: jsonrpc.CodeInvalidParams, Message: msg}
}
