package main

import (
	"fmt"
	"net/http"
	"net/url"
	"strings"
	"testing"
	"time"

	"golang.org/x/crypto/bcrypt"

	"github.com/ledgerkeeper/ledgerkeeper/internal/pgtest"
)

// runConfig is a configuration whose create_ticket probe asks tk, with the
// console section given.
func runConfig(t *testing.T, tk *tickets, extra string) string {
	t.Helper()
	return writeFile(t, "run.yaml", fmt.Sprintf(`schedule: {reconcile: "@every 1h", purge: "@every 1h", alerts: "@every 1h"}
reconcile: {grace: 1s}
tools:
  create_ticket:
    processing_window: 2s
    probe:
      type: http
      url: "%s/v1/tickets?idempotency_key={key}"
      match: data
      response_code: 201
      response_body: {ticket_id: id}
%s`, tk.srv.URL, extra))
}

// probeAndReconcile presses "probe now" (nothing written) and then
// "reconcile this key now" (the key completed, audited and recorded as
// who) on the console at base, signed in as user.
func probeAndReconcile(t *testing.T, db *pgtest.DB, tk *tickets, base, user, pass, who, key string) {
	t.Helper()
	code, page := httpDo(t, http.MethodGet, base+"/ui/key?key="+key, user, pass, nil)
	if code != http.StatusOK || !strings.Contains(page, `action="/ui/key/probe"`) || !strings.Contains(page, `action="/ui/key/reconcile"`) {
		t.Fatalf("the key's page lacks probe now or reconcile now: %d\n%s", code, page)
	}
	code, page = httpDo(t, http.MethodPost, base+"/ui/key/probe", user, pass, url.Values{"key": {key}})
	if code != http.StatusOK || !strings.Contains(page, `id="probe-verdict">found<`) {
		t.Fatalf("probe now: %d\n%s", code, page)
	}
	keys, _ := tk.keyProbes()
	if keys[key] != 1 {
		t.Errorf("the downstream was asked about %s %d times, want 1", key, keys[key])
	}
	if n := db.Count(t, `reconcile_audit`) + db.Count(t, `ledgerkeeper_runs`) + db.Count(t, `idempotency_keys WHERE status <> 'processing'`); n != 0 {
		t.Errorf("probe now wrote %d rows", n)
	}
	code, page = httpDo(t, http.MethodPost, base+"/ui/key/reconcile", user, pass, url.Values{"key": {key}, "confirm": {"yes"}})
	if code != http.StatusOK || !strings.Contains(page, "decided: completed") {
		t.Fatalf("reconcile now: %d\n%s", code, page)
	}
	if n := db.Count(t, `idempotency_keys WHERE key = $1 AND status = 'completed' AND response_code = 201`, key); n != 1 {
		t.Errorf("%s is not completed", key)
	}
	if n := db.Count(t, `reconcile_audit WHERE key = $1 AND action = 'completed' AND actor = $2`, key, who); n != 1 {
		t.Errorf("completion audit rows by %s: %d", who, n)
	}
	if n := db.Count(t, `ledgerkeeper_runs WHERE kind = 'reconcile' AND actor = $1`, who); n != 1 {
		t.Errorf("reconcile passes recorded by %s: %d", who, n)
	}
}

// `ledgerkeeper console` builds the probes and the reconciler from the
// configuration, as `probe run` and `reconcile` do.
func TestConsoleCommandProbesAndReconcilesAKey(t *testing.T) {
	t.Parallel()
	db := pgtest.New(t)
	tk := newTickets(t)
	tk.mu.Lock()
	tk.have["k-laptop"] = 1
	tk.mu.Unlock()
	stuckKey(t, db, "create_ticket", "k-laptop", time.Hour)
	cfg := runConfig(t, tk, "console: {auth: none, operators: {local: [reconcile]}}\n")
	addr := freeAddr(t)
	runInBackground(t, "console", "--config", cfg, "--database-url", db.URL, "--listen", addr)
	base := "http://" + addr
	waitListening(t, base+"/ui/")
	probeAndReconcile(t, db, tk, base, "", "", "console:local", "k-laptop")
}

// serve gives its console its own engine's probes and builds a reconciler
// per "reconcile this key now".
func TestServeConsoleProbesAndReconcilesAKey(t *testing.T) {
	t.Parallel()
	hash, err := bcrypt.GenerateFromPassword([]byte("alice-pw"), bcrypt.MinCost)
	if err != nil {
		t.Fatal(err)
	}
	db := pgtest.New(t)
	tk := newTickets(t)
	tk.mu.Lock()
	tk.have["k-serve"] = 1
	tk.mu.Unlock()
	stuckKey(t, db, "create_ticket", "k-serve", time.Hour)
	addr := freeAddr(t)
	cfg := runConfig(t, tk, fmt.Sprintf("http: {listen: %q}\nconsole:\n  users: {alice: %q}\n  operators: {alice: []}\n", addr, hash))
	runInBackground(t, "serve", "--run-at-start=false", "--config", cfg, "--database-url", db.URL)
	base := "http://" + addr
	waitListening(t, base+"/healthz")
	probeAndReconcile(t, db, tk, base, "alice", "alice-pw", "console:alice", "k-serve")
}
