package ledger_test

// The tests of Middleware itself, around a handler of their own whose
// effects are counted in memory, on a real PostgreSQL ledger. The contract
// tests of the example tool server (one ticket per key end to end, under
// concurrency, after expiry) stay in internal/exampletool.

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/ledgerkeeper/ledgerkeeper/ledger"
	"github.com/ledgerkeeper/ledgerkeeper/ledger/ledgertest"
	"github.com/ledgerkeeper/ledgerkeeper/ledger/ledgertest/testwait"
)

// mwTool is the handler behind the middleware: it records one effect per
// run, then answers {"effect": N} with code, or 400 for a body whose "title"
// is empty (a validation failure, which is a definitive outcome).
type mwTool struct {
	// code is the answer after the effect (default 201).
	code int
	// hold, when set, keeps every run waiting after its effect until
	// release: a processing time the test ends itself, not a sleep.
	hold     chan struct{}
	holdOnce sync.Once
	// afterEffect, when set, runs after the effect (tests panic here).
	afterEffect func(key string)

	mu      sync.Mutex
	effects map[string]int
	started chan string
}

func (h *mwTool) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	attempt, ok := ledger.AttemptFromContext(r.Context())
	if !ok {
		http.Error(w, "no attempt in the context", http.StatusInternalServerError)
		return
	}
	var req struct {
		Title *string `json:"title"`
	}
	_ = json.NewDecoder(r.Body).Decode(&req)
	if req.Title != nil && *req.Title == "" {
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusBadRequest)
		_, _ = w.Write([]byte(`{"error":"title is required"}`))
		return
	}
	h.mu.Lock()
	h.effects[attempt.Key]++
	n := h.effects[attempt.Key]
	h.mu.Unlock()
	h.started <- attempt.Key
	if h.afterEffect != nil {
		h.afterEffect(attempt.Key)
	}
	if h.hold != nil {
		<-h.hold // the work goes on whether or not the client still waits
	}
	code := h.code
	if code == 0 {
		code = http.StatusCreated
	}
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(code)
	_ = json.NewEncoder(w).Encode(map[string]int{"effect": n})
}

// release ends every held run (once; again is a no-op).
func (h *mwTool) release() { h.holdOnce.Do(func() { close(h.hold) }) }

func (h *mwTool) effectsOf(key string) int {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.effects[key]
}

func (h *mwTool) total() int {
	h.mu.Lock()
	defer h.mu.Unlock()
	n := 0
	for _, c := range h.effects {
		n += c
	}
	return n
}

type mwBundle struct {
	db   *ledgertest.DB
	srv  *httptest.Server
	tool *mwTool
}

// mwSetup serves tool behind ledger.Middleware (tool name create_ticket) on
// a fresh migrated ledger.
func mwSetup(t *testing.T, tool *mwTool, cfg ledger.MiddlewareConfig) *mwBundle {
	t.Helper()
	db := ledgertest.New(t)
	tool.effects = map[string]int{}
	tool.started = make(chan string, 100)
	cfg.DB, cfg.Tool = db.Pool, "create_ticket"
	srv := httptest.NewServer(ledger.Middleware(cfg, tool))
	t.Cleanup(srv.Close)
	if tool.hold != nil {
		t.Cleanup(tool.release) // before srv.Close, which waits for the handlers
	}
	return &mwBundle{db: db, srv: srv, tool: tool}
}

type mwAnswer struct {
	code     int
	replayed string
	retry    string
	ctype    string
	env      ledger.Envelope
	raw      string
}

