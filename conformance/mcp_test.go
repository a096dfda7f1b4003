package conformance_test

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/ledgerkeeper/ledgerkeeper/conformance"
	"github.com/ledgerkeeper/ledgerkeeper/internal/pgtest"
	"github.com/ledgerkeeper/ledgerkeeper/ledger/mcpkey"
	"github.com/ledgerkeeper/ledgerkeeper/probes"
)

// mcpProbeConfig is create_ticket's probe for the MCP sink: it reads the
// title from the request as mcpkey stores it (request.arguments.title),
// and the sink answers only effects with that title.
const mcpProbeConfig = `
tools:
  create_ticket:
    processing_window: 1s
    probe:
      type: http
      url: "${TOOL_URL}/v1/tickets?idempotency_key={key}&title={request.arguments.title}"
      timeout: 3s
      match: "data"
      response_code: 200
retention:
  min_age: 24h
`

// mcpSink counts the MCP tool's effects per key and serves them as
// GET /v1/tickets?idempotency_key=K&title=T → {"data":[...]} for the http
// probe. A call titled "slow" takes a second; one titled "fail" is a tool
// error with an error id and no effect.
type mcpSink struct {
	mu      sync.Mutex
	effects map[string][]map[string]any
	errs    int
}

func (s *mcpSink) handle(ctx context.Context, req *mcp.CallToolRequest) (*mcp.CallToolResult, error) {
	key, _ := req.Params.Meta[mcpkey.MetaKey].(string)
	var args struct{ Title string }
	_ = json.Unmarshal(req.Params.Arguments, &args)
	switch args.Title {
	case "fail":
		s.mu.Lock()
		s.errs++
		n := s.errs
		s.mu.Unlock()
		return &mcp.CallToolResult{IsError: true, Content: []mcp.Content{&mcp.TextContent{Text: fmt.Sprintf("ticket store failed (error E-%d)", n)}}}, nil
	case "slow":
		t := time.NewTimer(time.Second) // processing time, not a synchronisation
		<-t.C
	}
	s.mu.Lock()
	n := len(s.effects[key]) + 1
	s.effects[key] = append(s.effects[key], map[string]any{"id": key, "title": args.Title, "n": n})
	s.mu.Unlock()
	return &mcp.CallToolResult{
		Content:           []mcp.Content{&mcp.TextContent{Text: "ticket created"}},
		StructuredContent: map[string]any{"ticket": n, "arguments": req.Params.Arguments},
	}, nil
}

func (s *mcpSink) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	s.mu.Lock()
	data := []map[string]any{}
	for _, e := range s.effects[r.URL.Query().Get("idempotency_key")] {
		if e["title"] == r.URL.Query().Get("title") {
			data = append(data, e)
		}
	}
	b, _ := json.Marshal(map[string]any{"data": data})
	s.mu.Unlock()
	w.Header().Set("Content-Type", "application/json")
	_, _ = w.Write(b)
}

// mcpBuildProbe builds mcpProbeConfig's probe against the sink at sinkURL,
// and records the request bodies it is given.
func mcpBuildProbe(t *testing.T, sinkURL string, seen *[]probes.Key) probes.Probe {
	t.Helper()
	built := buildProbeFrom(t, mcpProbeConfig, sinkURL)
	var mu sync.Mutex
	return probes.ProbeFunc(func(ctx context.Context, k probes.Key) probes.Result {
		mu.Lock()
		*seen = append(*seen, k)
		mu.Unlock()
		return built.Probe(ctx, k)
	})
}

// mcpServe serves create_ticket over streamable HTTP as add registers it.
func mcpServe(t *testing.T, add func(*mcp.Server, *mcp.Tool)) string {
	t.Helper()
	server := mcp.NewServer(&mcp.Implementation{Name: "tickets", Version: "test"}, nil)
	add(server, &mcp.Tool{Name: "create_ticket", InputSchema: map[string]any{"type": "object"}})
	srv := httptest.NewServer(mcp.NewStreamableHTTPHandler(func(*http.Request) *mcp.Server { return server }, nil))
	t.Cleanup(srv.Close)
	return srv.URL
}

