package browsertest

import (
	"context"
	"encoding/json"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/chromedp"
	"golang.org/x/crypto/bcrypt"

	"github.com/ledgerkeeper/ledgerkeeper/alerts"
	"github.com/ledgerkeeper/ledgerkeeper/console"
	"github.com/ledgerkeeper/ledgerkeeper/internal/pgtest"
	"github.com/ledgerkeeper/ledgerkeeper/probes"
	"github.com/ledgerkeeper/ledgerkeeper/reconcile"
	"github.com/ledgerkeeper/ledgerkeeper/store"
)

// The self-checks, alerts and runs pages pass axe as every other page does
// (empty here: serveConsole's fixture has a stuck key only; the test below
// checks them full).
func init() {
	axePages = append(axePages, "/ui/checks", "/ui/alerts", "/ui/runs")
}

// runConsole serves the console with probes and a reconciler over a real
// HTTP downstream that has the stuck key's ticket, and with a self-check,
// an open breaker, alerts (one failing delivery, one acted on from Slack,
// one about a Citus worker)
// and passes in the database.
func runConsole(t *testing.T) (*pgtest.DB, string) {
	t.Helper()
	db := pgtest.New(t)
	db.Exec(t, `INSERT INTO idempotency_keys (key, tool, request_hash, request_body, created_at, claimed_at, expires_at)
		VALUES ($1, $2, 'h', '{"title":"printer on fire"}', now() - interval '1 hour', now() - interval '1 hour', now() + interval '1 day')`, key, tool)
	downstream := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		data := []map[string]string{}
		if r.URL.Query().Get("idempotency_key") == key {
			data = append(data, map[string]string{"id": "T-1"})
		}
		w.Header().Set("Content-Type", "application/json")
		_ = json.NewEncoder(w).Encode(map[string]any{"data": data})
	}))
	t.Cleanup(downstream.Close)
	probe, err := probes.NewHTTP(probes.HTTPConfig{URL: downstream.URL + "/v1/tickets?idempotency_key={key}", Match: "data",
		ResponseCode: 201, ResponseBody: map[string]string{"ticket_id": "id"}, Timeout: 5 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = probe.Close() })
	engineFor := func(actor string) *reconcile.Engine {
		return reconcile.New(reconcile.Config{Actor: actor, Tools: map[string]reconcile.Policy{tool: {Probe: probe, ProbeFingerprint: "fp"}}}, db.Pool, nil, nil)
	}
	probing := engineFor("console")

	// What the pages show: a failed sample, an open breaker of another
	// tool, a failing and an acted-on alert, two passes.
	db.Exec(t, `INSERT INTO probe_self_checks (tool, outcome, fingerprint, samples, present_failed, absent_verdict, summary, evidence, actor)
		VALUES ('send_invoice', 'untrusted', 'fp', 1, 1, 'found', 'untrusted: the made-up key came back found', $1, 'replica-1')`,
		`{"samples":[{"key":"done-1","expect":"found","verdict":"not_found","passed":false,"source":"completed","error":"404"}],
		  "absent":{"key":"ledgerkeeper-self-check:x","expect":"not_found","verdict":"found","passed":false,"evidence":{"http_status":200}}}`)
	db.Exec(t, `INSERT INTO tool_breakers (tool, consecutive_failures, opens, open_until, last_error) VALUES ('send_invoice', 5, 1, now() + interval '5 minutes', 'timeout')`)
	db.Exec(t, `INSERT INTO alert_state (reason, subject, tool, key) VALUES ('probe_failing', 'key:'||$1, $2, $1), ('downstream_unreachable', 'tool:send_invoice', 'send_invoice', NULL)`, key, tool)
	db.Exec(t, `INSERT INTO alert_outbox (reason, tool, key, created_at, attempts, last_error, last_error_class, last_attempt_at)
		SELECT reason, tool, key, last_raised_at, 2, 'slack: 503', 'retryable', now() FROM alert_state`)
	db.Exec(t, `INSERT INTO reconcile_audit (key, tool, attempt, verdict, action, actor) VALUES ($1, $2, 0, 'operator', 'slack_refused', 'slack:U0BOB')`, key, tool)
	// An unreachable Citus worker's alert, about no tool and no key.
	tx, err := db.Pool.Begin(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = tx.Rollback(context.Background()) }()
	if _, err := alerts.RaiseNode(context.Background(), tx, alerts.NodeAlert{Node: "127.0.0.1:9702", Shards: []int64{102008}}, time.Hour); err != nil {
		t.Fatal(err)
	}
	if err := tx.Commit(context.Background()); err != nil {
		t.Fatal(err)
	}
	for _, run := range []store.Run{
		{Kind: "reconcile", Actor: "replica-1", StartedAt: time.Now().Add(-time.Minute), Stats: json.RawMessage(`{"actions":{"backoff":2},"keys":2,"withheld":0,"given_back":1}`)},
		{Kind: "purge", Actor: "replica-1", StartedAt: time.Now().Add(-time.Minute), Stats: json.RawMessage(`{"keys_deleted":10,"batches":1}`), Error: "statement timeout"},
	} {
		if err := store.RecordRun(context.Background(), db.Pool, run); err != nil {
			t.Fatal(err)
		}
	}

	users := map[string][]byte{}
	for u, p := range passwords {
		h, err := bcrypt.GenerateFromPassword([]byte(p), bcrypt.MinCost)
		if err != nil {
			t.Fatal(err)
		}
		users[u] = h
	}
	h, err := console.New(console.Config{
		Pool: db.Pool, Auth: console.AuthBasic, Users: users,
		Operators: map[string][]console.Action{"alice": nil},
		Windows:   func(string) (time.Duration, time.Duration) { return time.Minute, time.Minute },
		Logger:    slog.New(slog.DiscardHandler),
		Run: console.RunConfig{
			Probe: console.ProbeWith(probing), Policy: probing.Policy, Tools: []string{tool}, SelfCheckInterval: 10 * time.Minute,
			Reconciler: func(_ context.Context, actor string) (*reconcile.Engine, io.Closer, error) {
				return engineFor(actor), io.NopCloser(nil), nil
			},
		},
	})
	if err != nil {
		t.Fatal(err)
	}
	mux := http.NewServeMux()
	mux.Handle(console.Path, h)
	srv := httptest.NewServer(mux)
	t.Cleanup(srv.Close)
	return db, srv.URL
}

