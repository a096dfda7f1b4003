// Package interop holds tests of ledgerkeeper against clients we did not
// write, so that what our own Go clients accept is not the only judge.
//
// mcp_ts_test.go runs the official TypeScript MCP SDK
// (@modelcontextprotocol/sdk, pinned with a committed package-lock.json in
// mcp-ts/) against an mcpkey tool server over streamable HTTP, on a real
// PostgreSQL with the real reconciler and operator.Resolve storing
// outcomes. It needs Node.js (18 or newer) and npm on PATH; it runs `npm
// ci` in mcp-ts/ when node_modules is missing or holds another SDK version,
// and fails, saying what to install, when either is absent.
//
// The package has no code of its own: it lives in the daemon's module
// because its test needs the reconciler and the operator, which the tool
// module (ledger/) must not depend on.
package interop
