// The official TypeScript MCP client (@modelcontextprotocol/sdk, pinned in
// package.json and package-lock.json) against an mcpkey tool server, for
// interop/mcp_ts_test.go.
//
// It reads a plan (JSON) on stdin, makes its tools/call steps through the
// SDK's Client over streamable HTTP, and prints on stdout, as JSON, what the
// SDK returned for each: the result, or the error it threw (class, code,
// message). It judges nothing: the Go test asserts on these answers and on
// the rows at the sink and in the ledger.
//
// Plan:
//
//   { "url": "http://127.0.0.1:port/",
//     "sessions": { "name": { "headers": { "Idempotency-Key": "k" } } },
//     "steps": [ { "name": "…", "session": "name", "tool": "create_ticket",
//                  "key": "k-1",          // sent as _meta.idempotencyKey; omitted: none
//                  "arguments": { … },    // omitted: no arguments field at all
//                  "concurrent": 20 } ] } // that many identical calls at once; default 1
//
// Output: { "sdkVersion": "…", "steps": { "name": [ answer, … ] } }, where
// an answer is { "result": CallToolResult } or
// { "error": { "name": "McpError", "code": -32602, "message": "…" } }.
//
// Every session lists the tools first, as MCP clients do: that is when the
// SDK caches each tool's outputSchema and starts validating structured
// content against it.

import { readFileSync } from "node:fs";
import { Client } from "@modelcontextprotocol/sdk/client/index.js";
import { StreamableHTTPClientTransport } from "@modelcontextprotocol/sdk/client/streamableHttp.js";

const requestTimeoutMs = 15000;

const plan = JSON.parse(readFileSync(0, "utf8"));
const sdkVersion = JSON.parse(
  readFileSync(new URL("./node_modules/@modelcontextprotocol/sdk/package.json", import.meta.url), "utf8"),
).version;

const sessions = new Map(); // name → { client, transport }
for (const [name, s] of Object.entries(plan.sessions ?? {})) {
  // Headers set here go with every request of the session: the TypeScript
  // SDK has no per-call headers, hence _meta.idempotencyKey.
  const transport = new StreamableHTTPClientTransport(new URL(plan.url), {
    requestInit: { headers: s.headers ?? {} },
  });
  const client = new Client({ name: "ledgerkeeper-interop", version: "0" });
  await client.connect(transport);
  await client.listTools();
  sessions.set(name, { client, transport });
}

async function answer(client, step) {
  const params = { name: step.tool };
  if ("arguments" in step) params.arguments = step.arguments;
  if (step.key !== undefined) params._meta = { idempotencyKey: step.key };
  try {
    return { result: await client.callTool(params, undefined, { timeout: requestTimeoutMs }) };
  } catch (err) {
    return { error: { name: err?.constructor?.name ?? typeof err, code: err?.code, message: String(err?.message ?? err) } };
  }
}

const out = { sdkVersion, steps: {} };
try {
  for (const step of plan.steps) {
    const client = sessions.get(step.session)?.client;
    if (!client) throw new Error(`step ${step.name}: no session ${step.session}`);
    const n = step.concurrent ?? 1;
    out.steps[step.name] = await Promise.all(Array.from({ length: n }, () => answer(client, step)));
  }
} finally {
  // End each session on the server (DELETE), as a client that is done
  // should, then close the transport.
  for (const { client, transport } of sessions.values()) {
    await transport.terminateSession();
    await client.close();
  }
}
process.stdout.write(JSON.stringify(out) + "\n");
