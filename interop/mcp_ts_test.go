package interop_test

// The official TypeScript MCP client against an mcpkey tool server. The Go
// SDK's client accepts results the TypeScript one rejects (a string as
// structuredContent, an object failing the tool's outputSchema), so our Go
// tests alone cannot see what most MCP clients do with our answers.
//
// The server serves three tools over streamable HTTP on a real PostgreSQL
// ledger: create_ticket (keyed, no output schema), refund (keyed, with an
// output schema) and lookup (AllowMissingKey). Each run of a handler is one
// row at the sink (sink_effects). The client (mcp-ts/client.mjs, run with
// node) makes the calls in two rounds: between them the real reconciler
// (reconcile.Engine with a probe reading the sink) and operator.Resolve
// store outcomes for the keys whose first call crashed after its effect.

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/ledgerkeeper/ledgerkeeper/internal/pgtest"
	"github.com/ledgerkeeper/ledgerkeeper/ledger"
	"github.com/ledgerkeeper/ledgerkeeper/ledger/mcpkey"
	"github.com/ledgerkeeper/ledgerkeeper/operator"
	"github.com/ledgerkeeper/ledgerkeeper/probes"
	"github.com/ledgerkeeper/ledgerkeeper/reconcile"
)

func TestMain(m *testing.M) { pgtest.Main(m) }

// clientDir is the Node project of the TypeScript client.
const clientDir = "mcp-ts"

// sdkPackage is the npm package under test, pinned in clientDir.
const sdkPackage = "@modelcontextprotocol/sdk"

// concurrentCalls is how many calls with one key the client makes at once.
const concurrentCalls = 20

var refundSchema = map[string]any{
	"type":       "object",
	"required":   []string{"refund_id"},
	"properties": map[string]any{"refund_id": map[string]any{"type": "string"}},
}

// The arguments of the calls. crash makes the handler panic right after its
// effect (the key stays processing); hold makes it wait until the other
// concurrent calls have been answered.
var (
	ticketArgs = map[string]any{"title": "SSO broken", "account_id": "A-1029"}
	otherArgs  = map[string]any{"title": "SSO fixed", "account_id": "A-1029"}
	holdArgs   = map[string]any{"title": "printer on fire", "hold": true}
	crashArgs  = map[string]any{"title": "charge card", "crash": true}
)

// Keys whose first call crashes after its effect, and the outcome stored for
// each before the client's retry: by the reconciler (its probe's outcome)
// or by an operator (operator.Resolve).
var storedOutcomes = []struct {
	key, tool  string
	byOperator bool
	body       string // the operator's body, or what the probe finds
}{
	{"k-rec", "create_ticket", false, `{"ticket_id":"T-7","status":"open"}`},
	{"k-rec-refund", "refund", false, `{"status":"refunded","amount_cents":500}`}, // no refund_id: fails the schema
	{"k-op-string", "create_ticket", true, `"ticket T-1 created"`},
	{"k-op-array", "create_ticket", true, `["T-1","T-2"]`},
	{"k-op-null", "create_ticket", true, `null`},
	{"k-op-refund-string", "refund", true, `"refunded"`},
	{"k-op-refund", "refund", true, `{"refund_id":"R-1"}`},
}

// ledgerTool is the ledger's tool name of each MCP tool.
var ledgerTool = map[string]string{"create_ticket": "tickets", "refund": "refunds", "lookup": "lookup"}