// wantProblem fails unless a is an RFC 9457 problem of type typ with status
// code, sent as application/problem+json, and free of the success envelope.
func wantProblem(t *testing.T, what string, a mwAnswer, code int, typ string) {
	t.Helper()
	if a.code != code {
		t.Errorf("%s: code = %d, want %d (%s)", what, a.code, code, a.raw)
		return
	}
	if a.ctype != ledger.ContentTypeProblem {
		t.Errorf("%s: Content-Type = %q, want %q", what, a.ctype, ledger.ContentTypeProblem)
	}
	var fields map[string]json.RawMessage
	if err := json.Unmarshal([]byte(a.raw), &fields); err != nil {
		t.Fatalf("%s: body is not a JSON object: %v: %s", what, err, a.raw)
	}
	var p ledger.Problem
	_ = json.Unmarshal([]byte(a.raw), &p)
	if p.Type != typ || p.Status != code || p.Title == "" || p.Detail == "" {
		t.Errorf("%s: problem = %+v, want type %s, status %d, a title and a detail", what, p, typ, code)
	}
	for _, f := range []string{"ok", "idempotent_replay", "original_response"} {
		if _, there := fields[f]; there {
			t.Errorf("%s: problem body carries envelope field %q: %s", what, f, a.raw)
		}
	}
}

// call sends one request on a fresh connection.
func (b *mwBundle) call(t *testing.T, ctx context.Context, key, body string) (mwAnswer, error) {
	t.Helper()
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, b.srv.URL, strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	if key != "" {
		req.Header.Set(ledger.HeaderIdempotencyKey, key)
	}
	client := &http.Client{Transport: &http.Transport{DisableKeepAlives: true}}
	resp, err := client.Do(req)
	if err != nil {
		return mwAnswer{}, err
	}
	defer resp.Body.Close()
	raw, _ := io.ReadAll(resp.Body)
	a := mwAnswer{code: resp.StatusCode, replayed: resp.Header.Get(ledger.HeaderReplayed), retry: resp.Header.Get("Retry-After"), ctype: resp.Header.Get("Content-Type"), raw: string(raw)}
	_ = json.Unmarshal(raw, &a.env)
	return a, nil
}

func (b *mwBundle) mustCall(t *testing.T, key, body string) mwAnswer {
	t.Helper()
	a, err := b.call(t, context.Background(), key, body)
	if err != nil {
		t.Fatalf("call: %v", err)
	}
	return a
}

// callAbandoned sends a request and gives up once the handler has started
// (the client's deadline was shorter than the processing time).
func (b *mwBundle) callAbandoned(t *testing.T, key, body string) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	errc := make(chan error, 1)
	go func() {
		_, err := b.call(t, ctx, key, body)
		errc <- err
	}()
	testwait.Recv(t, b.tool.started, testwait.Timeout)
	cancel()
	if err := testwait.Recv(t, errc, testwait.Timeout); !errors.Is(err, context.Canceled) {
		t.Fatalf("the abandoned call should fail at the client, got %v", err)
	}
}

const mwBody = `{"title": "SSO broken", "account_id": "A-1029"}`

// Same key twice: the handler runs once; the second answer replays the
// first's stored outcome, marked in the envelope and the header.
func TestMiddlewareReplaysStoredOutcome(t *testing.T) {
	t.Parallel()
	b := mwSetup(t, &mwTool{}, ledger.MiddlewareConfig{})
	first := b.mustCall(t, "k", mwBody)
	// Same arguments, other key order and whitespace: same fingerprint.
	second := b.mustCall(t, "k", `{"account_id":"A-1029","title":"SSO broken"}`)
	if first.code != http.StatusCreated || second.code != http.StatusCreated {
		t.Fatalf("codes %d %d: %s / %s", first.code, second.code, first.raw, second.raw)
	}
	if n := b.tool.effectsOf("k"); n != 1 {
		t.Fatalf("effects = %d, want 1", n)
	}
	if first.env.IdempotentReplay || first.replayed != "" || !second.env.IdempotentReplay || second.replayed != "true" {
		t.Fatalf("replay flags: first %+v %q, second %+v %q", first.env, first.replayed, second.env, second.replayed)
	}
	if !first.env.OK || !second.env.OK || string(first.env.OriginalResponse) != string(second.env.OriginalResponse) {
		t.Fatalf("envelopes differ: %s / %s", first.raw, second.raw)
	}
	// The success envelope stays plain JSON with exactly its three fields.
	for _, a := range []mwAnswer{first, second} {
		var fields map[string]json.RawMessage
		_ = json.Unmarshal([]byte(a.raw), &fields)
		if a.ctype != "application/json" || len(fields) != 3 || fields["type"] != nil {
			t.Fatalf("envelope %q %s, want application/json with ok, idempotent_replay, original_response", a.ctype, a.raw)
		}
	}
}