// An operator opens the self-checks, alerts and runs pages with data in
// them, then probes the stuck key and reconciles it from its page: the
// probe writes nothing, the pass completes the key as console:alice. Every
// page, the answers included, passes axe.
func TestOperatorReadsTheRunPagesProbesAndReconcilesAKey(t *testing.T) {
	axe := axeScript(t)
	db, base := runConsole(t)
	alice := browser(t, "alice")
	for _, p := range []struct{ path, shows string }{
		{"/ui/checks", "#tool-send_invoice"},
		{"/ui/alerts", ".delivery.failing"},
		{"/ui/runs", "table.runs tr.failed"},
	} {
		do(t, alice, "open "+p.path, chromedp.Navigate(base+p.path), chromedp.WaitVisible(chromedp.CSS(p.shows)))
		axeOn(t, alice, axe, p.path)
		if p.path != "/ui/alerts" {
			continue
		}
		if acts := get(t, alice, "slack acts", chromedp.Text(chromedp.CSS("table.alerts"))); !strings.Contains(acts, "slack:U0BOB: slack_refused") {
			t.Errorf("the alerts page does not say who acted from Slack:\n%s", acts)
		}
		if firing := get(t, alice, "firing alerts", chromedp.Text(chromedp.CSS("table.alerts"))); !strings.Contains(firing, "Citus worker 127.0.0.1:9702") {
			t.Errorf("the alerts page does not name the unreachable Citus worker:\n%s", firing)
		}
	}
	audit := db.Count(t, `reconcile_audit`)
	do(t, alice, "probe the key now",
		chromedp.Navigate(base+"/ui/key?key="+key),
		follow(`form[action="/ui/key/probe"] button`),
		chromedp.WaitVisible(chromedp.CSS("#probe-verdict")),
	)
	if v := get(t, alice, "verdict", chromedp.Text(chromedp.CSS("#probe-verdict"))); v != "found" {
		t.Errorf("probe now says %q", v)
	}
	axeOn(t, alice, axe, "the key's page after probe now")
	if n := db.Count(t, `reconcile_audit`); n != audit {
		t.Errorf("probe now wrote %d audit rows", n-audit)
	}
	if n := db.Count(t, `idempotency_keys WHERE key = $1 AND status = 'processing'`, key); n != 1 {
		t.Fatalf("probe now changed the key")
	}
	do(t, alice, "reconcile the key now, confirmed",
		follow(`form[action="/ui/key/reconcile"] button`),
		follow("button.danger"),
		chromedp.WaitVisible(chromedp.CSS("#reconcile-report")),
	)
	if rep := get(t, alice, "report", chromedp.Text(chromedp.CSS("#reconcile-report"))); !strings.Contains(rep, "decided: completed") {
		t.Errorf("the report:\n%s", rep)
	}
	axeOn(t, alice, axe, "the key's page after reconcile now")
	if n := db.Count(t, `reconcile_audit WHERE key = $1 AND action = 'completed' AND actor = 'console:alice'`, key); n != 1 {
		t.Errorf("completion audit rows by console:alice: %d", n)
	}
	if n := db.Count(t, `idempotency_keys WHERE key = $1 AND status = 'completed'`, key); n != 1 {
		t.Errorf("the key was not completed")
	}
}