func TestTypeScriptClient(t *testing.T) {
	node := requireNode(t)
	db := pgtest.New(t)
	db.Exec(t, `CREATE TABLE sink_effects (id bigserial PRIMARY KEY, key text NOT NULL, tool text NOT NULL, arguments jsonb)`)
	srv := newToolServer(t, db)

	// Round one: the contract's calls, and the first calls of the keys
	// whose outcome is stored by hand or by the reconciler.
	first := plan{URL: srv.URL, Sessions: map[string]session{
		"meta":   {},
		"header": {Headers: map[string]string{ledger.HeaderIdempotencyKey: "k-header"}},
	}}
	first.add("twice-1", "meta", "create_ticket", "k-twice", ticketArgs)
	first.add("twice-2", "meta", "create_ticket", "k-twice", ticketArgs)
	first.add("other-arguments", "meta", "create_ticket", "k-twice", otherArgs)
	first.Steps = append(first.Steps, step{Name: "concurrent", Session: "meta", Tool: "create_ticket", Key: "k-conc", Arguments: holdArgs, Concurrent: concurrentCalls})
	first.add("concurrent-retry", "meta", "create_ticket", "k-conc", holdArgs)
	first.add("header-1", "header", "create_ticket", "", ticketArgs)
	first.add("header-2", "header", "create_ticket", "", ticketArgs)
	first.add("header-meta-differ", "header", "create_ticket", "k-not-header", ticketArgs)
	first.add("lookup-1", "header", "lookup", "", ticketArgs)
	first.add("lookup-2", "header", "lookup", "", ticketArgs)
	first.Steps = append(first.Steps,
		step{Name: "no-arguments", Session: "meta", Tool: "create_ticket", Key: "k-noargs"},
		step{Name: "empty-arguments", Session: "meta", Tool: "create_ticket", Key: "k-noargs", Arguments: map[string]any{}})
	for _, o := range storedOutcomes {
		first.add("crash-"+o.key, "meta", o.tool, o.key, crashArgs)
	}
	got := runClient(t, node, first)
	t.Logf("TypeScript client: %s %s", sdkPackage, got.SDKVersion)

	// Same key twice: one effect, the second answer a replay of the first.
	one := got.one(t, "twice-1").result(t)
	two := got.one(t, "twice-2").result(t)
	if one.Meta[mcpkey.MetaReplay] != nil || two.Meta[mcpkey.MetaReplay] != true || two.IsError ||
		string(one.StructuredContent) != string(two.StructuredContent) || one.text() != two.text() {
		t.Errorf("same key twice: first %s, second %s; want the second a replay of the first", one, two)
	}
	// Other arguments: invalid params, the handler does not run.
	got.one(t, "other-arguments").wantError(t, -32602, "already used with different arguments")
	wantEffects(t, db, "k-twice", 1)

	// 20 at once: one ran, 19 were told to retry later, the retry replays.
	var ran, inFlight int
	for _, a := range got.Steps["concurrent"] {
		r := a.result(t)
		switch {
		case r.IsError && r.Meta[mcpkey.MetaRetryAfter] != nil:
			inFlight++
		case !r.IsError && r.Meta[mcpkey.MetaReplay] == nil:
			ran++
		default:
			t.Errorf("concurrent: unexpected answer %s", r)
		}
	}
	if ran != 1 || inFlight != concurrentCalls-1 {
		t.Errorf("concurrent: %d ran, %d in flight; want 1 and %d", ran, inFlight, concurrentCalls-1)
	}
	if r := got.one(t, "concurrent-retry").result(t); r.Meta[mcpkey.MetaReplay] != true {
		t.Errorf("retry after the concurrent calls: %s, want a replay", r)
	}
	wantEffects(t, db, "k-conc", 1)

	// The key in a session-wide header: one effect, then a replay.
	if r := got.one(t, "header-2").result(t); r.Meta[mcpkey.MetaReplay] != true || got.one(t, "header-1").result(t).IsError {
		t.Errorf("header key: second call %s, want a replay", r)
	}
	wantEffects(t, db, "k-header", 1)
	// A per-call _meta key that differs from the session's header is
	// refused, not guessed at.
	got.one(t, "header-meta-differ").wantError(t, -32602, "differ")
	wantEffects(t, db, "k-not-header", 0)
	// The AllowMissingKey tool ignores the session's header: it runs each
	// time and claims nothing.
	for _, name := range []string{"lookup-1", "lookup-2"} {
		if r := got.one(t, name).result(t); r.IsError || r.Meta[mcpkey.MetaReplay] != nil {
			t.Errorf("%s: %s, want a fresh run", name, r)
		}
	}
	if n := db.Count(t, "sink_effects WHERE tool = 'lookup'"); n != 2 {
		t.Errorf("lookup effects = %d, want 2", n)
	}
	if n := db.Count(t, "idempotency_keys WHERE tool = 'lookup'"); n != 0 {
		t.Errorf("lookup rows = %d, want 0: the session's header was claimed", n)
	}

	// No arguments (the SDK sends none) and {} are one request.
	if r := got.one(t, "empty-arguments").result(t); r.Meta[mcpkey.MetaReplay] != true || got.one(t, "no-arguments").result(t).IsError {
		t.Errorf("{} after no arguments: %s, want a replay", r)
	}
	wantEffects(t, db, "k-noargs", 1)
	// …fingerprinted as {"arguments":{},"tool":"create_ticket"} (mcpkey's
	// golden fingerprint).
	if n := db.Count(t, "idempotency_keys WHERE key = 'k-noargs' AND request_hash = $1",
		"12bc9f25234fe043b33e9b6b2d400720edcdd788636de4a6202486471a652a19"); n != 1 {
		t.Errorf("k-noargs: request_hash is not the fingerprint of {} arguments")
	}

	// The first calls of the stored-outcome keys crashed after their effect.
	for _, o := range storedOutcomes {
		got.one(t, "crash-"+o.key).wantError(t, -32603, "stays processing")
		wantEffects(t, db, o.key, 1)
	}

	storeOutcomes(t, db)

	// Round two: the retries of the stored-outcome keys, in new sessions.
	second := plan{URL: srv.URL, Sessions: map[string]session{"meta": {}}}
	for _, o := range storedOutcomes {
		second.add("retry-"+o.key, "meta", o.tool, o.key, crashArgs)
	}
	got = runClient(t, node, second)
	retry := func(key string) callResult { return got.one(t, "retry-"+key).result(t) }

	// A reconciler-stored object: the structured content and its JSON.
	if r := retry("k-rec"); r.IsError || !jsonEqual(r.StructuredContent, `{"ticket_id":"T-7","status":"open"}`) ||
		!jsonEqual(json.RawMessage(r.text()), `{"ticket_id":"T-7","status":"open"}`) || r.Meta[mcpkey.MetaReplay] != true {
		t.Errorf("reconciler-stored object: %s", r)
	}
	// A reconciler-stored object failing refund's output schema: an error
	// result saying the call completed, the outcome as text, why in _meta.
	if r := retry("k-rec-refund"); !r.IsError || r.StructuredContent != nil ||
		!strings.Contains(r.text(), "already completed") || !strings.Contains(r.text(), `"amount_cents": 500`) ||
		!strings.Contains(r.asText(), "does not match the tool's outputSchema") {
		t.Errorf("reconciler-stored object failing the output schema: %s", r)
	}
	// Operator-stored strings, an array and null: text only, why in _meta.
	for key, text := range map[string]string{"k-op-string": "ticket T-1 created", "k-op-array": `["T-1", "T-2"]`, "k-op-null": "null"} {
		if r := retry(key); r.IsError || r.StructuredContent != nil || r.text() != text ||
			!strings.Contains(r.asText(), "structuredContent must be a JSON object") || r.Meta[mcpkey.MetaReplay] != true {
			t.Errorf("%s: %s, want text %q only", key, r, text)
		}
	}
	// An operator-stored string for refund (Slack's Store outcome with
	// "refunded"): an error result, the string as text.
	if r := retry("k-op-refund-string"); !r.IsError || r.StructuredContent != nil ||
		!strings.Contains(r.text(), "already completed") || !strings.Contains(r.text(), "\nrefunded") ||
		!strings.Contains(r.asText(), "a JSON string") {
		t.Errorf("operator-stored string for a tool with an output schema: %s", r)
	}
	// An operator-stored object matching refund's schema: its structured
	// content, which the SDK validated.
	if r := retry("k-op-refund"); r.IsError || !jsonEqual(r.StructuredContent, `{"refund_id":"R-1"}`) || r.asText() != "" {
		t.Errorf("operator-stored object matching the output schema: %s", r)
	}
	// No retry ran a handler again; every key is completed as stored.
	for _, o := range storedOutcomes {
		wantEffects(t, db, o.key, 1)
		k, err := ledger.Get(context.Background(), db.Pool, o.key)
		if err != nil {
			t.Fatal(err)
		}
		if k.Status != ledger.StatusCompleted || !jsonEqual(k.ResponseBody, o.body) {
			t.Errorf("%s: row %s %s, want completed %s", o.key, k.Status, k.ResponseBody, o.body)
		}
	}
	if n := db.Count(t, "reconcile_audit WHERE key = ANY($1) AND action = $2",
		[]string{"k-rec", "k-rec-refund"}, reconcile.ActionCompleted); n != 2 {
		t.Errorf("reconciler's completed audit rows = %d, want 2", n)
	}
	if n := db.Count(t, "sink_effects WHERE tool <> 'lookup'"); n != 4+len(storedOutcomes) {
		t.Errorf("effects = %d, want %d (k-twice, k-conc, k-header, k-noargs and one per stored outcome)", n, 4+len(storedOutcomes))
	}
}

