package main

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/ledgerkeeper/ledgerkeeper/internal/pgtest"
	"github.com/ledgerkeeper/ledgerkeeper/ledger/ledgertest/testwait"
)

// jsonLines are the JSON log records whose msg is msg.
func jsonLines(t *testing.T, logs, msg string) []map[string]any {
	t.Helper()
	var out []map[string]any
	sc := bufio.NewScanner(strings.NewReader(logs))
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		var rec map[string]any
		if json.Unmarshal(sc.Bytes(), &rec) == nil && rec["msg"] == msg {
			out = append(out, rec)
		}
	}
	return out
}

// SIGTERM while a probe is in flight: serve exits 0, the probe that answers
// within the shutdown grace is decided and written, the run is recorded as
// stopped (no error), and the JSON logs carry replica (alert delivery
// included) and durations in seconds.
func TestServeGracefulStopWritesTheProbeInFlight(t *testing.T) {
	t.Parallel()
	db := pgtest.New(t)
	slack := newSlackServer(t)
	gate := make(chan struct{})
	entered := make(chan struct{}, 10)
	tk := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Query().Get("idempotency_key") == "wf-slow" {
			select {
			case entered <- struct{}{}:
			default:
			}
			select {
			case <-gate:
			case <-r.Context().Done():
				return
			}
		}
		_ = json.NewEncoder(w).Encode(map[string]any{"data": []map[string]any{{"id": "T-1", "created_at": "2026-11-30T00:00:00Z"}}})
	}))
	t.Cleanup(tk.Close)
	defer func() {
		select {
		case <-gate:
		default:
			close(gate)
		}
	}()
	cfg := writeFile(t, "serve.yaml", fmt.Sprintf(`schedule:
  reconcile: "@every 1h"
  purge: "@every 1h"
  alerts: "@every 1s"
reconcile:
  grace: 1s
  alert_after_attempts: 1
log:
  format: json
tools:
  create_ticket:
    processing_window: 1s
    probe:
      type: http
      url: "%s/v1/tickets?idempotency_key={key}"
      match: data
      response_code: 201
      self_check:
        enabled: false
alerts:
  slack:
    token: xoxb-test-token
    channel: "#oncall"
    api_url: "%s/api/"
http:
  listen: "127.0.0.1:0"
`, tk.URL, slack.srv.URL))
	stuckKey(t, db, "create_ticket", "wf-slow", time.Minute)
	stuckKey(t, db, "refund_payment", "wf-noprobe", time.Minute)

	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	exited := make(chan int, 1)
	var stderr syncBuffer
	go func() {
		exited <- run(ctx, []string{"serve", "--config", cfg, "--database-url", db.URL}, io.Discard, &stderr)
	}()
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("serve's stderr:\n%s", stderr.String())
		}
	})
	testwait.Recv(t, entered, 30*time.Second)
	testwait.Eventually(t, func() bool {
		return strings.Contains(slack.all(), "refund_payment") && strings.Contains(stderr.String(), `"msg":"alerts delivered"`)
	}, 30*time.Second, "the no_probe alert delivered")
	cancel() // SIGTERM
	testwait.Eventually(t, func() bool { return strings.Contains(stderr.String(), "jobs asked to stop") },
		10*time.Second, "serve to ask its jobs to stop")
	close(gate) // the downstream answers within the grace
	if code := testwait.Recv(t, exited, 40*time.Second); code != 0 {
		t.Fatalf("serve exited %d", code)
	}
	if s := status(t, db, "wf-slow"); s != "completed" {
		t.Fatalf("the probe in flight at SIGTERM was not written: wf-slow is %s", s)
	}
	var errText *string
	var stopped bool
	if err := db.Pool.QueryRow(context.Background(), `SELECT error, coalesce((stats->>'stopped')::bool, false)
		FROM ledgerkeeper_runs WHERE kind = 'reconcile' ORDER BY id DESC LIMIT 1`).Scan(&errText, &stopped); err != nil {
		t.Fatal(err)
	}
	if errText != nil || !stopped {
		t.Fatalf("reconcile run recorded with error %v, stopped %v; want no error, stopped", errText, stopped)
	}
	logs := stderr.String()
	for _, msg := range []string{"alerts delivered", "reconcile pass"} {
		recs := jsonLines(t, logs, msg)
		if len(recs) == 0 {
			t.Fatalf("no %q log line", msg)
		}
		if recs[0]["replica"] == nil || recs[0]["replica"] == "" {
			t.Errorf("%q log line without replica: %v", msg, recs[0])
		}
	}
	pass := jsonLines(t, logs, "reconcile pass")[0]
	if d, ok := pass["duration"].(float64); !ok || d <= 0 || d > 60 {
		t.Errorf("reconcile pass duration = %v; want seconds", pass["duration"])
	}
	if pass["stopped"] != true {
		t.Errorf("reconcile pass line does not say stopped: %v", pass)
	}
	// runbook.md, "Logs": a service's lines carry component.
	if pass["component"] != "reconcile" {
		t.Errorf("reconcile pass line without component=reconcile: %v", pass)
	}
	if s, ok := jsonLines(t, logs, "jobs asked to stop: a reconcile pass leases no more keys, its probes in flight may finish within the grace")[0]["shutdown_timeout"].(float64); !ok || s != 30 {
		t.Errorf("shutdown_timeout logged as %v; want 30 (seconds)", s)
	}
}
