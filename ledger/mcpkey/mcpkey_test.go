package mcpkey_test

// The MCP binding end to end: the SDK's own client over the streamable HTTP
// transport against an httptest server, on a real PostgreSQL ledger. Effects
// are counted at the tool's sink (an in-memory counter per key).

import (
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"net/http/httptest"
	"os"
	"reflect"
	"strings"
	"sync"
	"testing"

	"github.com/modelcontextprotocol/go-sdk/jsonrpc"
	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/ledgerkeeper/ledgerkeeper/ledger"
	"github.com/ledgerkeeper/ledgerkeeper/ledger/ledgertest"
	"github.com/ledgerkeeper/ledgerkeeper/ledger/ledgertest/testwait"
	"github.com/ledgerkeeper/ledgerkeeper/ledger/mcpkey"
)

// On a Citus ledger (ledgertest's Citus mode) the claims take their Citus
// shape, as a tool server on Citus does.
func TestMain(m *testing.M) {
	ledger.UseCitusShapes(os.Getenv(ledgertest.EnvCitusWorkers) != "")
	ledgertest.Main(m)
}

// sink is the tool behind the middleware: one effect per run, counted per
// key (or under "" for unkeyed runs).
type sink struct {
	hold        chan struct{} // when set, each run waits after its effect
	holdOnce    sync.Once
	afterEffect func() // when set, runs after the effect (tests panic here)
	toolError   bool   // when set, each run answers a tool error after its effect

	mu      sync.Mutex
	effects map[string]int
}

func (s *sink) handle(ctx context.Context, req *mcp.CallToolRequest) (*mcp.CallToolResult, error) {
	a, _ := mcpkey.AttemptFromContext(ctx)
	s.mu.Lock()
	s.effects[a.Key]++
	n := s.effects[a.Key]
	s.mu.Unlock()
	if s.afterEffect != nil {
		s.afterEffect()
	}
	if s.hold != nil {
		<-s.hold
	}
	if s.toolError {
		return &mcp.CallToolResult{IsError: true, Content: []mcp.Content{&mcp.TextContent{Text: "payment gateway timed out"}}}, nil
	}
	return &mcp.CallToolResult{
		Content:           []mcp.Content{&mcp.TextContent{Text: "ticket created"}},
		StructuredContent: map[string]any{"ticket": n, "arguments": req.Params.Arguments},
	}, nil
}

func (s *sink) release() { s.holdOnce.Do(func() { close(s.hold) }) }

func (s *sink) of(key string) int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.effects[key]
}

type bundle struct {
	db   *ledgertest.DB
	srv  *httptest.Server
	sink *sink
}

var objectSchema = map[string]any{"type": "object"}

// refundSchema is refund's output schema.
var refundSchema = map[string]any{
	"type":       "object",
	"required":   []string{"refund_id"},
	"properties": map[string]any{"refund_id": map[string]any{"type": "string"}},
}

// setup serves create_ticket (keyed, ledger tool name "tickets"), lookup
// (AllowMissingKey) and refund (keyed, with an output schema) over
// streamable HTTP.
func setup(t *testing.T, s *sink) *bundle {
	t.Helper()
	db := ledgertest.New(t)
	s.effects = map[string]int{}
	server := mcp.NewServer(&mcp.Implementation{Name: "tickets", Version: "test"}, nil)
	mcpkey.AddTool(server, &mcp.Tool{Name: "create_ticket", InputSchema: objectSchema},
		mcpkey.Config{DB: db.Pool, Tool: "tickets"}, s.handle)
	mcpkey.AddTool(server, &mcp.Tool{Name: "lookup", InputSchema: objectSchema},
		mcpkey.Config{DB: db.Pool, AllowMissingKey: true}, s.handle)
	mcpkey.AddTool(server, &mcp.Tool{Name: "refund", InputSchema: objectSchema, OutputSchema: refundSchema},
		mcpkey.Config{DB: db.Pool}, s.handle)
	srv := httptest.NewServer(mcp.NewStreamableHTTPHandler(func(*http.Request) *mcp.Server { return server }, nil))
	t.Cleanup(srv.Close)
	if s.hold != nil {
		t.Cleanup(s.release) // before srv.Close, which waits for the handlers
	}
	return &bundle{db: db, srv: srv, sink: s}
}

// headerTransport adds an Idempotency-Key header to every HTTP request.
type headerTransport struct{ key string }

