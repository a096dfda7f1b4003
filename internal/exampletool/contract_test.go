package exampletool_test

// The contract tests of the example tool server: one ticket per key end to
// end, under concurrency and after expiry; its crash hook (the demo's) and
// its own 400 and sink-failure 500 against the caching rule. The tests of
// ledger.Middleware itself (arguments, in flight, request validation,
// heartbeats, ledger unavailable) are in ledger/middleware_test.go.

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/ledgerkeeper/ledgerkeeper/internal/exampletool"
	"github.com/ledgerkeeper/ledgerkeeper/internal/pgtest"
	"github.com/ledgerkeeper/ledgerkeeper/ledger"
	"github.com/ledgerkeeper/ledgerkeeper/ledger/ledgertest/testwait"
)

func TestMain(m *testing.M) { pgtest.Main(m) }

type bundle struct {
	db  *pgtest.DB
	srv *httptest.Server
}

func setup(t *testing.T, cfg exampletool.Config) *bundle {
	t.Helper()
	db := pgtest.New(t)
	cfg.Ledger, cfg.Sink = db.Pool, db.Pool
	s := exampletool.New(cfg)
	if err := s.Migrate(context.Background()); err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(s.Handler())
	t.Cleanup(srv.Close)
	return &bundle{db: db, srv: srv}
}

type answer struct {
	code     int
	replayed string
	retry    string
	ctype    string
	env      ledger.Envelope
	problem  ledger.Problem
	raw      string
}

// isProblem says whether a is the middleware's RFC 9457 problem of type typ
// with status code, sent as application/problem+json.
func (a answer) isProblem(code int, typ string) bool {
	return a.code == code && a.ctype == ledger.ContentTypeProblem && a.problem.Type == typ && a.problem.Status == code
}

// call sends one create_ticket request on a fresh connection.
func (b *bundle) call(t *testing.T, ctx context.Context, key, body string) (answer, error) {
	t.Helper()
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, b.srv.URL+"/tools/create_ticket", strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	if key != "" {
		req.Header.Set("Idempotency-Key", key)
	}
	client := &http.Client{Transport: &http.Transport{DisableKeepAlives: true}}
	resp, err := client.Do(req)
	if err != nil {
		return answer{}, err
	}
	defer resp.Body.Close()
	raw, _ := io.ReadAll(resp.Body)
	a := answer{code: resp.StatusCode, replayed: resp.Header.Get("Idempotency-Replayed"), retry: resp.Header.Get("Retry-After"), ctype: resp.Header.Get("Content-Type"), raw: string(raw)}
	if a.ctype == ledger.ContentTypeProblem {
		_ = json.Unmarshal(raw, &a.problem)
	} else {
		_ = json.Unmarshal(raw, &a.env)
	}
	return a, nil
}

func (b *bundle) mustCall(t *testing.T, key, body string) answer {
	t.Helper()
	a, err := b.call(t, context.Background(), key, body)
	if err != nil {
		t.Fatalf("call: %v", err)
	}
	return a
}

func (b *bundle) tickets(t *testing.T) int { return b.db.Count(t, "tickets") }

const body = `{"title": "SSO broken", "account_id": "A-1029"}`

// (a) same key twice: one ticket, identical original_response, replay marked.
func TestSameKeyTwiceOneEffect(t *testing.T) {
	t.Parallel()
	b := setup(t, exampletool.Config{})
	key := "wf-8812:step-3:create_ticket"
	first := b.mustCall(t, key, body)
	// Same arguments, other key order and whitespace: same fingerprint.
	second := b.mustCall(t, key, `{"account_id":"A-1029","title":"SSO broken"}`)
	if first.code != http.StatusCreated || second.code != http.StatusCreated {
		t.Fatalf("codes %d %d: %s / %s", first.code, second.code, first.raw, second.raw)
	}
	if n := b.tickets(t); n != 1 {
		t.Fatalf("tickets = %d, want exactly 1", n)
	}
	if first.env.IdempotentReplay || !second.env.IdempotentReplay || second.replayed != "true" || first.replayed != "" {
		t.Fatalf("replay flags: first %+v %q, second %+v %q", first.env, first.replayed, second.env, second.replayed)
	}
	var o1, o2 map[string]any
	_ = json.Unmarshal(first.env.OriginalResponse, &o1)
	_ = json.Unmarshal(second.env.OriginalResponse, &o2)
	if o1["ticket_id"] == nil || fmt.Sprint(o1) != fmt.Sprint(o2) {
		t.Fatalf("original responses differ: %v vs %v", o1, o2)
	}
	if !first.env.OK || !second.env.OK {
		t.Fatalf("ok flags: %+v %+v", first.env, second.env)
	}
}

// (c) 50 concurrent requests with one key, released through a gate: one
// ticket; every other answer a 409 or a replay.
func TestConcurrentSameKeyOneEffect(t *testing.T) {
	t.Parallel()
	// A little processing time widens the collision window for real.
	b := setup(t, exampletool.Config{Delay: 50 * time.Millisecond})
	const n = 50
	gate := make(chan struct{})
	answers := make(chan answer, n)
	var wg sync.WaitGroup
	for range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			<-gate
			a, err := b.call(t, context.Background(), "wf-1:step-1", body)
			if err != nil {
				t.Error(err)
				return
			}
			answers <- a
		}()
	}
	close(gate)
	testwait.Wait(t, &wg, testwait.Timeout)
	close(answers)
	created, conflicts, replays := 0, 0, 0
	for a := range answers {
		switch {
		case a.code == http.StatusCreated && !a.env.IdempotentReplay:
			created++
		case a.code == http.StatusCreated && a.env.IdempotentReplay:
			replays++
		case a.isProblem(http.StatusConflict, ledger.ProblemKeyInFlight) && a.retry != "":
			conflicts++
		default:
			t.Errorf("unexpected answer %d %s", a.code, a.raw)
		}
	}
	if created != 1 || created+conflicts+replays != n {
		t.Fatalf("created %d, conflicts %d, replays %d", created, conflicts, replays)
	}
	if got := b.tickets(t); got != 1 {
		t.Fatalf("tickets = %d, want 1", got)
	}
}

