package main

import (
	"encoding/json"
	"strings"
	"testing"

	"github.com/ledgerkeeper/ledgerkeeper/internal/pgtest"
)

// reconcileJSON runs `reconcile --json` and returns its report's actions.
func reconcileJSON(t *testing.T, db *pgtest.DB, cfg string) map[string]int {
	t.Helper()
	code, out, stderr := cli(t, "reconcile", "--json", "--no-alerts", "--config", cfg, "--database-url", db.URL)
	if code != 0 {
		t.Fatalf("reconcile: exit %d\n%s\n%s", code, out, stderr)
	}
	var rep struct {
		Actions map[string]int `json:"actions"`
	}
	if err := json.Unmarshal([]byte(out), &rep); err != nil {
		t.Fatalf("reconcile --json: %v\n%s", err, out)
	}
	return rep.Actions
}

// `reconcile` on a tool with a typo'd path and no completed key: the API's
// JSON 404 reads as absence for every key, the made-up key included, so
// only a witness of presence tells. The keys whose tickets exist are held
// (probe_unwitnessed); a canary marked with `probe canary add` exposes the
// typo (probe_untrusted, still nothing changed); with the path fixed they
// are completed.
func TestReconcileTypoedPathIsHeldUntilACanaryWitnesses(t *testing.T) {
	t.Parallel()
	db := pgtest.New(t)
	rt := newRouter(t)
	stuckTickets(t, db, rt, "wf-1:step-1", "wf-2:step-1")
	typo := routerConfig(t, rt, "/v1/tiket?idempotency_key={key}", "")

	if acts := reconcileJSON(t, db, typo); acts["withheld_unwitnessed"] != 2 {
		t.Fatalf("actions %v, want both keys withheld_unwitnessed", acts)
	}
	for _, k := range []string{"wf-1:step-1", "wf-2:step-1"} {
		if s := status(t, db, k); s != "processing" {
			t.Fatalf("%s is %s under a typo'd path, want processing", k, s)
		}
	}
	if n := db.Count(t, `alert_outbox WHERE reason = 'probe_unwitnessed' AND kind = 'firing'`); n != 1 {
		t.Fatalf("%d probe_unwitnessed alerts, want 1", n)
	}
	if code, out, stderr := cli(t, "probe", "check", "--config", typo, "--database-url", db.URL); code != 1 || !strings.Contains(stderr, "present side unverified") {
		t.Fatalf("probe check of the unwitnessed probe: exit %d, want 1\n%s\n%s", code, out, stderr)
	}

	rt.set(func(rt *router) { rt.tickets["kept-ticket"] = true })
	if code, out, stderr := cli(t, "probe", "canary", "add", "kept-ticket", "--tool", "create_ticket", "--reason", "kept for the self-check",
		"--actor", "alice", "--config", typo, "--database-url", db.URL); code != 0 {
		t.Fatalf("canary add: %d %s %s", code, out, stderr)
	}
	reconcileJSON(t, db, typo)
	if n := db.Count(t, `alert_outbox WHERE reason = 'probe_untrusted' AND kind = 'firing'`); n != 1 {
		t.Fatal("the canary did not expose the typo'd path")
	}
	if n := db.Count(t, `idempotency_keys WHERE status <> 'processing'`); n != 0 {
		t.Fatalf("%d keys changed under the typo'd path", n)
	}

	fixed := routerConfig(t, rt, "/v1/tickets?idempotency_key={key}", "")
	if acts := reconcileJSON(t, db, fixed); acts["completed"] != 2 {
		t.Fatalf("actions %v after the fix, want both keys completed", acts)
	}
}

// `reconcile` while the route breaks in the middle of the batch (an
// ingress's HTML 404 from the third key on): the closing check fails, so no
// verdict of the batch is written, not even the answers before the break.
func TestReconcileRouteBreaksMidBatch(t *testing.T) {
	t.Parallel()
	db := pgtest.New(t)
	rt := newRouter(t)
	completedTicket(t, db, rt, "wf-0:done")
	keys := []string{"k1", "k2", "k3", "k4", "k5"}
	stuckTickets(t, db, rt, keys...)
	rt.set(func(rt *router) {
		for _, k := range keys {
			rt.watched[k] = true
		}
		rt.flipAt, rt.flipTo = 3, "html404"
	})
	cfg := routerConfig(t, rt, "/v1/tickets?idempotency_key={key}", "")
	if acts := reconcileJSON(t, db, cfg); acts["withheld_untrusted"] != len(keys) {
		t.Fatalf("actions %v, want every key withheld_untrusted", acts)
	}
	for _, k := range keys {
		if s := status(t, db, k); s != "processing" {
			t.Fatalf("%s is %s, want processing", k, s)
		}
	}
	if n := db.Count(t, `reconcile_audit`); n != 0 {
		t.Fatalf("%d audit rows: a withheld verdict was written", n)
	}
}

// `reconcile` with a probe that reads a request field, on a tool whose tool
// server completed no key yet: the made-up key is shaped like the due
// key's request, so the check concludes; the key whose ticket exists is
// completed, and no false alert is raised.
func TestReconcileTemplatedRequestFieldWithNoCompletedKey(t *testing.T) {
	t.Parallel()
	db := pgtest.New(t)
	rt := newRouter(t)
	db.Exec(t, `INSERT INTO idempotency_keys (key, tool, request_hash, request_body, created_at, claimed_at, expires_at)
		VALUES ('wf-1:step-1', 'create_ticket', 'h', '{"ref":"R-1"}', now() - interval '1 minute', now() - interval '1 minute', now() + interval '1 day')`)
	rt.set(func(rt *router) { rt.tickets["wf-1:step-1"] = true })
	cfg := routerConfig(t, rt, "/v1/tickets?idempotency_key={key}&ref={request.ref}", "")
	if acts := reconcileJSON(t, db, cfg); acts["completed"] != 1 {
		t.Fatalf("actions %v, want the key completed", acts)
	}
	if n := db.Count(t, `alert_outbox WHERE reason IN ('probe_untrusted', 'probe_unwitnessed')`); n != 0 {
		t.Fatalf("%d false alerts", n)
	}
}