func (h headerTransport) RoundTrip(r *http.Request) (*http.Response, error) {
	r = r.Clone(r.Context())
	r.Header.Set(ledger.HeaderIdempotencyKey, h.key)
	return http.DefaultTransport.RoundTrip(r)
}

// connect opens a client session; headerKey, when set, is sent as the
// Idempotency-Key header on every HTTP request.
func (b *bundle) connect(t *testing.T, headerKey string) *mcp.ClientSession {
	t.Helper()
	tr := &mcp.StreamableClientTransport{Endpoint: b.srv.URL, DisableStandaloneSSE: true}
	if headerKey != "" {
		tr.HTTPClient = &http.Client{Transport: headerTransport{headerKey}}
	}
	client := mcp.NewClient(&mcp.Implementation{Name: "orchestrator", Version: "test"}, nil)
	cs, err := client.Connect(context.Background(), tr, nil)
	if err != nil {
		t.Fatalf("connect: %v", err)
	}
	t.Cleanup(func() { _ = cs.Close() })
	return cs
}

func call(cs *mcp.ClientSession, tool, key string, args any) (*mcp.CallToolResult, error) {
	p := &mcp.CallToolParams{Name: tool, Arguments: args}
	if key != "" {
		p.Meta = mcp.Meta{mcpkey.MetaKey: key}
	}
	return cs.CallTool(context.Background(), p)
}

func mustCall(t *testing.T, cs *mcp.ClientSession, key string, args any) *mcp.CallToolResult {
	t.Helper()
	res, err := call(cs, "create_ticket", key, args)
	if err != nil {
		t.Fatalf("call with key %q: %v", key, err)
	}
	return res
}

func wantCode(t *testing.T, err error, code int64, what string) {
	t.Helper()
	var rpcErr *jsonrpc.Error
	if !errors.As(err, &rpcErr) || rpcErr.Code != code {
		t.Fatalf("%s: want JSON-RPC error %d, got %v", what, code, err)
	}
}

func row(t *testing.T, db *ledgertest.DB, key string) ledger.Key {
	t.Helper()
	k, err := ledger.Get(context.Background(), db.Pool, key)
	if err != nil {
		t.Fatalf("row %q: %v", key, err)
	}
	return k
}

var args = map[string]any{"title": "SSO broken", "account_id": "A-1029"}

// Same key twice: one effect; the second answer is the first's result
// (structured content included) with the replay marker.
func TestSameKeyTwiceReplays(t *testing.T) {
	b := setup(t, &sink{})
	cs := b.connect(t, "")
	first := mustCall(t, cs, "k-1", args)
	second := mustCall(t, cs, "k-1", args)
	if n := b.sink.of("k-1"); n != 1 {
		t.Fatalf("effects = %d, want 1", n)
	}
	if first.Meta[mcpkey.MetaReplay] != nil {
		t.Fatalf("first answer marked as a replay: %v", first.Meta)
	}
	if second.Meta[mcpkey.MetaReplay] != true {
		t.Fatalf("second answer lacks the replay marker: %v", second.Meta)
	}
	delete(second.Meta, mcpkey.MetaReplay)
	if len(second.Meta) == 0 {
		second.Meta = nil
	}
	if !reflect.DeepEqual(first, second) {
		t.Fatalf("replay differs:\nfirst  %+v\nsecond %+v", first, second)
	}
	if sc, _ := second.StructuredContent.(map[string]any); sc["ticket"] != float64(1) {
		t.Fatalf("structured content not replayed: %v", second.StructuredContent)
	}
	k := row(t, b.db, "k-1")
	if k.Status != ledger.StatusCompleted || k.Tool != "tickets" || k.ResponseCode == nil || *k.ResponseCode != 200 {
		t.Fatalf("row = status %s tool %s code %v, want completed tickets 200", k.Status, k.Tool, k.ResponseCode)
	}
}