// A key sent as the draft's Structured Field String ("k") and the same key
// sent bare (k) are one key: one claim, one effect, the second a replay.
func TestMiddlewareQuotedAndBareKeyAreOneKey(t *testing.T) {
	t.Parallel()
	b := mwSetup(t, &mwTool{}, ledger.MiddlewareConfig{})
	first := b.mustCall(t, `"wf-1:step-2"`, mwBody)
	second := b.mustCall(t, "wf-1:step-2", mwBody)
	if first.code != http.StatusCreated || second.code != http.StatusCreated || second.replayed != "true" {
		t.Fatalf("quoted then bare: %d %s / %d %s (replayed %q)", first.code, first.raw, second.code, second.raw, second.replayed)
	}
	if n := b.tool.effectsOf("wf-1:step-2"); n != 1 || b.db.Count(t, "idempotency_keys WHERE key = 'wf-1:step-2'") != 1 || b.db.Count(t, "idempotency_keys") != 1 {
		t.Fatalf("effects %d, rows %d; want one effect under the unquoted key", n, b.db.Count(t, "idempotency_keys"))
	}
}

// A key a draft client sent quoted before quoted keys were parsed was
// stored with its quotes: its retries keep claiming that row (a replay of
// its outcome), never a second key and a second effect.
func TestMiddlewareQuotedKeyStoredWithItsQuotesKeepsItsRow(t *testing.T) {
	t.Parallel()
	b := mwSetup(t, &mwTool{}, ledger.MiddlewareConfig{})
	ctx := context.Background()
	hash, err := ledger.Fingerprint([]byte(mwBody))
	if err != nil {
		t.Fatal(err)
	}
	legacy := `"wf-legacy:step-1"`
	claimed, err := ledger.Claim(ctx, b.db.Pool, ledger.ClaimParams{Key: legacy, Tool: "create_ticket", RequestHash: hash})
	if err != nil {
		t.Fatal(err)
	}
	if err := ledger.Complete(ctx, b.db.Pool, legacy, claimed.Row.ClaimedAt, http.StatusCreated, json.RawMessage(`{"ticket_id":"T-old"}`)); err != nil {
		t.Fatal(err)
	}
	got := b.mustCall(t, legacy, mwBody)
	if got.code != http.StatusCreated || got.replayed != "true" || !strings.Contains(got.raw, "T-old") {
		t.Fatalf("retry of a key stored quoted: %d %s (replayed %q), want the stored outcome", got.code, got.raw, got.replayed)
	}
	if n := b.tool.total(); n != 0 || b.db.Count(t, "idempotency_keys") != 1 {
		t.Fatalf("effects %d, rows %d; want no effect and no second row", n, b.db.Count(t, "idempotency_keys"))
	}
}

// Same key, other arguments: 422, and the handler does not run again.
func TestMiddlewareOtherArguments(t *testing.T) {
	t.Parallel()
	b := mwSetup(t, &mwTool{}, ledger.MiddlewareConfig{})
	b.mustCall(t, "k", mwBody)
	got := b.mustCall(t, "k", `{"title": "something else", "account_id": "A-1029"}`)
	wantProblem(t, "other arguments", got, http.StatusUnprocessableEntity, ledger.ProblemKeyReused)
	if n := b.tool.total(); n != 1 {
		t.Fatalf("effects = %d, want 1", n)
	}
}