// storeOutcomes stores the outcome of each key of storedOutcomes: past its
// processing window, an operator's through operator.Resolve, the others
// through a pass of the real reconciler whose probe finds the effect at the
// sink.
func storeOutcomes(t *testing.T, db *pgtest.DB) {
	t.Helper()
	ctx := context.Background()
	db.Exec(t, `UPDATE idempotency_keys SET claimed_at = now() - interval '10 minutes',
		created_at = now() - interval '10 minutes' WHERE status = 'processing'`)
	found := map[string]string{}
	var reconciled []string
	for _, o := range storedOutcomes {
		if !o.byOperator {
			found[o.key] = o.body
			reconciled = append(reconciled, o.key)
			continue
		}
		_, err := operator.Resolve(ctx, db.Pool, operator.ResolveRequest{
			Key: o.key, Mark: operator.MarkCompleted, Code: 200, Body: json.RawMessage(o.body),
			Reason: "checked downstream: it happened", Actor: "interop-test",
			Windows: func(string) (time.Duration, time.Duration) { return time.Second, time.Second },
		})
		if err != nil {
			t.Fatalf("resolve %s: %v", o.key, err)
		}
	}
	// The probe asks the sink, as an sql probe would ask the downstream.
	probe := probes.ProbeFunc(func(ctx context.Context, k probes.Key) probes.Result {
		var n int
		if err := db.Pool.QueryRow(ctx, `SELECT count(*) FROM sink_effects WHERE key = $1`, k.Key).Scan(&n); err != nil {
			return probes.Result{Verdict: probes.Unknown, Err: err}
		}
		if n != 1 {
			return probes.Result{Verdict: probes.Unknown, Err: fmt.Errorf("%d effects", n)}
		}
		return probes.Result{Verdict: probes.Found, Outcome: &probes.Outcome{Code: 200, Body: json.RawMessage(found[k.Key])},
			Evidence: json.RawMessage(`{"effects":1}`)}
	})
	policy := reconcile.Policy{ProcessingWindow: time.Second, Probe: probe, SelfCheckDisabled: true}
	eng := reconcile.New(reconcile.Config{
		Actor: "interop-test",
		Tools: map[string]reconcile.Policy{"tickets": policy, "refunds": policy},
	}, db.Pool, nil, nil)
	rep, err := eng.Run(ctx, reconcile.Options{Keys: reconciled})
	if err != nil {
		t.Fatalf("reconcile: %v", err)
	}
	if rep.Actions[reconcile.ActionCompleted] != len(reconciled) {
		t.Fatalf("reconcile actions = %v, want %d %s", rep.Actions, len(reconciled), reconcile.ActionCompleted)
	}
}