// 50 concurrent calls with one key: exactly one effect; the 49 others are
// told to retry, and the retry after completion replays.
func TestConcurrentCallsOneEffect(t *testing.T) {
	b := setup(t, &sink{hold: make(chan struct{})})
	cs := b.connect(t, "")
	defer b.sink.release() // on failure, before the session closes
	const n = 50
	type answer struct {
		res *mcp.CallToolResult
		err error
	}
	answers := make(chan answer, n)
	for range n {
		go func() {
			res, err := call(cs, "create_ticket", "k-c", args)
			answers <- answer{res, err}
		}()
	}
	// The one run holds until the 49 others have answered.
	for i := range n - 1 {
		a := testwait.Recv(t, answers, testwait.Timeout)
		if a.err != nil || !a.res.IsError || a.res.Meta[mcpkey.MetaRetryAfter] == nil {
			t.Fatalf("answer %d: want an in-flight tool error with %s, got %+v, %v", i, mcpkey.MetaRetryAfter, a.res, a.err)
		}
	}
	b.sink.release()
	if a := testwait.Recv(t, answers, testwait.Timeout); a.err != nil || a.res.IsError {
		t.Fatalf("the owning call: %+v, %v", a.res, a.err)
	}
	if got := b.sink.of("k-c"); got != 1 {
		t.Fatalf("effects = %d, want 1", got)
	}
	if res := mustCall(t, cs, "k-c", args); res.Meta[mcpkey.MetaReplay] != true {
		t.Fatalf("retry after completion: want a replay, got %+v", res)
	}
}

// The key from the Idempotency-Key header works like _meta.
func TestKeyFromHeader(t *testing.T) {
	b := setup(t, &sink{})
	cs := b.connect(t, "k-h")
	mustCall(t, cs, "", args)
	if res := mustCall(t, cs, "", args); res.Meta[mcpkey.MetaReplay] != true {
		t.Fatalf("second call: want a replay, got %+v", res)
	}
	if got := b.sink.of("k-h"); got != 1 {
		t.Fatalf("effects = %d, want 1", got)
	}
	// _meta and header disagreeing is refused.
	_, err := call(cs, "create_ticket", "other", args)
	wantCode(t, err, jsonrpc.CodeInvalidParams, "_meta and header differ")
}

// A tool that allows a missing key ignores the header: a client that sets
// it for its whole session does not claim the step's key for a read-only
// call (which would then refuse as "other arguments", or replay one
// lookup forever). A _meta key still protects it.
func TestAllowMissingKeyIgnoresHeader(t *testing.T) {
	b := setup(t, &sink{})
	cs := b.connect(t, "k-session")
	for i := range 2 {
		if res, err := call(cs, "lookup", "", args); err != nil || res.Meta[mcpkey.MetaReplay] != nil {
			t.Fatalf("lookup %d under a session-wide header: %+v, %v; want a fresh run", i, res, err)
		}
	}
	if got := b.sink.of(""); got != 2 {
		t.Fatalf("unkeyed lookups = %d, want 2", got)
	}
	if n := b.db.Count(t, "idempotency_keys"); n != 0 {
		t.Fatalf("rows = %d, want 0: the header was claimed", n)
	}
	// The keyed tool of the same session takes the header.
	mustCall(t, cs, "", args)
	if got := b.sink.of("k-session"); got != 1 {
		t.Fatalf("effects under the header key = %d, want 1", got)
	}
	// A per-call _meta key protects the lookup (the header, another key,
	// is not read: no "differ" refusal).
	if _, err := call(cs, "lookup", "k-lookup", args); err != nil {
		t.Fatalf("lookup with its own _meta key: %v", err)
	}
	if res, err := call(cs, "lookup", "k-lookup", args); err != nil || res.Meta[mcpkey.MetaReplay] != true {
		t.Fatalf("lookup with its own _meta key again: %+v, %v; want a replay", res, err)
	}
	if got := b.sink.of("k-lookup"); got != 1 {
		t.Fatalf("keyed lookups = %d, want 1", got)
	}
}

// A key in the model-controlled arguments is ignored: the call is refused
// as keyless, nothing runs, no row is written.
func TestKeyInArgumentsIgnored(t *testing.T) {
	b := setup(t, &sink{})
	cs := b.connect(t, "")
	_, err := call(cs, "create_ticket", "", map[string]any{"idempotencyKey": "k-a", "title": "x"})
	wantCode(t, err, jsonrpc.CodeInvalidParams, "key only in the arguments")
	if got := b.sink.of("k-a") + b.sink.of(""); got != 0 {
		t.Fatalf("effects = %d, want 0", got)
	}
	if n := b.db.Count(t, "idempotency_keys"); n != 0 {
		t.Fatalf("rows = %d, want 0", n)
	}
}

