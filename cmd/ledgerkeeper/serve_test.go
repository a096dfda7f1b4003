package main

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/ledgerkeeper/ledgerkeeper/internal/pgtest"
	"github.com/ledgerkeeper/ledgerkeeper/ledger/ledgertest/testwait"
)

// slackServer speaks chat.postMessage and records the texts it got.
type slackServer struct {
	srv   *httptest.Server
	mu    sync.Mutex
	texts []string
}

func newSlackServer(t *testing.T) *slackServer {
	s := &slackServer{}
	s.srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path != "/api/chat.postMessage" {
			http.NotFound(w, r)
			return
		}
		raw, _ := io.ReadAll(r.Body)
		r.Body = io.NopCloser(bytes.NewReader(raw))
		_ = r.ParseForm()
		s.mu.Lock()
		s.texts = append(s.texts, r.PostForm.Get("text")+" "+r.PostForm.Get("blocks"))
		s.mu.Unlock()
		w.Header().Set("Content-Type", "application/json")
		_, _ = w.Write([]byte(`{"ok":true,"channel":"C1","ts":"1.2"}`))
	}))
	t.Cleanup(s.srv.Close)
	return s
}

// messages returns each message posted so far (its text and blocks).
func (s *slackServer) messages() []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return slices.Clone(s.texts)
}

func (s *slackServer) all() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return strings.Join(s.texts, "\n")
}

func freeAddr(t *testing.T) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().String()
}

// serve, end to end: the scheduled jobs resolve a stuck key, alert on a
// key without a probe through Slack, export metrics, and stop cleanly.
func TestServe(t *testing.T) {
	t.Parallel()
	db := pgtest.New(t)
	tk := newTickets(t)
	slack := newSlackServer(t)
	addr := freeAddr(t)
	cfg := writeFile(t, "serve.yaml", fmt.Sprintf(`schedule:
  reconcile: "@every 1s"
  purge: "@every 1h"
  alerts: "@every 1s"
reconcile:
  grace: 1s
  alert_after_attempts: 1
tools:
  create_ticket:
    processing_window: 1s
    probe:
      type: http
      url: "%s/v1/tickets?idempotency_key={key}"
      match: data
      response_code: 201
alerts:
  slack:
    token: xoxb-test-token
    channel: "#oncall"
    api_url: "%s/api/"
http:
  listen: "%s"
`, tk.srv.URL, slack.srv.URL, addr))
	stuckKey(t, db, "create_ticket", "wf-1:found", time.Minute)
	stuckKey(t, db, "refund_payment", "wf-2:<!channel>", time.Minute)
	tk.mu.Lock()
	tk.have["wf-1:found"] = 1
	tk.mu.Unlock()

	ctx, cancel := context.WithCancel(context.Background())
	exited := make(chan int, 1)
	var stderr syncBuffer // serve keeps logging while the test reads
	go func() {
		exited <- run(ctx, []string{"serve", "--config", cfg, "--database-url", db.URL}, io.Discard, &stderr)
	}()
	// However the test ends, serve is stopped (SIGTERM) before the
	// database goes, and a failure shows what serve said.
	stopped, code := false, 0
	stop := func() int {
		if !stopped {
			stopped = true
			cancel()
			code = testwait.Recv(t, exited, 40*time.Second)
		}
		return code
	}
	t.Cleanup(func() {
		stop()
		if t.Failed() {
			t.Logf("slack got %q; serve's stderr:\n%s", slack.all(), stderr.String())
		}
	})
	testwait.Eventually(t, func() bool {
		return status(t, db, "wf-1:found") == "completed" && strings.Contains(slack.all(), "refund_payment")
	}, 30*time.Second, "serve to complete wf-1:found and alert about refund_payment")
	if strings.Contains(slack.all(), "<!channel>") {
		t.Fatalf("an unescaped key reached Slack: %s", slack.all())
	}
	if strings.Contains(stderr.String(), "xoxb-test-token") {
		t.Fatal("the Slack token was logged")
	}
	for path, want := range map[string]string{
		"/healthz": "ok",
		"/readyz":  "ready",
		"/metrics": `ledgerkeeper_reconcile_decisions_total{action="completed",tool="create_ticket"} 1`,
	} {
		resp, err := http.Get("http://" + addr + path)
		if err != nil {
			t.Fatal(err)
		}
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK || !strings.Contains(string(body), want) {
			t.Fatalf("%s: %d, want %q in:\n%.2000s", path, resp.StatusCode, want, body)
		}
	}
	if code := stop(); code != 0 {
		t.Fatalf("serve exited %d:\n%s", code, stderr.String())
	}
}