// The client gives up while the handler runs: its retry lands mid-flight and
// gets 409 with Retry-After, never a second run; once the first attempt has
// finished, the retry gets its replay.
func TestMiddlewareInFlightThenReplay(t *testing.T) {
	t.Parallel()
	b := mwSetup(t, &mwTool{hold: make(chan struct{})}, ledger.MiddlewareConfig{RetryAfter: 3 * time.Second})
	b.callAbandoned(t, "slow", mwBody)
	retry := b.mustCall(t, "slow", mwBody)
	if retry.code != http.StatusConflict || retry.retry != "3" {
		t.Fatalf("retry = %d Retry-After %q %s, want 409 with Retry-After 3", retry.code, retry.retry, retry.raw)
	}
	wantProblem(t, "in flight", retry, http.StatusConflict, ledger.ProblemKeyInFlight)
	if !strings.Contains(retry.raw, "after 3 seconds") {
		t.Errorf("in-flight detail does not repeat Retry-After: %s", retry.raw)
	}
	b.tool.release()
	var last mwAnswer
	testwait.Eventually(t, func() bool {
		last = b.mustCall(t, "slow", mwBody)
		return last.code != http.StatusConflict
	}, testwait.Timeout, "the first attempt to store its outcome (retries answered 409 until then)")
	if last.code != http.StatusCreated || !last.env.IdempotentReplay {
		t.Fatalf("final retry = %d %s", last.code, last.raw)
	}
	if n := b.tool.effectsOf("slow"); n != 1 {
		t.Fatalf("effects = %d, want 1", n)
	}
}

// The handler crashes after its effect and before the outcome is stored: the
// key stays processing with no stored response (the reconciler's input) but
// with its request body (the probes' input), and retries get 409, not a
// second run.
func TestMiddlewarePanicLeavesProcessing(t *testing.T) {
	t.Parallel()
	b := mwSetup(t, &mwTool{afterEffect: func(key string) {
		if key == "crash" {
			panic(http.ErrAbortHandler) // net/http aborts the connection quietly
		}
	}}, ledger.MiddlewareConfig{})
	if _, err := b.call(t, context.Background(), "crash", mwBody); err == nil {
		t.Fatal("the crashed request should fail at the client")
	}
	k, err := ledger.Get(context.Background(), b.db.Pool, "crash")
	if err != nil {
		t.Fatal(err)
	}
	if k.Status != ledger.StatusProcessing || k.ResponseCode != nil || k.ResponseBody != nil {
		t.Fatalf("row = %+v, want processing without outcome", k)
	}
	if string(k.RequestBody) == "" || k.Tool != "create_ticket" {
		t.Fatalf("request body or tool not stored for probes: %+v", k)
	}
	retry := b.mustCall(t, "crash", mwBody)
	if retry.code != http.StatusConflict {
		t.Fatalf("retry = %d %s", retry.code, retry.raw)
	}
	if n := b.tool.effectsOf("crash"); n != 1 {
		t.Fatalf("effects = %d, want 1", n)
	}
}

// A validation failure (4xx) is a definitive outcome: stored and replayed.
// A 5xx is not: the key stays processing, never a cached 500.
func TestMiddlewareCachingRule(t *testing.T) {
	t.Parallel()
	b := mwSetup(t, &mwTool{}, ledger.MiddlewareConfig{})
	bad := `{"title": ""}`
	first := b.mustCall(t, "bad", bad)
	second := b.mustCall(t, "bad", bad)
	if first.code != http.StatusBadRequest || second.code != http.StatusBadRequest || !second.env.IdempotentReplay || second.env.OK {
		t.Fatalf("4xx answers: %d %s / %d %s", first.code, first.raw, second.code, second.raw)
	}
	k, _ := ledger.Get(context.Background(), b.db.Pool, "bad")
	if k.Status != ledger.StatusCompleted || k.ResponseCode == nil || *k.ResponseCode != 400 {
		t.Fatalf("4xx row = %+v", k)
	}

	b5 := mwSetup(t, &mwTool{code: http.StatusInternalServerError}, ledger.MiddlewareConfig{})
	if fail := b5.mustCall(t, "five", mwBody); fail.code != http.StatusInternalServerError {
		t.Fatalf("code = %d %s", fail.code, fail.raw)
	}
	k, _ = ledger.Get(context.Background(), b5.db.Pool, "five")
	if k.Status != ledger.StatusProcessing || k.ResponseCode != nil {
		t.Fatalf("5xx row = %+v, want processing without outcome", k)
	}
}