// A tool configured with AllowMissingKey runs without a key and writes no
// row.
func TestAllowMissingKey(t *testing.T) {
	b := setup(t, &sink{})
	cs := b.connect(t, "")
	if _, err := call(cs, "lookup", "", args); err != nil {
		t.Fatalf("lookup without key: %v", err)
	}
	if got := b.sink.of(""); got != 1 {
		t.Fatalf("effects = %d, want 1", got)
	}
	if n := b.db.Count(t, "idempotency_keys"); n != 0 {
		t.Fatalf("rows = %d, want 0", n)
	}
}

// The key with other arguments: invalid params, still one effect.
func TestOtherArgumentsInvalidParams(t *testing.T) {
	b := setup(t, &sink{})
	cs := b.connect(t, "")
	mustCall(t, cs, "k-o", args)
	_, err := call(cs, "create_ticket", "k-o", map[string]any{"title": "other"})
	wantCode(t, err, jsonrpc.CodeInvalidParams, "other arguments")
	// The same arguments under another tool name are other arguments too.
	_, err = call(cs, "lookup", "k-o", args)
	wantCode(t, err, jsonrpc.CodeInvalidParams, "other tool")
	if got := b.sink.of("k-o"); got != 1 {
		t.Fatalf("effects = %d, want 1", got)
	}
}

// A handler that panics after its effect leaves the key processing (the
// reconciler's probe resolves it); the retry is told to wait, never re-run.
func TestPanicLeavesProcessing(t *testing.T) {
	b := setup(t, &sink{afterEffect: func() { panic("downstream timeout after the charge") }})
	cs := b.connect(t, "")
	_, err := call(cs, "create_ticket", "k-p", args)
	wantCode(t, err, jsonrpc.CodeInternalError, "panicking handler")
	if k := row(t, b.db, "k-p"); k.Status != ledger.StatusProcessing || k.ResponseBody != nil {
		t.Fatalf("row = %s %s, want processing without a response", k.Status, k.ResponseBody)
	}
	res := mustCall(t, cs, "k-p", args)
	if !res.IsError || res.Meta[mcpkey.MetaRetryAfter] == nil {
		t.Fatalf("retry: want an in-flight tool error, got %+v", res)
	}
	if got := b.sink.of("k-p"); got != 1 {
		t.Fatalf("effects = %d, want 1", got)
	}
}

// A tool error result (IsError) is not stored: the middleware cannot tell a
// refusal from a technical failure after the effect, so the key stays
// processing and the retry is told to wait, never re-run.
func TestToolErrorLeavesProcessing(t *testing.T) {
	b := setup(t, &sink{toolError: true})
	cs := b.connect(t, "")
	if res := mustCall(t, cs, "k-e", args); !res.IsError {
		t.Fatalf("want the tool's error result, got %+v", res)
	}
	if k := row(t, b.db, "k-e"); k.Status != ledger.StatusProcessing || k.ResponseBody != nil {
		t.Fatalf("row = %s %s, want processing without a response", k.Status, k.ResponseBody)
	}
	res := mustCall(t, cs, "k-e", args)
	if !res.IsError || res.Meta[mcpkey.MetaRetryAfter] == nil {
		t.Fatalf("retry: want an in-flight tool error, got %+v", res)
	}
	if got := b.sink.of("k-e"); got != 1 {
		t.Fatalf("effects = %d, want 1", got)
	}
}

// A key the reconciler completed from its probe (after a crash following the
// effect) stores the probe's outcome, not a CallToolResult: the retry
// replays it as structured content, and the handler does not run again.
func TestReplayOfReconciledOutcome(t *testing.T) {
	b := setup(t, &sink{afterEffect: func() { panic("crash after the effect") }})
	cs := b.connect(t, "")
	_, err := call(cs, "create_ticket", "k-r", args)
	wantCode(t, err, jsonrpc.CodeInternalError, "crashing handler")
	// What the reconciler's Complete writes for a found effect (the same
	// compare-and-set on claimed_at).
	k := row(t, b.db, "k-r")
	if err := ledger.Complete(context.Background(), b.db.Pool, "k-r", k.ClaimedAt, 201, json.RawMessage(`{"ticket_id":"T-1"}`)); err != nil {
		t.Fatal(err)
	}
	res := mustCall(t, cs, "k-r", args)
	sc, _ := res.StructuredContent.(map[string]any)
	if res.Meta[mcpkey.MetaReplay] != true || sc["ticket_id"] != "T-1" || res.IsError {
		t.Fatalf("want the reconciled outcome replayed, got %+v", res)
	}
	if got := b.sink.of("k-r"); got != 1 {
		t.Fatalf("effects = %d, want 1", got)
	}
}

