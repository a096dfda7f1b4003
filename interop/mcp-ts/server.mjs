// An MCP tool server written with the official TypeScript SDK
// (@modelcontextprotocol/sdk's McpServer, pinned in package.json and
// package-lock.json), for interop/conformance_ts_server_test.go: the
// idempotency contract implemented its own way, sharing nothing with
// ledger/mcpkey, so that `ledgerkeeper conformance --mcp-tool` is judged
// against a server it was not written with.
//
// Stateless streamable HTTP on POST /mcp (a fresh McpServer per request, as
// the SDK's stateless example does; the key store lives outside it), one
// tool, create_ticket {title, account_id}:
//
//   - the key is _meta.idempotencyKey; none → an error;
//   - the key with other arguments → an error;
//   - the key while its first call runs → an error result with
//     _meta.retryAfter (seconds);
//   - the key completed → the stored result again, unmarked;
//   - otherwise the call runs once: one effect, kept in memory and served
//     as GET /v1/tickets?idempotency_key=K&title=T → {"data": [...]} for the
//     probe. A call titled "slow" takes a second; one titled "fail" is a
//     tool error with an error id, no effect, and nothing stored (a retry
//     runs again).
//
// McpServer turns every error a tool handler throws into a result with
// isError (the message as its text), so the refusals above reach the client
// as tool errors, not JSON-RPC errors: the style the contract accepts
// besides -32602.
//
// It listens on 127.0.0.1 on a free port and prints {"port": N} on stdout
// once it accepts connections.

import { createServer } from "node:http";
import { McpServer } from "@modelcontextprotocol/sdk/server/mcp.js";
import { StreamableHTTPServerTransport } from "@modelcontextprotocol/sdk/server/streamableHttp.js";
import { z } from "zod";

const keys = new Map(); // key → { args, result | undefined, answered: Promise, answer() }
const effects = []; // { key, title, account_id, ticket_id }
let errors = 0;

function toolError(text, meta) {
  const r = { content: [{ type: "text", text }], isError: true };
  if (meta) r._meta = meta;
  return r;
}

async function createTicket(args, extra) {
  const key = extra._meta?.idempotencyKey;
  if (typeof key !== "string" || key === "") {
    throw new Error("idempotencyKey is required in _meta");
  }
  const fingerprint = JSON.stringify([args.title, args.account_id]);
  const seen = keys.get(key);
  if (seen) {
    if (seen.fingerprint !== fingerprint) {
      throw new Error("this idempotencyKey was already used with other arguments");
    }
    if (seen.result === undefined) {
      seen.answer();
      return toolError("a call with this idempotencyKey is in progress; retry after 1 second", { retryAfter: 1 });
    }
    return seen.result;
  }
  const entry = { fingerprint, result: undefined };
  entry.answered = new Promise((resolve) => (entry.answer = resolve));
  keys.set(key, entry);
  if (args.title === "fail") {
    keys.delete(key);
    errors++;
    return toolError(`ticket store failed (error E-${errors})`);
  }
  if (args.title === "slow") {
    await new Promise((resolve) => setTimeout(resolve, 1000)); // processing time
  }
  if (key.endsWith("concurrent")) {
    // Let a concurrent call meet this one in flight, on every run (bounded).
    await Promise.race([entry.answered, new Promise((resolve) => setTimeout(resolve, 5000))]);
  }
  const ticketId = `T-${effects.length + 1}`;
  effects.push({ key, title: args.title, account_id: args.account_id, ticket_id: ticketId });
  entry.result = {
    content: [{ type: "text", text: `ticket ${ticketId} created` }],
    structuredContent: { ticket_id: ticketId, title: args.title },
  };
  return entry.result;
}

function newServer() {
  const server = new McpServer({ name: "tickets-ts", version: "1.0.0" });
  server.registerTool(
    "create_ticket",
    {
      description: "Open a support ticket (keyed by _meta.idempotencyKey)",
      inputSchema: { title: z.string(), account_id: z.string() },
    },
    createTicket,
  );
  return server;
}

const http = createServer(async (req, res) => {
  const url = new URL(req.url, "http://localhost");
  if (req.method === "GET" && url.pathname === "/v1/tickets") {
    const key = url.searchParams.get("idempotency_key");
    const title = url.searchParams.get("title");
    const data = effects.filter((e) => e.key === key && (title === null || e.title === title));
    res.writeHead(200, { "Content-Type": "application/json" });
    res.end(JSON.stringify({ data }));
    return;
  }
  if (url.pathname !== "/mcp") {
    res.writeHead(404, { "Content-Type": "application/json" });
    res.end('{"error":"not found"}');
    return;
  }
  if (req.method !== "POST") {
    // Stateless: no standalone SSE stream, no session to delete.
    res.writeHead(405, { Allow: "POST" });
    res.end();
    return;
  }
  const server = newServer();
  const transport = new StreamableHTTPServerTransport({ sessionIdGenerator: undefined, enableJsonResponse: true });
  res.on("close", () => {
    transport.close();
    server.close();
  });
  try {
    await server.connect(transport);
    await transport.handleRequest(req, res);
  } catch (err) {
    if (!res.headersSent) {
      res.writeHead(500, { "Content-Type": "application/json" });
      res.end(JSON.stringify({ jsonrpc: "2.0", error: { code: -32603, message: String(err) }, id: null }));
    }
  }
});

http.listen(0, "127.0.0.1", () => {
  process.stdout.write(JSON.stringify({ port: http.address().port }) + "\n");
});
