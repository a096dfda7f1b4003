package mcpkey

import (
	"context"
	"encoding/json"
	"errors"
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
	// OutputSchema is the tool's output schema (mcp.Tool.OutputSchema, any
	// value that marshals to a JSON Schema, draft 2020-12 or draft-07): a
	// replay carries its stored outcome as structuredContent only when the
	// outcome matches it (see the package documentation). AddTool sets it
	// from the tool when it is nil; set it yourself when you call Wrap for
	// a tool that declares one. Nil: the tool declares none.
	OutputSchema any
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

// AddTool adds tool t to s with handler h behind Wrap, whose replays are
// checked against t's output schema (unless cfg.OutputSchema is set).
func AddTool(s *mcp.Server, t *mcp.Tool, cfg Config, h mcp.ToolHandler) {
	if cfg.OutputSchema == nil {
		cfg.OutputSchema = t.OutputSchema
	}
	s.AddTool(t, Wrap(cfg, h))
}

// Wrap applies the idempotency contract to a tools/call handler. See the
// package documentation for each answer. It panics when cfg has no DB or
// cfg.OutputSchema is not a JSON Schema it can resolve: a mistake in the
// tool server's code, found when it starts.
func Wrap(cfg Config, next mcp.ToolHandler) mcp.ToolHandler {
	if cfg.DB == nil || next == nil {
		panic("mcpkey: Wrap needs DB and a handler")
	}
	schema, err := resolveOutputSchema(cfg.OutputSchema)
	if err != nil {
		panic(fmt.Sprintf("mcpkey: Config.OutputSchema cannot check replays: %v", err))
	}
	if cfg.RetryAfter <= 0 {
		cfg.RetryAfter = ledger.DefaultRetryAfter
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	return func(ctx context.Context, req *mcp.CallToolRequest) (*mcp.CallToolResult, error) {
		key, err := keyOf(ctx, cfg.DB, req, !cfg.AllowMissingKey)
		if errors.Is(err, errLedger) {
			cfg.Logger.Error("read the ledger for a quoted key", "err", err)
			return nil, err
		}
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
		canon, legacy, err := requestOf(req.Params.Name, req.Params.Arguments)
		if err != nil {
			return nil, invalidParams("arguments must be one JSON value")
		}
		var panicked any
		var out *mcp.CallToolResult
		var herr error
		runAs := func(request json.RawMessage) (ledger.Result, error) {
			return ledger.Run(ctx, cfg.DB, ledger.Call{
				Key: key, Tool: tool, Request: request, TTL: cfg.TTL,
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
		}
		res, err := runAs(canon)
		if err == nil && res.Claim == ledger.FingerprintMismatch && legacy != nil {
			// A key stored before absent arguments fingerprinted as {}:
			// the same call under its old fingerprint. The handler has
			// not run (a mismatch runs nothing), so it still runs at
			// most once.
			res, err = runAs(legacy)
		}
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
			return replay(res.Response.Body, schema)
		}
		if panicked != nil {
			cfg.Logger.Error("tool handler panicked; key left processing", "tool", tool, "panic", fmt.Sprint(panicked))
			return nil, &jsonrpc.Error{Code: jsonrpc.CodeInternalError, Message: "tool failed; its outcome is unknown and the key stays processing until it is reconciled"}
		}
		return out, herr
	}
}

// keyOf reads the key from _meta, else (when header is true) from the HTTP
// header; never from the arguments. A tool that allows a missing key reads
// _meta only: a client that sets the header for its whole session would
// otherwise claim that key for every read-only call it makes.
// errLedger marks a keyOf error that is the ledger's, not the request's.
var errLedger = errors.New("idempotency ledger unavailable")

func keyOf(ctx context.Context, db ledger.DBTX, req *mcp.CallToolRequest, header bool) (string, error) {
	var key string
	if v, ok := req.Params.Meta[MetaKey]; ok {
		s, isString := v.(string)
		if !isString {
			return "", fmt.Errorf("_meta.%s must be a string", MetaKey)
		}
		key = s
	}
	if header && req.Extra != nil && req.Extra.Header != nil {
		if raw := req.Extra.Header.Get(ledger.HeaderIdempotencyKey); raw != "" {
			h, err := ledger.HeaderKey(ctx, db, raw)
			if errors.Is(err, ledger.ErrKeyHeaderInvalid) {
				return "", err
			}
			if err != nil {
				return "", fmt.Errorf("%w: %w", errLedger, err)
			}
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
// and, hashed, the request_hash. Absent, null and {} arguments are one
// request, {"arguments":{},"tool":name}: clients differ in which they send
// for a tool without arguments. For those, legacy is the form keys stored
// before that rule have, {"arguments":null,"tool":name} (absent arguments
// then fingerprinted as null); otherwise legacy is nil.
// RequestBody is the request_body Wrap stores for a call of tool name with
// args, {"arguments":…,"tool":name} in canonical JSON, absent and null
// arguments as {}: what a probe's {request.arguments.PATH} reads, and what
// conformance gives the probe it counts effects with.
func RequestBody(name string, args json.RawMessage) (json.RawMessage, error) {
	canon, _, err := requestOf(name, args)
	return canon, err
}

func requestOf(name string, args json.RawMessage) (canon, legacy []byte, err error) {
	a, err := ledger.Canonical(args)
	if err != nil {
		return nil, nil, err
	}
	empty := string(a) == "null" || string(a) == "{}"
	if empty {
		a = json.RawMessage("{}")
	}
	canon, err = request(name, a)
	if err != nil || !empty {
		return canon, nil, err
	}
	legacy, err = request(name, json.RawMessage("null"))
	return canon, legacy, err
}

// request is the canonical JSON of {tool name, canonical arguments}.
func request(name string, args json.RawMessage) ([]byte, error) {
	b, err := json.Marshal(struct {
		Tool      string          `json:"tool"`
		Arguments json.RawMessage `json:"arguments"`
	}{name, args})
	if err != nil {
		return nil, err
	}
	return ledger.Canonical(b)
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