// An operator's outcome that is not a JSON object (resolve --body
// '"ticket T-1 created"', Slack's Store outcome) is replayed as text only:
// MCP's structuredContent must be an object, and TypeScript clients reject
// a result whose structuredContent is a string, an array or null.
func TestReplayOfNonObjectOutcomeIsText(t *testing.T) {
	b := setup(t, &sink{afterEffect: func() { panic("crash after the effect") }})
	cs := b.connect(t, "")
	for _, tc := range []struct{ key, body, text, why string }{
		{"k-s", `"ticket T-1 created"`, "ticket T-1 created", "a JSON string"},
		{"k-a", `["T-1","T-2"]`, `["T-1", "T-2"]`, "a JSON array"},
		{"k-n", `null`, "null", "JSON null"},
	} {
		_, err := call(cs, "create_ticket", tc.key, args)
		wantCode(t, err, jsonrpc.CodeInternalError, "crashing handler")
		k := row(t, b.db, tc.key)
		if err := ledger.Complete(context.Background(), b.db.Pool, tc.key, k.ClaimedAt, 200, json.RawMessage(tc.body)); err != nil {
			t.Fatal(err)
		}
		res := mustCall(t, cs, tc.key, args)
		text, _ := res.Content[0].(*mcp.TextContent)
		why, _ := res.Meta[mcpkey.MetaAsText].(string)
		if res.StructuredContent != nil || res.IsError || len(res.Content) != 1 || text == nil || text.Text != tc.text ||
			res.Meta[mcpkey.MetaReplay] != true || !strings.Contains(why, tc.why) {
			t.Fatalf("%s: want text %q only, %s naming %q; got %+v (content %+v)", tc.body, tc.text, mcpkey.MetaAsText, tc.why, res, res.Content)
		}
		if got := b.sink.of(tc.key); got != 1 {
			t.Fatalf("%s: effects = %d, want 1", tc.key, got)
		}
	}
}

// A tool with an output schema: a stored outcome that matches it is the
// structured content; one that does not (or is not an object) is an error
// result saying the call completed, the outcome as text, the reason in
// _meta: a TypeScript client rejects structured content that fails the
// schema (-32602) and a result of such a tool without it (-32600), so an
// error result is the one shape it accepts.
func TestReplayAgainstOutputSchema(t *testing.T) {
	b := setup(t, &sink{afterEffect: func() { panic("crash after the effect") }})
	cs := b.connect(t, "")
	for _, tc := range []struct {
		key, body string
		valid     bool
		why       string
	}{
		{"k-ok", `{"refund_id":"R-1"}`, true, ""},
		{"k-bad", `{"status":"refunded"}`, false, "does not match the tool's outputSchema"},
		{"k-str", `"refunded"`, false, "a JSON string"},
	} {
		_, err := call(cs, "refund", tc.key, args)
		wantCode(t, err, jsonrpc.CodeInternalError, "crashing handler")
		k := row(t, b.db, tc.key)
		if err := ledger.Complete(context.Background(), b.db.Pool, tc.key, k.ClaimedAt, 200, json.RawMessage(tc.body)); err != nil {
			t.Fatal(err)
		}
		res, err := call(cs, "refund", tc.key, args)
		if err != nil {
			t.Fatalf("%s: %v", tc.body, err)
		}
		why, _ := res.Meta[mcpkey.MetaAsText].(string)
		switch {
		case res.Meta[mcpkey.MetaReplay] != true:
			t.Fatalf("%s: no replay marker: %+v", tc.body, res)
		case tc.valid && (res.IsError || res.StructuredContent == nil || why != ""):
			t.Fatalf("%s: want the structured content, got %+v", tc.body, res)
		case !tc.valid && (!res.IsError || res.StructuredContent != nil || !strings.Contains(why, tc.why)):
			t.Fatalf("%s: want an error result without structured content, %s naming %q; got %+v", tc.body, mcpkey.MetaAsText, tc.why, res)
		}
		if got := b.sink.of(tc.key); got != 1 {
			t.Fatalf("%s: effects = %d, want 1", tc.key, got)
		}
	}
}