// The key header and the body are checked before anything is claimed.
func TestMiddlewareRequestValidation(t *testing.T) {
	t.Parallel()
	b := mwSetup(t, &mwTool{}, ledger.MiddlewareConfig{})
	cases := []struct {
		name, key, body string
		want            int
		typ             string
	}{
		{"missing key", "", mwBody, http.StatusBadRequest, ledger.ProblemKeyMissing},
		{"key too long", strings.Repeat("k", 129), mwBody, http.StatusBadRequest, ledger.ProblemKeyTooLong},
		{"not json", "k1", `title=x`, http.StatusBadRequest, ledger.ProblemBodyInvalid},
		{"two json values", "k2", `{} {}`, http.StatusBadRequest, ledger.ProblemBodyInvalid},
		{"quoted key, bad escape", `"k\n"`, mwBody, http.StatusBadRequest, ledger.ProblemKeyInvalid},
		{"quoted key, no closing quote", `"k`, mwBody, http.StatusBadRequest, ledger.ProblemKeyInvalid},
	}
	for _, c := range cases {
		wantProblem(t, c.name, b.mustCall(t, c.key, c.body), c.want, c.typ)
	}
	// 128 bytes is fine.
	if got := b.mustCall(t, strings.Repeat("k", 128), mwBody); got.code != http.StatusCreated {
		t.Errorf("128-byte key: %d %s", got.code, got.raw)
	}
	big := bytes.Repeat([]byte("x"), ledger.DefaultMaxRequestBytes+10)
	wantProblem(t, "big body", b.mustCall(t, "big", `{"title":"`+string(big)+`"}`), http.StatusRequestEntityTooLarge, ledger.ProblemBodyTooLarge)
	if n := b.db.Count(t, "idempotency_keys"); n != 1 {
		t.Fatalf("keys = %d, want 1 (only the valid request claims)", n)
	}
	if n := b.tool.total(); n != 1 {
		t.Fatalf("effects = %d, want 1", n)
	}
}

// A long handler that heartbeats keeps its key's heartbeat_at fresh.
func TestMiddlewareHeartbeats(t *testing.T) {
	t.Parallel()
	b := mwSetup(t, &mwTool{hold: make(chan struct{})}, ledger.MiddlewareConfig{HeartbeatInterval: 50 * time.Millisecond})
	done := make(chan struct{})
	go func() {
		defer close(done)
		_, _ = b.call(t, context.Background(), "beat", mwBody)
	}()
	testwait.Eventually(t, func() bool {
		k, err := ledger.Get(context.Background(), b.db.Pool, "beat")
		return err == nil && k.HeartbeatAt != nil
	}, testwait.Timeout, "a heartbeat recorded while the handler runs")
	b.tool.release()
	testwait.Recv(t, done, testwait.Timeout)
}

// The ledger going away: 503, and the handler never runs.
func TestMiddlewareLedgerUnavailable(t *testing.T) {
	t.Parallel()
	b := mwSetup(t, &mwTool{}, ledger.MiddlewareConfig{})
	b.db.Exec(t, `ALTER TABLE idempotency_keys RENAME TO idempotency_keys_gone`)
	wantProblem(t, "ledger gone", b.mustCall(t, "k", mwBody), http.StatusServiceUnavailable, ledger.ProblemLedgerUnavailable)
	if n := b.tool.total(); n != 0 {
		t.Fatalf("effects = %d, want 0", n)
	}
}

