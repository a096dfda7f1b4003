package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/ledgerkeeper/ledgerkeeper/internal/pgtest"
	"github.com/ledgerkeeper/ledgerkeeper/internal/secret"
)

// Secrets of the end-to-end test: each comes from ${VAR}, and each is
// echoed back by a downstream or quoted by a library somewhere.
const (
	queryToken   = "qtok-5f3a9c1e/x+y" // a probe URL's query (percent-encoded there)
	headerToken  = "htok-77aa88bb99"   // a header: Authorization: Bearer ...
	ledgerPass   = "lpass-1234abcd"    // database.url, a key=value DSN
	paymentsPass = "ppass-9876zyxw"    // a sql probe's database_url
	hookSecret   = "HOOKSECRET0a1b2c3d"
	flagPass     = "fpass-5555eeee" // --database-url
)

var allSecrets = []string{queryToken, url.QueryEscape(queryToken), "qtok-5f3a9c1e", headerToken, ledgerPass, paymentsPass, hookSecret, flagPass}

// noSecret fails the test if text shows any secret.
func noSecret(t *testing.T, where, text string) {
	t.Helper()
	for _, s := range allSecrets {
		if strings.Contains(text, s) {
			t.Errorf("%s shows the secret %q:\n%s", where, s, text)
		}
	}
}

// echoServer is a downstream that refuses every probe and echoes what it
// was sent: the request URI (with the token) and the Authorization header.
func echoServer(t *testing.T) *httptest.Server {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.WriteHeader(http.StatusInternalServerError)
		_ = json.NewEncoder(w).Encode(map[string]string{
			"error": "rejected " + r.URL.RequestURI(), "auth": r.Header.Get("Authorization"), "raw_token": r.URL.Query().Get("api_key"),
		})
	}))
	t.Cleanup(srv.Close)
	return srv
}

// webhookSink is an incoming webhook that records every body.
type webhookSink struct {
	srv    *httptest.Server
	mu     sync.Mutex
	bodies []string
}

func newWebhookSink(t *testing.T) *webhookSink {
	s := &webhookSink{}
	s.srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		s.mu.Lock()
		s.bodies = append(s.bodies, string(b)) // the path is the webhook's own secret
		s.mu.Unlock()
		_, _ = io.WriteString(w, "ok")
	}))
	t.Cleanup(s.srv.Close)
	return s
}

func (s *webhookSink) all() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return strings.Join(s.bodies, "\n")
}

// ledgerDSN is the test database as a key=value DSN carrying ledgerPass
// (the embedded server trusts local connections and ignores it).
func ledgerDSN(t *testing.T, raw string) string {
	t.Helper()
	u, err := url.Parse(raw)
	if err != nil {
		t.Fatal(err)
	}
	pass := ledgerPass
	if p, ok := u.User.Password(); ok {
		allSecrets = append(allSecrets, p) // a server that wants its own
		pass = p
	}
	return fmt.Sprintf("host=%s port=%s user=%s dbname=%s sslmode=disable password='%s'",
		u.Hostname(), u.Port(), u.User.Username(), strings.TrimPrefix(u.Path, "/"), pass)
}