// (d) the key row deleted (expired and purged): a resend is a new execution.
func TestAfterExpiryNewExecution(t *testing.T) {
	t.Parallel()
	b := setup(t, exampletool.Config{})
	first := b.mustCall(t, "k", body)
	b.db.Exec(t, `DELETE FROM idempotency_keys WHERE key = 'k'`)
	second := b.mustCall(t, "k", body)
	if second.code != http.StatusCreated || second.env.IdempotentReplay {
		t.Fatalf("second = %d %s", second.code, second.raw)
	}
	if string(first.env.OriginalResponse) == string(second.env.OriginalResponse) {
		t.Fatalf("expected a new ticket, got the same response")
	}
	// This is why keys must outlive the slowest retry chain.
	if n := b.tickets(t); n != 2 {
		t.Fatalf("tickets = %d, want 2 (documented expiry behaviour)", n)
	}
}

// (f) the handler crashes after the effect and before Complete: the key
// stays processing with no stored response (the reconciler's input), and
// retries get 409, not a second ticket.
func TestCrashAfterEffectLeavesProcessing(t *testing.T) {
	t.Parallel()
	b := setup(t, exampletool.Config{AfterEffect: func(key string) {
		if key == "crash" {
			panic(http.ErrAbortHandler) // net/http aborts the connection quietly
		}
	}})
	if _, err := b.call(t, context.Background(), "crash", body); err == nil {
		t.Fatal("the crashed request should fail at the client")
	}
	k, err := ledger.Get(context.Background(), b.db.Pool, "crash")
	if err != nil {
		t.Fatal(err)
	}
	if k.Status != ledger.StatusProcessing || k.ResponseCode != nil || k.ResponseBody != nil {
		t.Fatalf("row = %+v, want processing without outcome", k)
	}
	if string(k.RequestBody) == "" || k.Tool != exampletool.Tool {
		t.Fatalf("request body not stored for probes: %+v", k)
	}
	retry := b.mustCall(t, "crash", body)
	if !retry.isProblem(http.StatusConflict, ledger.ProblemKeyInFlight) || retry.retry == "" {
		t.Fatalf("retry = %d %s", retry.code, retry.raw)
	}
	if n := b.tickets(t); n != 1 {
		t.Fatalf("tickets = %d, want 1", n)
	}
}

// A validation failure (4xx) is a definitive outcome: stored and replayed.
// A 5xx is not: the key stays processing.
func TestCachingRule(t *testing.T) {
	t.Parallel()
	b := setup(t, exampletool.Config{})
	bad := `{"title": ""}`
	first := b.mustCall(t, "bad", bad)
	second := b.mustCall(t, "bad", bad)
	if first.code != http.StatusBadRequest || second.code != http.StatusBadRequest || !second.env.IdempotentReplay || second.env.OK {
		t.Fatalf("4xx answers: %d %s / %d %s", first.code, first.raw, second.code, second.raw)
	}
	k, _ := ledger.Get(context.Background(), b.db.Pool, "bad")
	if k.Status != ledger.StatusCompleted || *k.ResponseCode != 400 {
		t.Fatalf("4xx row = %+v", k)
	}

	// The sink goes away: 500, not cached.
	b.db.Exec(t, `ALTER TABLE tickets RENAME TO tickets_gone`)
	fail := b.mustCall(t, "five", body)
	if fail.code != http.StatusInternalServerError {
		t.Fatalf("code = %d", fail.code)
	}
	k, _ = ledger.Get(context.Background(), b.db.Pool, "five")
	if k.Status != ledger.StatusProcessing || k.ResponseCode != nil {
		t.Fatalf("5xx row = %+v, want processing without outcome", k)
	}
}

// The draft's two refusals, counted at the sink: no key → a 400 problem and
// no ticket; the key reused with other arguments → a 422 problem and still
// exactly one ticket.
func TestRefusalsAreProblems(t *testing.T) {
	t.Parallel()
	b := setup(t, exampletool.Config{})
	if a := b.mustCall(t, "", body); !a.isProblem(http.StatusBadRequest, ledger.ProblemKeyMissing) {
		t.Fatalf("missing key = %d %q %s, want a 400 %s problem", a.code, a.ctype, a.raw, ledger.ProblemKeyMissing)
	}
	if n := b.tickets(t); n != 0 {
		t.Fatalf("tickets = %d after a request without a key, want 0", n)
	}
	b.mustCall(t, "k", body)
	other := b.mustCall(t, "k", `{"title": "Something else", "account_id": "A-1"}`)
	if !other.isProblem(http.StatusUnprocessableEntity, ledger.ProblemKeyReused) {
		t.Fatalf("other arguments = %d %q %s, want a 422 %s problem", other.code, other.ctype, other.raw, ledger.ProblemKeyReused)
	}
	if n := b.tickets(t); n != 1 {
		t.Fatalf("tickets = %d, want exactly 1", n)
	}
}