// newToolServer serves create_ticket, refund and lookup behind mcpkey over
// streamable HTTP.
func newToolServer(t *testing.T, db *pgtest.DB) *httptest.Server {
	t.Helper()
	server := mcp.NewServer(&mcp.Implementation{Name: "tickets", Version: "interop"}, nil)
	inFlight := make(chan struct{}, 2*concurrentCalls)
	handle := func(ctx context.Context, req *mcp.CallToolRequest) (*mcp.CallToolResult, error) {
		a, _ := ledger.AttemptFromContext(ctx)
		var args struct{ Crash, Hold bool }
		if len(req.Params.Arguments) > 0 {
			if err := json.Unmarshal(req.Params.Arguments, &args); err != nil {
				return nil, err
			}
		}
		var id int64
		err := db.Pool.QueryRow(ctx, `INSERT INTO sink_effects (key, tool, arguments) VALUES ($1, $2, $3) RETURNING id`,
			a.Key, ledgerTool[req.Params.Name], req.Params.Arguments).Scan(&id)
		if err != nil {
			return nil, err
		}
		if args.Crash {
			panic("crash after the effect")
		}
		if args.Hold {
			// Answer only once the other calls with this key were told
			// to retry (or the deadline passes, and the counts fail).
			deadline := time.After(10 * time.Second)
			for range concurrentCalls - 1 {
				select {
				case <-inFlight:
				case <-deadline:
					return nil, errors.New("the other concurrent calls were not answered in time")
				}
			}
		}
		out := map[string]any{"ticket_id": fmt.Sprintf("T-%d", id)}
		if req.Params.Name == "refund" {
			out = map[string]any{"refund_id": fmt.Sprintf("R-%d", id)}
		}
		return &mcp.CallToolResult{Content: []mcp.Content{&mcp.TextContent{Text: fmt.Sprint(out)}}, StructuredContent: out}, nil
	}
	object := map[string]any{"type": "object"}
	for _, tool := range []*mcp.Tool{
		{Name: "create_ticket", InputSchema: object},
		{Name: "refund", InputSchema: object, OutputSchema: refundSchema},
		{Name: "lookup", InputSchema: object},
	} {
		wrapped := mcpkey.Wrap(mcpkey.Config{
			DB: db.Pool, Tool: ledgerTool[tool.Name], OutputSchema: tool.OutputSchema, AllowMissingKey: tool.Name == "lookup",
		}, handle)
		server.AddTool(tool, func(ctx context.Context, req *mcp.CallToolRequest) (*mcp.CallToolResult, error) {
			res, err := wrapped(ctx, req)
			if res != nil && res.Meta[mcpkey.MetaRetryAfter] != nil {
				inFlight <- struct{}{}
			}
			return res, err
		})
	}
	srv := httptest.NewServer(mcp.NewStreamableHTTPHandler(func(*http.Request) *mcp.Server { return server }, nil))
	t.Cleanup(srv.Close)
	// Before srv.Close: the sessions of a client that did not end them
	// (client.mjs does, unless it failed half-way).
	t.Cleanup(func() {
		for _, ss := range slices.Collect(server.Sessions()) {
			_ = ss.Close() // the test is over; a session already gone is fine
		}
	})
	return srv
}