func mcpRun(t *testing.T, url, sinkURL string, mutate func(*conformance.Config)) (conformance.Report, []probes.Key) {
	t.Helper()
	var seen []probes.Key
	cfg := conformance.Config{
		URL: url, MCPTool: "create_ticket", Tool: "create_ticket", Probe: mcpBuildProbe(t, sinkURL, &seen),
		KeyPrefix: "mcp-conf:", Body: json.RawMessage(body), Concurrency: 10, Timeout: 10 * time.Second, Settle: 20 * time.Second,
		SlowBody: json.RawMessage(`{"title":"slow","account_id":"A-8"}`), SlowDeadline: 100 * time.Millisecond,
		FailBody: json.RawMessage(`{"title":"fail","account_id":"A-9"}`),
	}
	if mutate != nil {
		mutate(&cfg)
	}
	rep, err := conformance.Run(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	var out strings.Builder
	_ = conformance.Print(&out, rep)
	t.Logf("conformance:\n%s", out.String())
	return rep, seen
}

func newMCPSink(t *testing.T) (*mcpSink, string) {
	sink := &mcpSink{effects: map[string][]map[string]any{}}
	srv := httptest.NewServer(sink)
	t.Cleanup(srv.Close)
	return sink, srv.URL
}

// An mcpkey tool passes both profiles, every scenario run; the probe is
// given the request exactly as mcpkey stores it (the row's request_body),
// so a probe reading request.arguments.title finds the effects.
func TestMCPKeyToolPasses(t *testing.T) {
	t.Parallel()
	sink, sinkURL := newMCPSink(t)
	db := pgtest.New(t)
	url := mcpServe(t, func(s *mcp.Server, tool *mcp.Tool) { mcpkey.AddTool(s, tool, mcpkey.Config{DB: db.Pool}, sink.handle) })
	for _, profile := range []string{conformance.ProfileDraft07, conformance.ProfileLedgerkeeper} {
		rep, seen := mcpRun(t, url, sinkURL, func(c *conformance.Config) { c.Profile = profile; c.KeyPrefix = profile + ":" })
		if !rep.OK() || rep.Skipped != 0 || rep.Passed < 14 {
			t.Fatalf("%s: failed %q, %d skipped", profile, failed(rep), rep.Skipped)
		}
		var stored string
		if err := db.Pool.QueryRow(context.Background(), `SELECT request_body::text FROM idempotency_keys WHERE key = $1`, profile+":same-key-twice").Scan(&stored); err != nil {
			t.Fatal(err)
		}
		var probed string
		for _, k := range seen {
			if k.Key == profile+":same-key-twice" {
				probed = string(k.RequestBody)
			}
		}
		if !jsonEqual(stored, probed) || !strings.Contains(probed, `"arguments":`) {
			t.Errorf("%s: the probe was given %s, mcpkey stored %s", profile, probed, stored)
		}
	}
}

func jsonEqual(a, b string) bool {
	var x, y any
	if json.Unmarshal([]byte(a), &x) != nil || json.Unmarshal([]byte(b), &y) != nil {
		return false
	}
	xb, _ := json.Marshal(x)
	yb, _ := json.Marshal(y)
	return string(xb) == string(yb)
}

// A tool that runs every call fails by name: no replay, two effects, no
// refusal.
func TestMCPCatchesUnprotectedTool(t *testing.T) {
	t.Parallel()
	sink, sinkURL := newMCPSink(t)
	url := mcpServe(t, func(s *mcp.Server, tool *mcp.Tool) { s.AddTool(tool, sink.handle) })
	rep, _ := mcpRun(t, url, sinkURL, func(c *conformance.Config) { c.SlowBody = nil; c.FailBody = nil })
	wantFailed(t, rep, "same-key-twice/second call gets the first result replayed (same content)",
		"same-key-twice/one effect", "concurrent/exactly one call executed", "concurrent/the results are one result and its replays",
		"other-arguments/the key with other arguments is refused (a JSON-RPC error or a tool error)",
		"missing-key/a call without _meta.idempotencyKey is refused (a JSON-RPC error or a tool error)")
}

// sdkStyleTool is the contract written as a TypeScript McpServer tool
// must write it, where every thrown error becomes a tool error result:
// refusals are tool errors, the in-flight answer a tool error with
// _meta.retryAfter (unless noRetryAfter). Its own store, no markers. The
// first call of a key ending in "concurrent" waits until another call of
// it was answered in flight, so in-flight answers happen on every run.
type sdkStyleTool struct {
	sink         *mcpSink
	noRetryAfter bool

	mu       sync.Mutex
	keys     map[string]*sdkEntry
	answered map[string]chan struct{}
}

type sdkEntry struct {
	args string
	res  *mcp.CallToolResult
}

func toolError(text string, meta mcp.Meta) *mcp.CallToolResult {
	return &mcp.CallToolResult{IsError: true, Meta: meta, Content: []mcp.Content{&mcp.TextContent{Text: text}}}
}

func (s *sdkStyleTool) handle(ctx context.Context, req *mcp.CallToolRequest) (*mcp.CallToolResult, error) {
	key, _ := req.Params.Meta[mcpkey.MetaKey].(string)
	if key == "" {
		return toolError("idempotencyKey is required in _meta", nil), nil
	}
	args := string(req.Params.Arguments)
	s.mu.Lock()
	e, seen := s.keys[key]
	if !seen {
		e = &sdkEntry{args: args}
		s.keys[key] = e
	}
	answered := s.answered[key]
	if answered == nil {
		answered = make(chan struct{})
		s.answered[key] = answered
	}
	s.mu.Unlock()
	switch {
	case seen && e.args != args:
		return toolError("idempotencyKey already used with other arguments", nil), nil
	case seen:
		s.mu.Lock()
		res := e.res
		s.mu.Unlock()
		if res != nil {
			return res, nil
		}
		meta := mcp.Meta{"retryAfter": 1}
		if s.noRetryAfter {
			meta = nil
		}
		select {
		case <-answered:
		default:
			close(answered)
		}
		return toolError("a call with this idempotencyKey is in progress", meta), nil
	}
	if strings.HasSuffix(key, "concurrent") {
		select {
		case <-answered:
		case <-time.After(5 * time.Second): // a bound, not a synchronisation
		}
	}
	res, err := s.sink.handle(ctx, req)
	s.mu.Lock()
	if res.IsError {
		delete(s.keys, key)
	} else {
		e.res = res
	}
	s.mu.Unlock()
	return res, err
}

// An MCP server that is not ours, answering in the TypeScript SDK's error
// style, passes the default profile: refusals as tool errors, in flight
// recognised by its retry-after. Without the retry-after, an in-flight
// tool error is just a tool error: concurrent and client-deadline fail by
// name.
func TestMCPToolErrorStylePasses(t *testing.T) {
	t.Parallel()
	for _, noRetryAfter := range []bool{false, true} {
		sink, sinkURL := newMCPSink(t)
		tool := &sdkStyleTool{sink: sink, noRetryAfter: noRetryAfter, keys: map[string]*sdkEntry{}, answered: map[string]chan struct{}{}}
		url := mcpServe(t, func(s *mcp.Server, t *mcp.Tool) { s.AddTool(t, tool.handle) })
		rep, _ := mcpRun(t, url, sinkURL, nil)
		if noRetryAfter {
			wantFailed(t, rep, "concurrent/every other call an in-flight error (an error with a retry-after)",
				"client-deadline/the immediate retry is an in-flight error or the stored result (a second execution shows at the sink)")
			for _, n := range failed(rep) {
				if !strings.HasPrefix(n, "concurrent/") && !strings.HasPrefix(n, "client-deadline/") {
					t.Errorf("without a retry-after, only the in-flight judgements should fail: %q", n)
				}
			}
			continue
		}
		if !rep.OK() || rep.Skipped != 0 {
			t.Fatalf("failed %q, %d skipped", failed(rep), rep.Skipped)
		}
	}
}

// An MCP server without the tool, or no MCP server at all, stops the run
// with one error.
func TestMCPStopsWhenNothingCanBeJudged(t *testing.T) {
	t.Parallel()
	sink, sinkURL := newMCPSink(t)
	url := mcpServe(t, func(s *mcp.Server, _ *mcp.Tool) {
		s.AddTool(&mcp.Tool{Name: "open_ticket", InputSchema: map[string]any{"type": "object"}}, sink.handle)
	})
	var seen []probes.Key
	_, err := conformance.Run(context.Background(), conformance.Config{URL: url, MCPTool: "create_ticket", Tool: "create_ticket",
		Probe: mcpBuildProbe(t, sinkURL, &seen), Body: json.RawMessage(body), Timeout: 5 * time.Second})
	if err == nil || !strings.Contains(err.Error(), `has no tool "create_ticket" (its tools: open_ticket)`) {
		t.Errorf("err = %v", err)
	}
	_, err = conformance.Run(context.Background(), conformance.Config{URL: sinkURL, MCPTool: "create_ticket", Tool: "create_ticket",
		Probe: mcpBuildProbe(t, sinkURL, &seen), Body: json.RawMessage(body), Timeout: 5 * time.Second})
	if err == nil || !strings.Contains(err.Error(), "cannot open an MCP session") {
		t.Errorf("err = %v", err)
	}
}