// Golden request fingerprints of the MCP binding: request_hash is stored
// with every key, and every retry must hash to it. Absent, null and {}
// arguments are one request (clients differ in which they send for a tool
// without arguments), hashed as {"arguments":{},"tool":…}; a call with
// arguments hashes as it always has. These values are fixed forever: never
// regenerate them to make this test pass.
func TestRequestFingerprintGolden(t *testing.T) {
	b := setup(t, &sink{})
	cs := b.connect(t, "")
	const (
		emptyBody = `{"arguments":{},"tool":"create_ticket"}`
		emptyHash = "12bc9f25234fe043b33e9b6b2d400720edcdd788636de4a6202486471a652a19"
		argsBody  = `{"arguments":{"account_id":"A-1029","title":"SSO broken"},"tool":"create_ticket"}`
		argsHash  = "7244e247b8cf4447236862ddcdb991c896dde7f18672d9e1686a5debc805bd8e"
	)
	for _, tc := range []struct {
		key        string
		args       any
		body, hash string
	}{
		{"k-absent", nil, emptyBody, emptyHash},
		{"k-null", json.RawMessage(`null`), emptyBody, emptyHash},
		{"k-empty", map[string]any{}, emptyBody, emptyHash},
		{"k-args", args, argsBody, argsHash},
	} {
		mustCall(t, cs, tc.key, tc.args)
		var body, hash string
		if err := b.db.Pool.QueryRow(context.Background(),
			`SELECT request_body::text, request_hash FROM idempotency_keys WHERE key = $1`, tc.key).Scan(&body, &hash); err != nil {
			t.Fatal(err)
		}
		// request_body is jsonb (its own key order); the hash is of the
		// canonical form.
		canon, err := ledger.Canonical([]byte(body))
		if err != nil || string(canon) != tc.body || hash != tc.hash {
			t.Errorf("%s: request_body %s (%v) hash %s, want %s %s: stored keys would stop matching their retries", tc.key, canon, err, hash, tc.body, tc.hash)
		}
	}
	// Each of the three forms replays a key made with another.
	for _, a := range []any{nil, json.RawMessage(`null`), map[string]any{}} {
		if res := mustCall(t, cs, "k-absent", a); res.Meta[mcpkey.MetaReplay] != true {
			t.Fatalf("arguments %v: want a replay of k-absent, got %+v", a, res)
		}
	}
	if got := b.sink.of("k-absent"); got != 1 {
		t.Fatalf("effects = %d, want 1", got)
	}
}

// A key stored before absent arguments hashed as {} carries the hash of
// {"arguments":null,…}: its retries, with absent, null or {} arguments,
// still replay it, and other arguments are still refused.
func TestKeyStoredWithNullArgumentsStillReplays(t *testing.T) {
	b := setup(t, &sink{})
	cs := b.connect(t, "")
	ctx := context.Background()
	old := json.RawMessage(`{"arguments":null,"tool":"create_ticket"}`)
	hash, err := ledger.Fingerprint(old)
	if err != nil {
		t.Fatal(err)
	}
	c, err := ledger.Claim(ctx, b.db.Pool, ledger.ClaimParams{Key: "k-old", Tool: "tickets", RequestHash: hash, RequestBody: old})
	if err != nil {
		t.Fatal(err)
	}
	stored := `{"content":[{"type":"text","text":"ticket T-0"}],"structuredContent":{"ticket":0}}`
	if err := ledger.Complete(ctx, b.db.Pool, "k-old", c.Row.ClaimedAt, 200, json.RawMessage(stored)); err != nil {
		t.Fatal(err)
	}
	for _, a := range []any{nil, json.RawMessage(`null`), map[string]any{}} {
		res := mustCall(t, cs, "k-old", a)
		if sc, _ := res.StructuredContent.(map[string]any); res.Meta[mcpkey.MetaReplay] != true || sc["ticket"] != float64(0) {
			t.Fatalf("arguments %v: want the stored result replayed, got %+v", a, res)
		}
	}
	_, err = call(cs, "create_ticket", "k-old", args)
	wantCode(t, err, jsonrpc.CodeInvalidParams, "other arguments")
	if got := b.sink.of("k-old"); got != 0 {
		t.Fatalf("effects = %d, want 0", got)
	}
}
