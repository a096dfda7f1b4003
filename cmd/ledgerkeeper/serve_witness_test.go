package main

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

	"github.com/ledgerkeeper/ledgerkeeper/internal/pgtest"
	"github.com/ledgerkeeper/ledgerkeeper/ledger/ledgertest/testwait"
)

// router is a tickets API behind a router whose routes an operator breaks
// while ledgerkeeper runs: GET /v1/tickets?idempotency_key=K lists K's
// tickets; any other path is the API's own JSON 404. With route "html404"
// every path goes to the ingress's default backend (404 text/html); with
// "down" every request gets 503.
type router struct {
	srv *httptest.Server

	mu      sync.Mutex
	tickets map[string]bool
	route   string
	// flipTo replaces route at the flipAt-th request about a watched key.
	flipTo  string
	flipAt  int
	watched map[string]bool
	seen    int
	asked   map[string]int
	total   int
}

func newRouter(t *testing.T) *router {
	rt := &router{tickets: map[string]bool{}, watched: map[string]bool{}, asked: map[string]int{}}
	rt.srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		key := r.URL.Query().Get("idempotency_key")
		rt.mu.Lock()
		rt.total++
		rt.asked[key]++
		if rt.watched[key] {
			if rt.seen++; rt.flipAt > 0 && rt.seen == rt.flipAt {
				rt.route = rt.flipTo
			}
		}
		route, exists := rt.route, rt.tickets[key]
		rt.mu.Unlock()
		switch {
		case route == "down":
			w.WriteHeader(http.StatusServiceUnavailable)
			return
		case route == "html404":
			w.Header().Set("Content-Type", "text/html")
			w.WriteHeader(http.StatusNotFound)
			_, _ = io.WriteString(w, "<html><body><h1>404 Not Found</h1><hr>nginx</body></html>")
			return
		case r.URL.Path != "/v1/tickets":
			w.Header().Set("Content-Type", "application/json")
			w.WriteHeader(http.StatusNotFound)
			_, _ = io.WriteString(w, `{"error":{"code":"route_not_found"}}`)
			return
		}
		data := []map[string]any{}
		if exists {
			data = append(data, map[string]any{"id": "T-" + key})
		}
		w.Header().Set("Content-Type", "application/json")
		_ = json.NewEncoder(w).Encode(map[string]any{"data": data})
	}))
	t.Cleanup(rt.srv.Close)
	return rt
}

func (rt *router) set(f func(rt *router)) {
	rt.mu.Lock()
	defer rt.mu.Unlock()
	f(rt)
}

func (rt *router) requests() int {
	rt.mu.Lock()
	defer rt.mu.Unlock()
	return rt.total
}

// stuckTickets inserts processing keys past their window whose tickets
// exist downstream: a retry of any of them, marked retryable, would create
// a second ticket.
func stuckTickets(t *testing.T, db *pgtest.DB, rt *router, keys ...string) {
	t.Helper()
	for _, k := range keys {
		stuckKey(t, db, "create_ticket", k, time.Minute)
		rt.set(func(rt *router) { rt.tickets[k] = true })
	}
}

// completedTicket inserts a key its tool server completed, whose ticket
// exists: the self-check's present-side witness.
func completedTicket(t *testing.T, db *pgtest.DB, rt *router, key string) {
	t.Helper()
	db.Exec(t, `INSERT INTO idempotency_keys (key, tool, request_hash, status, response_code, response_body, expires_at)
		VALUES ($1, 'create_ticket', 'h', 'completed', 201, '{}', now() + interval '1 day')`, key)
	rt.set(func(rt *router) { rt.tickets[key] = true })
}

func routerConfig(t *testing.T, rt *router, path, extra string) string {
	t.Helper()
	return writeFile(t, "ledgerkeeper.yaml", fmt.Sprintf(`reconcile:
  grace: 1s
  alert_after_attempts: 1
  breaker:
    failures: 5
    cooldown: 1h
    max_cooldown: 2h
%s
tools:
  create_ticket:
    processing_window: 1s
    probe:
      type: http
      url: "%s%s"
      match: data
      response_code: 201
`, extra, rt.srv.URL, path))
}

// serveWith runs `serve` on cfg until the test ends (SIGTERM, then the
// database goes), reporting what it logged if the test failed.
func serveWith(t *testing.T, db *pgtest.DB, cfg string, slack *slackServer) *syncBuffer {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	exited := make(chan int, 1)
	stderr := &syncBuffer{}
	go func() {
		exited <- run(ctx, []string{"serve", "--config", cfg, "--database-url", db.URL}, io.Discard, stderr)
	}()
	t.Cleanup(func() {
		cancel()
		if code := testwait.Recv(t, exited, 40*time.Second); code != 0 {
			t.Errorf("serve exited %d", code)
		}
		if t.Failed() {
			t.Logf("slack got %q; serve's stderr:\n%s", slack.all(), stderr.String())
		}
	})
	return stderr
}