// Secrets in a probe URL's query, a header, a DSN password (the ledger's
// and a sql probe's) and a Slack webhook URL appear nowhere a user or Slack
// can read: config check (text and --json), reconcile's output and logs,
// the audit trail through inspect, status, errors, Slack messages.
func TestSecretsAppearNowhere(t *testing.T) {
	db := pgtest.New(t)
	down := echoServer(t)
	slack := newWebhookSink(t)
	t.Setenv("LK_TEST_LEDGER_DSN", ledgerDSN(t, db.URL))
	t.Setenv("LK_TEST_QUERY_TOKEN", queryToken)
	t.Setenv("LK_TEST_HEADER_TOKEN", headerToken)
	t.Setenv("LK_TEST_PAYMENTS_URL", "postgres://pay:"+paymentsPass+"@127.0.0.1:1/payments?connect_timeout=2")
	t.Setenv("LK_TEST_SLACK_HOOK", slack.srv.URL+"/services/T0/B0/"+hookSecret)
	cfg := writeFile(t, "ledgerkeeper.yaml", fmt.Sprintf(`database:
  url: ${LK_TEST_LEDGER_DSN}
reconcile:
  grace: 1s
  alert_after_attempts: 1
tools:
  create_ticket:
    processing_window: 2s
    probe:
      type: http
      url: "%s/v1/tickets?idempotency_key={key}&api_key=${LK_TEST_QUERY_TOKEN}"
      headers: {Authorization: "Bearer ${LK_TEST_HEADER_TOKEN}"}
      match: data
      response_code: 201
      self_check: {enabled: false}
  charge_card:
    processing_window: 2s
    probe:
      type: sql
      database_url: ${LK_TEST_PAYMENTS_URL}
      query: "SELECT id FROM charges WHERE idempotency_key = $$1"
      args: [key]
      timeout: 3s
alerts:
  slack:
    webhook_url: ${LK_TEST_SLACK_HOOK}
`, down.URL))
	stuckKey(t, db, "create_ticket", "wf-1:ticket", time.Minute)
	stuckKey(t, db, "charge_card", "wf-1:charge", time.Minute)

	// config check, text: the probe URL is shown, its token masked.
	code, out, stderr := cli(t, "config", "check", "--config", cfg)
	if code != 0 {
		t.Fatalf("config check: %d\n%s\n%s", code, out, stderr)
	}
	noSecret(t, "config check", out+stderr)
	if !strings.Contains(out, "api_key="+secret.Mask) || !strings.Contains(out, "webhook_url: '"+secret.Mask+"'") {
		t.Errorf("config check does not show the masked settings:\n%s", out)
	}
	// config check --json: one valid document, the same masks.
	code, out, stderr = cli(t, "config", "check", "--json", "--config", cfg)
	var doc struct {
		Tools map[string]struct{ Probe struct{ URL string } }
	}
	if code != 0 || json.Unmarshal([]byte(out), &doc) != nil {
		t.Fatalf("config check --json: %d\n%s\n%s", code, out, stderr)
	}
	noSecret(t, "config check --json", out+stderr)
	if u := doc.Tools["create_ticket"].Probe.URL; !strings.HasSuffix(u, "&api_key="+secret.Mask) {
		t.Errorf("effective probe URL %q", u)
	}

	// One pass: both probes fail, quoting their secrets; the audit trail,
	// the report, the logs and Slack must not.
	code, out, stderr = cli(t, "reconcile", "--json", "--log-level", "debug", "--config", cfg)
	if code != 0 || !json.Valid([]byte(out)) {
		t.Fatalf("reconcile --json: %d\n%s\n%s", code, out, stderr)
	}
	noSecret(t, "reconcile --json", out)
	noSecret(t, "reconcile logs", stderr)
	if !strings.Contains(stderr, "level=DEBUG") && !strings.Contains(stderr, "level=INFO") {
		t.Errorf("no logs captured: %q", stderr)
	}
	msgs := slack.all()
	if !strings.Contains(msgs, "Last probe error") {
		t.Fatalf("Slack got no probe error: %s", msgs)
	}
	noSecret(t, "Slack", msgs)
	if !strings.Contains(msgs, secret.Mask) {
		t.Errorf("Slack messages carry no mask: the test no longer sees the secrets travel:\n%s", msgs)
	}

	for _, key := range []string{"wf-1:ticket", "wf-1:charge"} {
		code, out, stderr = cli(t, "inspect", key, "--json", "--config", cfg)
		if code != 0 || !json.Valid([]byte(out)) {
			t.Fatalf("inspect --json %s: %d\n%s\n%s", key, code, out, stderr)
		}
		noSecret(t, "inspect --json "+key, out+stderr)
		code, out, stderr = cli(t, "inspect", key, "--config", cfg)
		if code != 0 {
			t.Fatalf("inspect %s: %d\n%s", key, code, stderr)
		}
		noSecret(t, "inspect "+key, out+stderr)
	}
	// The ticket's audit row is there, with the request and the error.
	var evidence string
	if err := db.Pool.QueryRow(context.Background(), `SELECT coalesce(string_agg(coalesce(evidence::text, '') || ' ' || coalesce(error, ''), ' '), '') FROM reconcile_audit`).Scan(&evidence); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(evidence, "api_key="+secret.Mask) {
		t.Errorf("audit trail lacks the masked request: %s", evidence)
	}
	noSecret(t, "reconcile_audit", evidence)
	for _, args := range [][]string{{"status", "--json"}, {"status"}} {
		code, out, stderr = cli(t, append(args, "--config", cfg)...)
		if code != 0 {
			t.Fatalf("%v: %d\n%s", args, code, stderr)
		}
		noSecret(t, strings.Join(args, " "), out+stderr)
	}

	// Errors: one that quotes an operator's argument (here, by mistake, a
	// secret), and a database URL given by flag, unreachable or unparsable.
	code, _, stderr = cli(t, "inspect", headerToken, "--config", cfg)
	if code != 1 || !strings.Contains(stderr, secret.Mask) {
		t.Fatalf("inspect of an unknown key: %d %s", code, stderr)
	}
	noSecret(t, "error", stderr)
	// Errors: a database URL given by flag, unreachable or unparsable.
	code, _, stderr = cli(t, "status", "--database-url", "postgres://u:"+flagPass+"@127.0.0.1:1/x?connect_timeout=2")
	if code != 1 || !strings.Contains(stderr, "127.0.0.1:1") {
		t.Fatalf("unreachable database: %d %s", code, stderr)
	}
	noSecret(t, "error", stderr)
	code, _, stderr = cli(t, "status", "--database-url", "host=127.0.0.1 port=notaport password="+flagPass)
	if code != 2 || !strings.Contains(stderr, "host=127.0.0.1") {
		t.Fatalf("bad DSN: %d %s", code, stderr)
	}
	noSecret(t, "error", stderr)
}

// Every command's logger redacts: whatever a package logs (an error that
// quotes a request, a URL attribute), the configuration's secrets go.
func TestCommandLoggerRedacts(t *testing.T) {
	t.Setenv("LK_TEST_QUERY_TOKEN", queryToken)
	cfg := writeFile(t, "ledgerkeeper.yaml", `tools:
  t:
    probe:
      type: http
      url: "http://downstream.example/v1?api_key=${LK_TEST_QUERY_TOKEN}&k={key}"
`)
	var logs strings.Builder
	a := &app{stderr: &logs, configPath: cfg}
	if err := a.load(); err != nil {
		t.Fatal(err)
	}
	a.logger.Warn("probe failed: GET /v1?api_key="+url.QueryEscape(queryToken),
		"err", fmt.Errorf("dial: %s", queryToken), "url", a.cfg.Tools["t"].Probe.URL)
	noSecret(t, "logs", logs.String())
	if strings.Count(logs.String(), secret.Mask) != 3 {
		t.Errorf("logs: %s", logs.String())
	}
}
