// Package mcpkey applies ledgerkeeper's idempotency contract to the
// tools/call handlers of MCP tool servers built with the official Go SDK
// (github.com/modelcontextprotocol/go-sdk), as package ledger's Middleware
// does for net/http tool servers. The rows are ordinary idempotency_keys
// rows, so `ledgerkeeper serve` reconciles MCP tools exactly like HTTP
// tools (tool = Config.Tool, default the MCP tool name; name it in the
// tools config with a probe).
//
// Wrap (or AddTool) answers a tools/call as follows:
//
//   - The key comes from the request's _meta.idempotencyKey (MetaKey, the
//     field SEP-3182 proposed) or, over the streamable HTTP transport, from
//     the Idempotency-Key header; both present and different → invalid
//     params. _meta is the per-call key: clients whose SDK sets headers
//     once per session (the TypeScript SDK's requestInit) use it. A tool
//     with Config.AllowMissingKey reads _meta only, so a session-wide
//     header never claims a key for a read-only call. The key never comes
//     from the arguments: they are model-controlled, and a model that
//     mints a new key per retry defeats the contract. The orchestrator
//     sets it from its durable step.
//   - No key → a JSON-RPC invalid-params error (-32602) by default: an
//     unkeyed retry of a side-effecting tool is the duplicate the contract
//     exists to prevent, and the fault is the orchestrator's, not the
//     model's. Config.AllowMissingKey runs the handler unprotected, no row
//     written (for tools without side effects). A key over 128 bytes →
//     invalid params.
//   - The fingerprint (request_hash) is the SHA-256 of the canonical JSON of
//     {"tool": MCP tool name, "arguments": arguments}, which is also stored
//     as request_body for the probes. Absent, null and {} arguments are one
//     request, {"arguments":{}}: clients differ in which they send for a
//     tool without arguments (a key stored when absent arguments hashed as
//     null still matches its retries). The key used with other arguments,
//     or for another tool → invalid params; the handler does not run.
//   - The key in flight → a tool error result (IsError) whose text says to
//     retry after N seconds with the same key, N also in
//     _meta["ledgerkeeper/retryAfterSeconds"] (MCP has no 409).
//   - The key completed → the stored CallToolResult (content, structured
//     content, _meta) with _meta["ledgerkeeper/idempotentReplay"] = true. A
//     body that is not a CallToolResult (no "content": the reconciler or an
//     operator completed the key from the probe's outcome, resolve or
//     Slack's Store outcome) is replayed as text content (a JSON string's
//     value, any other body's JSON) and, when it is a JSON object, as the
//     structured content.
//   - structuredContent is sent only when it is a JSON object and, for a
//     tool with an output schema (Config.OutputSchema, which AddTool takes
//     from the tool), matches it: MCP requires an object, and the
//     TypeScript SDK's client throws on anything else (a ZodError for a
//     string, an array or null; -32602 for an object failing the schema;
//     -32600 for such a tool's result without structured content).
//     Otherwise it is left out, _meta["ledgerkeeper/replayAsText"]
//     (MetaAsText) says why, and a tool with an output schema answers an
//     error result (IsError, the one shape it may return without
//     structured content) whose first text says the call already
//     completed and must not be made again, followed by the outcome.
//   - Otherwise the handler runs once (ledger.Run, the same core as
//     ledger.Middleware: the ledger.Attempt in its context, so
//     ledger.AttemptFromContext works in an MCP handler too; heartbeats if
//     Config.HeartbeatInterval > 0).
//
// What is stored is decided by ledger.Definitive, the one stored-outcome
// rule of both transports: only a result the handler returned without
// IsError and without a Go error; it becomes the row's response_body (the
// CallToolResult as JSON) with response_code 200. A tool error result
// (IsError), a returned error (a protocol error) and a panic store nothing:
// the middleware cannot tell a refusal from a technical failure after the
// effect, so the key stays processing for the reconciler's probe, like a
// 5xx (or a 429) in the HTTP middleware. A handler that knows the effect did not happen
// (it refused the arguments before touching the downstream) calls
// Attempt.Abandon so the retry can run. The SDK does not recover handler
// panics; Wrap does, answering an internal error (-32603), so one failing
// call does not end the server. A crash after the effect likewise leaves
// the key processing; reconcile then finds the effect and stores the
// outcome.
package mcpkey