func serveSchedule(t *testing.T, slack *slackServer) (string, string) {
	addr := freeAddr(t)
	return fmt.Sprintf(`schedule:
  reconcile: "@every 1s"
  purge: "@every 1h"
  alerts: "@every 1s"
alerts:
  slack:
    token: xoxb-test-token
    channel: "#oncall"
    api_url: "%s/api/"
http:
  listen: "%s"`, slack.srv.URL, addr), addr
}

// reconcileRuns counts the reconcile passes recorded so far.
func reconcileRuns(t *testing.T, db *pgtest.DB) int {
	return db.Count(t, `ledgerkeeper_runs WHERE kind = 'reconcile'`)
}

// While serve runs, the ingress in front of the tickets API starts
// answering every path with its HTML 404: the three keys stuck since, whose
// tickets exist, stay processing through several passes, on-call gets one
// probe_untrusted message, and once the route is fixed serve completes
// them.
func TestServeIngress404KeepsKeysWhoseEffectExists(t *testing.T) {
	t.Parallel()
	db := pgtest.New(t)
	rt := newRouter(t)
	slack := newSlackServer(t)
	completedTicket(t, db, rt, "wf-0:done")
	stuckTickets(t, db, rt, "wf-1:step-1")
	sched, _ := serveSchedule(t, slack)
	cfg := routerConfig(t, rt, "/v1/tickets?idempotency_key={key}", sched)
	serveWith(t, db, cfg, slack)
	testwait.Eventually(t, func() bool { return status(t, db, "wf-1:step-1") == "completed" }, 30*time.Second,
		"serve to complete the key whose ticket exists while the route is good")

	rt.set(func(rt *router) { rt.route = "html404" })
	keys := []string{"wf-2:step-1", "wf-3:step-1", "wf-4:step-1"}
	stuckTickets(t, db, rt, keys...)
	runs := reconcileRuns(t, db)
	testwait.Eventually(t, func() bool {
		return strings.Contains(slack.all(), "probe_untrusted") && reconcileRuns(t, db) >= runs+3
	}, 30*time.Second, "a probe_untrusted message and three passes with the broken route")
	for _, k := range keys {
		if s := status(t, db, k); s != "processing" {
			t.Fatalf("%s is %s while the ingress answered 404 for everything, want processing", k, s)
		}
		if n := db.Count(t, `reconcile_audit WHERE key = $1`, k); n != 0 {
			t.Fatalf("%s has %d audit rows: a verdict was written from the broken route", k, n)
		}
	}
	if n := strings.Count(slack.all(), "[FIRING] Probe untrusted"); n != 1 {
		t.Fatalf("%d probe_untrusted messages, want 1", n)
	}

	rt.set(func(rt *router) { rt.route = "" })
	testwait.Eventually(t, func() bool {
		for _, k := range keys {
			if status(t, db, k) != "completed" {
				return false
			}
		}
		return true
	}, 30*time.Second, "serve to complete the keys once the route is fixed")
}

// While serve runs, the tickets API stops answering (503 to everything):
// with breaker.failures 5 the downstream sees at most 5 requests before the
// breaker opens (no stuck key is probed: each pass's self-check goes
// unanswered first), and the opening is logged, counted and posted once.
func TestServeDeadDownstreamOpensTheBreakerOnce(t *testing.T) {
	t.Parallel()
	db := pgtest.New(t)
	rt := newRouter(t)
	slack := newSlackServer(t)
	completedTicket(t, db, rt, "wf-0:done")
	rt.set(func(rt *router) { rt.route = "down" })
	stuckTickets(t, db, rt, "s1", "s2", "s3")
	sched, addr := serveSchedule(t, slack)
	stderr := serveWith(t, db, routerConfig(t, rt, "/v1/tickets?idempotency_key={key}", sched), slack)
	testwait.Eventually(t, func() bool {
		return db.Count(t, `tool_breakers WHERE opens = 1`) == 1 && strings.Contains(slack.all(), "downstream_unreachable")
	}, 40*time.Second, "the breaker to open and its alert to be posted")
	runs := reconcileRuns(t, db)
	testwait.Eventually(t, func() bool { return reconcileRuns(t, db) >= runs+2 }, 30*time.Second, "two more passes")
	if n := rt.requests(); n > 5 {
		t.Fatalf("the downstream got %d requests, want at most 5 before the breaker opened and none while open", n)
	}
	rt.set(func(rt *router) {
		if n := rt.asked["s1"] + rt.asked["s2"] + rt.asked["s3"]; n != 0 {
			t.Errorf("stuck keys were probed %d times while the self-check went unanswered", n)
		}
	})
	if n := strings.Count(stderr.String(), "circuit breaker opened"); n != 1 {
		t.Fatalf("%d 'circuit breaker opened' log lines for one opening", n)
	}
	if n := strings.Count(slack.all(), "[FIRING] Downstream unreachable"); n != 1 {
		t.Fatalf("%d downstream_unreachable messages for one opening", n)
	}
	resp, err := http.Get("http://" + addr + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if want := `ledgerkeeper_reconcile_breaker_opens_total{tool="create_ticket"} 1`; !strings.Contains(string(body), want) {
		t.Fatalf("/metrics lacks %q", want)
	}
}
