package exampletool_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
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
	"github.com/ledgerkeeper/ledgerkeeper/internal/testwait"
	"github.com/ledgerkeeper/ledgerkeeper/ledger"
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
	env      ledger.Envelope
	raw      string
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
	a := answer{code: resp.StatusCode, replayed: resp.Header.Get("Idempotency-Replayed"), retry: resp.Header.Get("Retry-After"), raw: string(raw)}
	_ = json.Unmarshal(raw, &a.env)
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

// (b) same key, different body: 422, still one ticket.
func TestSameKeyOtherBody(t *testing.T) {
	t.Parallel()
	b := setup(t, exampletool.Config{})
	b.mustCall(t, "k", body)
	got := b.mustCall(t, "k", `{"title": "something else", "account_id": "A-1029"}`)
	if got.code != http.StatusUnprocessableEntity {
		t.Fatalf("code = %d %s", got.code, got.raw)
	}
	if n := b.tickets(t); n != 1 {
		t.Fatalf("tickets = %d", n)
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
		case a.code == http.StatusConflict && a.retry != "":
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

// (e) the client's deadline (100 ms) is shorter than the processing time
// (400 ms): the retry lands mid-flight and gets 409, never a second ticket;
// once the first attempt finishes, the retry gets its replay.
func TestClientDeadlineShorterThanProcessing(t *testing.T) {
	t.Parallel()
	b := setup(t, exampletool.Config{Delay: 400 * time.Millisecond})
	ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
	_, err := b.call(t, ctx, "slow", body)
	cancel()
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("first call should time out at the client, got %v", err)
	}
	retry := b.mustCall(t, "slow", body)
	if retry.code != http.StatusConflict || retry.retry == "" {
		t.Fatalf("retry = %d %q %s, want 409 with Retry-After", retry.code, retry.retry, retry.raw)
	}
	var last answer
	testwait.Eventually(t, func() bool {
		last = b.mustCall(t, "slow", body)
		return last.code != http.StatusConflict
	}, testwait.Timeout, "the first attempt to store its outcome (retries answered 409 until then)")
	if last.code != http.StatusCreated || !last.env.IdempotentReplay {
		t.Fatalf("final retry = %d %s", last.code, last.raw)
	}
	if n := b.tickets(t); n != 1 {
		t.Fatalf("tickets = %d, want 1", n)
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
	if retry.code != http.StatusConflict {
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

func TestRequestValidation(t *testing.T) {
	t.Parallel()
	b := setup(t, exampletool.Config{})
	cases := []struct {
		name, key, body string
		want            int
	}{
		{"missing key", "", body, http.StatusBadRequest},
		{"key too long", strings.Repeat("k", 129), body, http.StatusBadRequest},
		{"not json", "k1", `title=x`, http.StatusBadRequest},
		{"two json values", "k2", `{} {}`, http.StatusBadRequest},
	}
	for _, c := range cases {
		if got := b.mustCall(t, c.key, c.body); got.code != c.want {
			t.Errorf("%s: code = %d, want %d (%s)", c.name, got.code, c.want, got.raw)
		}
	}
	// 128 bytes is fine.
	if got := b.mustCall(t, strings.Repeat("k", 128), body); got.code != http.StatusCreated {
		t.Errorf("128-byte key: %d %s", got.code, got.raw)
	}
	big := bytes.Repeat([]byte("x"), ledger.DefaultMaxRequestBytes+10)
	if got := b.mustCall(t, "big", `{"title":"`+string(big)+`"}`); got.code != http.StatusRequestEntityTooLarge {
		t.Errorf("big body: %d", got.code)
	}
	if n := b.db.Count(t, "idempotency_keys"); n != 1 {
		t.Fatalf("keys = %d, want 1 (only the valid request claims)", n)
	}
}

// A long handler that heartbeats keeps its key's heartbeat_at fresh.
func TestMiddlewareHeartbeats(t *testing.T) {
	t.Parallel()
	b := setup(t, exampletool.Config{Delay: 300 * time.Millisecond, HeartbeatInterval: 50 * time.Millisecond})
	done := make(chan struct{})
	go func() {
		defer close(done)
		b.mustCall(t, "beat", body)
	}()
	testwait.Eventually(t, func() bool {
		k, err := ledger.Get(context.Background(), b.db.Pool, "beat")
		return err == nil && k.HeartbeatAt != nil
	}, testwait.Timeout, "a heartbeat recorded while the handler runs")
	testwait.Recv(t, done, testwait.Timeout)
}

// The ledger going away mid-request: 503, and no ticket is created.
func TestLedgerUnavailable(t *testing.T) {
	t.Parallel()
	b := setup(t, exampletool.Config{})
	b.db.Exec(t, `ALTER TABLE idempotency_keys RENAME TO idempotency_keys_gone`)
	got := b.mustCall(t, "k", body)
	if got.code != http.StatusServiceUnavailable {
		t.Fatalf("code = %d %s", got.code, got.raw)
	}
	if n := b.tickets(t); n != 0 {
		t.Fatalf("tickets = %d", n)
	}
}

// The client gives up long before the handler finishes: the heartbeat goes
// on while the handler runs, so the live attempt never looks dead.
func TestHeartbeatOutlivesClient(t *testing.T) {
	t.Parallel()
	b := setup(t, exampletool.Config{Delay: 900 * time.Millisecond, HeartbeatInterval: 50 * time.Millisecond})
	ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
	_, err := b.call(t, ctx, "abandoned", body)
	cancel()
	if err == nil {
		t.Fatal("the client should have timed out")
	}
	first := time.Now()
	var beats []time.Time
	testwait.Eventually(t, func() bool {
		k, err := ledger.Get(context.Background(), b.db.Pool, "abandoned")
		if err == nil && k.Status == ledger.StatusCompleted {
			return true
		}
		if err == nil && k.HeartbeatAt != nil && (len(beats) == 0 || !k.HeartbeatAt.Equal(beats[len(beats)-1])) {
			beats = append(beats, *k.HeartbeatAt)
		}
		return false
	}, testwait.Timeout, "the abandoned attempt to complete, heartbeating meanwhile")
	if len(beats) < 3 || time.Since(first) < 300*time.Millisecond {
		t.Fatalf("heartbeats after the client left: %d distinct values", len(beats))
	}
	if n := b.tickets(t); n != 1 {
		t.Fatalf("tickets = %d", n)
	}
}