// The client gives up long before the handler finishes: the heartbeat goes
// on while the handler runs, so the live attempt never looks dead, and the
// outcome is stored when it ends.
func TestMiddlewareHeartbeatOutlivesClient(t *testing.T) {
	t.Parallel()
	b := mwSetup(t, &mwTool{hold: make(chan struct{})}, ledger.MiddlewareConfig{HeartbeatInterval: 50 * time.Millisecond})
	b.callAbandoned(t, "abandoned", mwBody)
	var beats []time.Time
	testwait.Eventually(t, func() bool {
		k, err := ledger.Get(context.Background(), b.db.Pool, "abandoned")
		if err != nil {
			t.Fatal(err)
		}
		if k.Status != ledger.StatusProcessing {
			t.Fatalf("key %s while its handler still runs", k.Status)
		}
		if k.HeartbeatAt != nil && (len(beats) == 0 || !k.HeartbeatAt.Equal(beats[len(beats)-1])) {
			beats = append(beats, *k.HeartbeatAt)
		}
		return len(beats) >= 3
	}, testwait.Timeout, "three heartbeats after the client left")
	b.tool.release()
	testwait.Eventually(t, func() bool {
		k, err := ledger.Get(context.Background(), b.db.Pool, "abandoned")
		return err == nil && k.Status == ledger.StatusCompleted
	}, testwait.Timeout, "the abandoned attempt to store its outcome")
	if n := b.tool.effectsOf("abandoned"); n != 1 {
		t.Fatalf("effects = %d, want 1", n)
	}
}

// A retry of a key marked failed_retryable (the effect known not to have
// happened) re-claims it, runs the tool, and stores the outcome under the
// new claim: the compare-and-set of Complete holds the re-claim's
// claimed_at, not the row's first one, so the outcome is not lost and the
// key does not stay processing.
func TestMiddlewareCompletesAReclaimedKey(t *testing.T) {
	t.Parallel()
	b := mwSetup(t, &mwTool{}, ledger.MiddlewareConfig{})
	ctx := context.Background()
	hash, err := ledger.Fingerprint([]byte(mwBody))
	if err != nil {
		t.Fatal(err)
	}
	first, err := ledger.Claim(ctx, b.db.Pool, ledger.ClaimParams{Key: "k", Tool: "create_ticket", RequestHash: hash})
	if err != nil {
		t.Fatal(err)
	}
	// The first claim is older than the retry's: created_at stays, claimed_at
	// moves. The times are bound, not computed from the columns: Citus
	// refuses date arithmetic on a column in an UPDATE.
	k0, err := ledger.Get(ctx, b.db.Pool, "k")
	if err != nil {
		t.Fatal(err)
	}
	b.db.Exec(t, `UPDATE idempotency_keys SET created_at = $1, claimed_at = $2 WHERE key = 'k'`,
		k0.CreatedAt.Add(-time.Minute), first.Row.ClaimedAt.Add(-time.Minute))
	if err := ledger.Abandon(ctx, b.db.Pool, "k", first.Row.ClaimedAt.Add(-time.Minute)); err != nil {
		t.Fatal(err)
	}
	got := b.mustCall(t, "k", mwBody)
	if got.code != http.StatusCreated || got.env.IdempotentReplay {
		t.Fatalf("retry of a failed_retryable key: %d %s, want the tool's 201", got.code, got.raw)
	}
	k, err := ledger.Get(ctx, b.db.Pool, "k")
	if err != nil {
		t.Fatal(err)
	}
	if k.Status != ledger.StatusCompleted || k.ResponseCode == nil || *k.ResponseCode != http.StatusCreated {
		t.Fatalf("after the retry: status %s code %v, want completed 201 (the outcome stored under the re-claim)", k.Status, k.ResponseCode)
	}
	if n := b.tool.effectsOf("k"); n != 1 {
		t.Fatalf("effects = %d, want 1", n)
	}
}