// requireNode returns the path of node, after making sure clientDir's
// node_modules holds the pinned SDK (npm ci). Without node or npm the test
// fails, saying what to install: interop is never skipped.
func requireNode(t *testing.T) string {
	t.Helper()
	node, nodeErr := exec.LookPath("node")
	npm, npmErr := exec.LookPath("npm")
	if nodeErr != nil || npmErr != nil {
		t.Fatalf("the TypeScript MCP client needs Node.js 18 or newer and npm on PATH (node: %v; npm: %v): "+
			"install them (Debian/Ubuntu: apt-get install nodejs npm)", nodeErr, npmErr)
	}
	var pkg struct{ Dependencies map[string]string }
	readJSON(t, filepath.Join(clientDir, "package.json"), &pkg)
	want := pkg.Dependencies[sdkPackage]
	var installed struct{ Version string }
	b, err := os.ReadFile(filepath.Join(clientDir, "node_modules", sdkPackage, "package.json"))
	if err == nil {
		err = json.Unmarshal(b, &installed)
	}
	if err == nil && installed.Version == want {
		return node
	}
	t.Logf("%s %s not installed in %s (found %q): npm ci", sdkPackage, want, clientDir, installed.Version)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	// --prefer-offline: the lockfile pins every package by integrity, so a
	// cached copy needs no revalidation round trip.
	cmd := exec.CommandContext(ctx, npm, "ci", "--no-audit", "--no-fund", "--prefer-offline")
	cmd.Dir = clientDir
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("npm ci in %s (the pinned %s, from package-lock.json): %v\n%s", clientDir, sdkPackage, err, out)
	}
	return node
}

// runClient runs client.mjs with p and returns what the SDK answered.
func runClient(t *testing.T, node string, p plan) clientOutput {
	t.Helper()
	in, err := json.Marshal(p)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, node, "client.mjs")
	cmd.Dir = clientDir
	cmd.Stdin = bytes.NewReader(in)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		t.Fatalf("node client.mjs: %v\nstderr:\n%s", err, stderr.String())
	}
	var out clientOutput
	if err := json.Unmarshal(stdout.Bytes(), &out); err != nil {
		t.Fatalf("client output: %v\n%s\nstderr:\n%s", err, stdout.String(), stderr.String())
	}
	return out
}

type plan struct {
	URL      string             `json:"url"`
	Sessions map[string]session `json:"sessions"`
	Steps    []step             `json:"steps"`
}

type session struct {
	Headers map[string]string `json:"headers,omitempty"`
}

type step struct {
	Name       string         `json:"name"`
	Session    string         `json:"session"`
	Tool       string         `json:"tool"`
	Key        string         `json:"key,omitempty"`
	Arguments  map[string]any `json:"arguments,omitempty"` // nil: no arguments field at all
	Concurrent int            `json:"concurrent,omitempty"`
}

func (p *plan) add(name, session, tool, key string, args map[string]any) {
	p.Steps = append(p.Steps, step{Name: name, Session: session, Tool: tool, Key: key, Arguments: args})
}

type clientOutput struct {
	SDKVersion string              `json:"sdkVersion"`
	Steps      map[string][]answer `json:"steps"`
}

// one is the answer of a step made once.
func (o clientOutput) one(t *testing.T, name string) answer {
	t.Helper()
	if len(o.Steps[name]) != 1 {
		t.Fatalf("step %s: %d answers, want 1", name, len(o.Steps[name]))
	}
	return o.Steps[name][0]
}

// answer is what callTool returned, or what it threw.
type answer struct {
	Result *callResult `json:"result"`
	Error  *struct {
		Name    string `json:"name"`
		Code    *int   `json:"code"`
		Message string `json:"message"`
	} `json:"error"`
}

// result is the result the client returned; when it threw instead, the
// test fails and the result is empty (so the caller's checks fail too).
func (a answer) result(t *testing.T) callResult {
	t.Helper()
	if a.Result == nil {
		t.Errorf("the TypeScript client threw %s, want a result", a)
		return callResult{}
	}
	return *a.Result
}

func (a answer) wantError(t *testing.T, code int, msg string) {
	t.Helper()
	if a.Error == nil || a.Error.Code == nil || *a.Error.Code != code || !strings.Contains(a.Error.Message, msg) {
		t.Errorf("want the TypeScript client to throw an MCP error %d containing %q, got %s", code, msg, a)
	}
}

func (a answer) String() string {
	b, _ := json.Marshal(a)
	return string(b)
}

// callResult is a CallToolResult as the TypeScript client returned it.
type callResult struct {
	Meta              map[string]any  `json:"_meta"`
	Content           []content       `json:"content"`
	StructuredContent json.RawMessage `json:"structuredContent"`
	IsError           bool            `json:"isError"`
}

type content struct {
	Type string `json:"type"`
	Text string `json:"text"`
}

// text is the result's text contents, one per line.
func (r callResult) text() string {
	var parts []string
	for _, c := range r.Content {
		parts = append(parts, c.Text)
	}
	return strings.Join(parts, "\n")
}

// asText is _meta[MetaAsText]: why the outcome came as text only.
func (r callResult) asText() string {
	s, _ := r.Meta[mcpkey.MetaAsText].(string)
	return s
}

func (r callResult) String() string {
	b, _ := json.Marshal(r)
	return string(b)
}

func wantEffects(t *testing.T, db *pgtest.DB, key string, want int) {
	t.Helper()
	if n := db.Count(t, "sink_effects WHERE key = $1", key); n != want {
		t.Errorf("%s: %d effects at the sink, want %d", key, n, want)
	}
}

func jsonEqual(got json.RawMessage, want string) bool {
	a, err1 := ledger.Canonical(got)
	b, err2 := ledger.Canonical([]byte(want))
	return err1 == nil && err2 == nil && len(got) > 0 && bytes.Equal(a, b)
}

func readJSON(t *testing.T, path string, v any) {
	t.Helper()
	b, err := os.ReadFile(path)
	if err == nil {
		err = json.Unmarshal(b, v)
	}
	if err != nil {
		t.Fatalf("read %s: %v", path, err)
	}
}
