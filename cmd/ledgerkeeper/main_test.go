package main

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/ledgerkeeper/ledgerkeeper/internal/pgtest"
	"github.com/ledgerkeeper/ledgerkeeper/ledger"
	"github.com/ledgerkeeper/ledgerkeeper/ledger/ledgertest/testwait"
	"github.com/ledgerkeeper/ledgerkeeper/reconcile"
)

// cli runs the command line in-process and returns exit code, stdout, stderr.
func cli(t *testing.T, args ...string) (int, string, string) {
	t.Helper()
	// Synchronised: a goroutine a command started (a server shutting down,
	// a probe past its deadline) may still write after run returns.
	var out, errb syncBuffer
	code := run(context.Background(), args, &out, &errb)
	return code, out.String(), errb.String()
}

func writeFile(t *testing.T, name, content string) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), name)
	if err := os.WriteFile(p, []byte(content), 0o600); err != nil {
		t.Fatal(err)
	}
	return p
}

// tickets is a downstream API: GET /v1/tickets?idempotency_key=K.
type tickets struct {
	srv   *httptest.Server
	mu    sync.Mutex
	have  map[string]int
	hits  int
	asked map[string]int // idempotency_key -> requests
}

func newTickets(t *testing.T) *tickets {
	tk := &tickets{have: map[string]int{}, asked: map[string]int{}}
	tk.srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		tk.mu.Lock()
		defer tk.mu.Unlock()
		tk.hits++
		key := r.URL.Query().Get("idempotency_key")
		tk.asked[key]++
		data := []map[string]any{}
		for i := range tk.have[key] {
			data = append(data, map[string]any{"id": fmt.Sprintf("T-%s-%d", key, i), "created_at": "2026-11-30T00:00:00Z"})
		}
		_ = json.NewEncoder(w).Encode(map[string]any{"data": data})
	}))
	t.Cleanup(tk.srv.Close)
	return tk
}

// keyProbes counts the requests about keys of the ledger, leaving out the
// probe self-check's made-up keys (reconcile.SelfCheckKeyPrefix), and
// returns the self-check's requests apart.
func (tk *tickets) keyProbes() (keys map[string]int, selfCheck int) {
	tk.mu.Lock()
	defer tk.mu.Unlock()
	keys = map[string]int{}
	for k, n := range tk.asked {
		if strings.HasPrefix(k, reconcile.SelfCheckKeyPrefix) {
			selfCheck += n
		} else {
			keys[k] += n
		}
	}
	return keys, selfCheck
}

func configFor(t *testing.T, tk *tickets) string {
	t.Helper()
	return writeFile(t, "ledgerkeeper.yaml", fmt.Sprintf(`reconcile:
  grace: 1s
  alert_after_attempts: 1
tools:
  create_ticket:
    processing_window: 2s
    probe:
      type: http
      url: "%s/v1/tickets?idempotency_key={key}"
      match: data
      response_code: 201
      response_body: {ticket_id: id}
`, tk.srv.URL))
}

func stuckKey(t *testing.T, db *pgtest.DB, tool, key string, ago time.Duration) {
	t.Helper()
	db.Exec(t, `INSERT INTO idempotency_keys (key, tool, request_hash, created_at, claimed_at, expires_at)
		VALUES ($1, $2, 'h', now() - $3::interval, now() - $3::interval, now() + interval '1 day')`, key, tool, ago)
}

// witnessKey inserts a key its tool server completed, whose ticket exists
// downstream: the present-side sample that lets the probe's not_found
// verdicts be believed.
func witnessKey(t *testing.T, db *pgtest.DB, tk *tickets, tool, key string) {
	t.Helper()
	db.Exec(t, `INSERT INTO idempotency_keys (key, tool, request_hash, status, response_code, response_body, expires_at)
		VALUES ($1, $2, 'h', 'completed', 201, '{}', now() + interval '1 day')`, key, tool)
	tk.mu.Lock()
	defer tk.mu.Unlock()
	tk.have[key] = 1
}

func status(t *testing.T, db *pgtest.DB, key string) string {
	t.Helper()
	k, err := ledger.Get(context.Background(), db.Pool, key)
	if err != nil {
		t.Fatal(err)
	}
	return k.Status
}

func TestConfigCheck(t *testing.T) {
	t.Parallel()
	bad := writeFile(t, "bad.yaml", "reconcile:\n  grace: 10s\n  batchsize: 3\n")
	code, _, stderr := cli(t, "config", "check", "--config", bad)
	if code != 2 || !strings.Contains(stderr, bad+":3: reconcile.batchsize: unknown key") {
		t.Fatalf("code %d, stderr %q", code, stderr)
	}
	good := writeFile(t, "good.yaml", "alerts:\n  slack:\n    webhook_url: https://hooks.slack.com/services/T0/B0/SECRETPART\n")
	code, out, _ := cli(t, "config", "check", "--config", good)
	if code != 0 || strings.Contains(out, "SECRETPART") || !strings.Contains(out, "webhook_url: '[redacted]'") {
		t.Fatalf("code %d, out %s", code, out)
	}
	// A probe the engine would refuse is refused at check time, with its
	// place. (A second statement is refused by PostgreSQL when the query is
	// prepared: see TestConfigCheckConnect.)
	del := writeFile(t, "delete.yaml", "tools:\n  t:\n    probe:\n      type: sql\n      database_url: postgres://u:pw@h/db\n      query: \"DELETE FROM x\"\n")
	code, _, stderr = cli(t, "config", "check", "--config", del)
	if code != 2 || !strings.Contains(stderr, del+":6: tools.t.probe.query: query starts with \"DELETE\"") || strings.Contains(stderr, "pw@") {
		t.Fatalf("DELETE probe: %d %q", code, stderr)
	}
	// The effective settings, as they are in force: a probe's defaults
	// (never "self_check: {}"), integers in full.
	probe := writeFile(t, "probe.yaml", "tools:\n  t:\n    probe:\n      type: http\n      url: \"http://tickets.internal/v1/tickets?key={key}\"\n")
	code, out, stderr = cli(t, "config", "check", "--config", probe)
	for _, want := range []string{"max_body_bytes: 1048576\n", "method: GET\n", "timeout: 5s\n", "self_check:\n                enabled: true\n                require_witness: true\n"} {
		if code != 0 || !strings.Contains(out, want) {
			t.Errorf("config check of a probe lacks %q: %d\n%s\n%s", want, code, out, stderr)
		}
	}
	// Flags after positional arguments work too.
	code, _, _ = cli(t, "config", "check", "--config", good, "--json")
	if code != 0 {
		t.Fatalf("--json: %d", code)
	}
}

func TestUsageAndOperationalExitCodes(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		args []string
		want int
		msg  string
	}{
		{[]string{"frobnicate"}, 2, "unknown command"},
		{[]string{"reconcile", "--bogus"}, 2, "unknown flag"},
		{[]string{"reconcile", "--limt", "3"}, 2, "unknown flag: --limt (did you mean --limit?)\nRun 'ledgerkeeper reconcile --help' for usage."},
		{[]string{"purge", "--dry-rn"}, 2, "(did you mean --dry-run?)\nRun 'ledgerkeeper purge --help' for usage."},
		{[]string{"probe", "canary", "add", "--tol", "t"}, 2, "(did you mean --tool?)\nRun 'ledgerkeeper probe canary add --help' for usage."},
		{[]string{"resolve", "k", "--retryable"}, 2, "Run 'ledgerkeeper resolve --help' for usage."},
		{[]string{"inspect"}, 2, "accepts 1 arg"},
		{[]string{"migrate", "sideways", "--database-url", "postgres://x@127.0.0.1:1/x"}, 2, `unknown command "sideways" for "ledgerkeeper migrate"`},
		{[]string{"migrate", "stauts"}, 2, `unknown command "stauts" for "ledgerkeeper migrate" (did you mean status?)`},
		// A CI "validate config" step must not pass on a typo (issue 10 item 3).
		{[]string{"config", "chek"}, 2, `unknown command "chek" for "ledgerkeeper config" (did you mean check?)`},
		{[]string{"config"}, 2, "ledgerkeeper config needs a sub-command: check"},
		{[]string{"probe", "chek"}, 2, `unknown command "chek" for "ledgerkeeper probe" (did you mean check?)`},
		{[]string{"probe"}, 2, "needs a sub-command"},
		{[]string{"stauts"}, 2, `unknown command "stauts" for "ledgerkeeper" (did you mean status?)`},
		{[]string{"help", "config", "chek"}, 2, `unknown command "chek" for "ledgerkeeper config" (did you mean check?)`},
		{[]string{"completion", "zhs"}, 2, `unknown command "zhs" for "ledgerkeeper completion" (did you mean zsh?)`},
		{[]string{"status"}, 2, "no database"},
		{[]string{"status", "--database-url", "postgres://u:hunter2@127.0.0.1:1/x"}, 1, "cannot reach database at 127.0.0.1:1/x"},
		{[]string{"resolve", "k", "--retryable"}, 2, "--reason is required"},
		{[]string{"resolve", "k", "--completed", "--code", "201", "--body", "{nope", "--reason", "r"}, 2, "--body must be valid JSON"},
		{[]string{"resolve", "k", "--completed", "--retryable", "--reason", "r"}, 2, "exactly one of"},
		{[]string{"resolve", "k", "--completed", "--code", "500", "--body", "{}", "--reason", "r"}, 2, "replay a server error"},
		// README: a 5xx --code without --force is a usage error (2), checked
		// before anything connects; a missing flag is named as missing.
		{[]string{"resolve", "k", "--completed", "--code", "201", "--reason", "r"}, 2, "resolve --completed: --body is required"},
		{[]string{"resolve", "k", "--completed", "--body", "{}", "--reason", "r"}, 2, "resolve --completed: --code is required"},
	} {
		code, _, stderr := cli(t, c.args...)
		if code != c.want || !strings.Contains(stderr, c.msg) {
			t.Errorf("%v: code %d, stderr %q; want %d and %q", c.args, code, stderr, c.want, c.msg)
		}
		if strings.Contains(stderr, "hunter2") {
			t.Errorf("%v: password in stderr: %q", c.args, stderr)
		}
	}
}

func TestMigrateTwice(t *testing.T) {
	t.Parallel()
	db := pgtest.NewEmpty(t)
	code, out, stderr := cli(t, "migrate", "--database-url", db.URL)
	if code != 0 || !strings.Contains(out, "applied 00001_ledger.sql") {
		t.Fatalf("first migrate: %d %s %s", code, out, stderr)
	}
	code, out, _ = cli(t, "migrate", "up", "--database-url", db.URL)
	if code != 0 || !strings.Contains(out, "nothing to apply") {
		t.Fatalf("second migrate: %d %s", code, out)
	}
	code, out, _ = cli(t, "migrate", "status", "--database-url", db.URL)
	if code != 0 || strings.Contains(out, "pending") {
		t.Fatalf("status: %d %s", code, out)
	}
}

func TestMigrateConcurrently(t *testing.T) {
	t.Parallel()
	db := pgtest.NewEmpty(t)
	var wg sync.WaitGroup
	codes := make([]int, 4)
	for i := range codes {
		wg.Add(1)
		go func() {
			defer wg.Done()
			codes[i], _, _ = cli(t, "migrate", "--database-url", db.URL)
		}()
	}
	testwait.Wait(t, &wg, time.Minute)
	for i, c := range codes {
		if c != 0 {
			t.Fatalf("migrate %d exited %d", i, c)
		}
	}
	if n := db.Count(t, "idempotency_keys"); n != 0 {
		t.Fatal("schema missing")
	}
}

func TestReconcileCommand(t *testing.T) {
	t.Parallel()
	db := pgtest.New(t)
	tk := newTickets(t)
	cfg := configFor(t, tk)
	stuckKey(t, db, "create_ticket", "wf-1:found", time.Minute)
	stuckKey(t, db, "create_ticket", "wf-2:absent", time.Minute)
	stuckKey(t, db, "create_ticket", "wf-3:young", 0)
	tk.have["wf-1:found"] = 1
	witnessKey(t, db, tk, "create_ticket", "wf-0:done")

	// Dry run: probes, reports, changes nothing.
	code, out, stderr := cli(t, "reconcile", "--dry-run", "--config", cfg, "--database-url", db.URL)
	if code != 0 || !strings.Contains(out, "would_complete") || !strings.Contains(out, "would_mark_retryable") {
		t.Fatalf("dry run: %d\n%s\n%s", code, out, stderr)
	}
	if status(t, db, "wf-1:found") != "processing" || db.Count(t, "reconcile_audit") != 0 {
		t.Fatal("dry run wrote")
	}

	code, out, stderr = cli(t, "reconcile", "--json", "--no-alerts", "--config", cfg, "--database-url", db.URL)
	if code != 0 {
		t.Fatalf("reconcile: %d %s %s", code, out, stderr)
	}
	var rep struct {
		Keys []struct{ Key, Action string }
	}
	if err := json.Unmarshal([]byte(out), &rep); err != nil {
		t.Fatalf("--json output is not one JSON document: %v\n%s", err, out)
	}
	if len(rep.Keys) != 2 {
		t.Fatalf("keys = %+v", rep.Keys)
	}
	if status(t, db, "wf-1:found") != "completed" || status(t, db, "wf-2:absent") != "failed_retryable" || status(t, db, "wf-3:young") != "processing" {
		t.Fatal("wrong statuses after reconcile")
	}

	// A --tool that is neither configured nor in the ledger is a typo:
	// refused (exit 2) with the nearest names, before anything is probed.
	code, _, stderr = cli(t, "reconcile", "--tool", "create_tiket", "--config", cfg, "--database-url", db.URL, "--no-alerts")
	if code != 2 || !strings.Contains(stderr, `--tool "create_tiket": no such tool: not in the configuration and no key of it in the ledger (did you mean create_ticket?)`) {
		t.Fatalf("--tool typo: %d %s", code, stderr)
	}
	// A tool with keys but no configuration is reconciled (its keys are
	// alerted, never guessed), with a warning.
	stuckKey(t, db, "unconfigured_tool", "wf-9:x", time.Minute)
	code, _, stderr = cli(t, "reconcile", "--tool", "unconfigured_tool", "--config", cfg, "--database-url", db.URL, "--no-alerts")
	if code != 0 || !strings.Contains(stderr, "tool is not in the configuration") {
		t.Fatalf("--tool of keys without configuration: %d %s", code, stderr)
	}

	// --key never overrides the processing window.
	code, out, _ = cli(t, "reconcile", "--key", "wf-3:young", "--config", cfg, "--database-url", db.URL, "--no-alerts")
	if code != 0 || status(t, db, "wf-3:young") != "processing" || !strings.Contains(out, "no due keys") {
		t.Fatalf("--key on an in-flight key: %d %s", code, out)
	}
}

func TestOperatorCommands(t *testing.T) {
	t.Parallel()
	db := pgtest.New(t)
	tk := newTickets(t)
	cfg := configFor(t, tk)
	url := db.URL
	stuckKey(t, db, "create_ticket", "k-held", time.Minute)
	stuckKey(t, db, "create_ticket", "k-young", 0)
	stuckKey(t, db, "create_ticket", "k-due", time.Minute)

	code, out, stderr := cli(t, "hold", "k-held", "--reason", "checking with payments", "--actor", "alice", "--config", cfg, "--database-url", url)
	if code != 0 {
		t.Fatalf("hold: %d %s %s", code, out, stderr)
	}
	code, out, _ = cli(t, "status", "--config", cfg, "--database-url", url)
	if code != 0 || !strings.Contains(out, "k-held") || !strings.Contains(out, "checking with payments") {
		t.Fatalf("status does not list the hold: %s", out)
	}
	if code, out, stderr = cli(t, "reconcile", "--no-alerts", "--config", cfg, "--database-url", url); code != 0 {
		t.Fatalf("reconcile: %d %s %s", code, out, stderr)
	}
	// The pass probed the key it was free to probe (k-due) and asked
	// nothing about the held one, due as well; the young one is in flight.
	// The probe self-check's requests (a made-up key, completed samples)
	// are the pass vetting its probe, not probes of ledger keys.
	probed, selfCheck := tk.keyProbes()
	if probed["k-held"] != 0 || probed["k-due"] == 0 || len(probed) != 1 || status(t, db, "k-held") != "processing" {
		t.Fatalf("held key probed or changed: requests by key %v, k-held %s", probed, status(t, db, "k-held"))
	}
	if selfCheck == 0 {
		t.Fatal("the pass probed k-due without its probe's self-check")
	}
	stuckKey(t, db, "create_ticket", "k-resolve", time.Minute)
	code, _, stderr = cli(t, "resolve", "k-held", "--retryable", "--reason", "x", "--config", cfg, "--database-url", url)
	if code != 1 || !strings.Contains(stderr, "on hold") {
		t.Fatalf("resolve of a held key: %d %s", code, stderr)
	}
	if code, _, _ = cli(t, "release", "k-held", "--actor", "bob", "--config", cfg, "--database-url", url); code != 0 {
		t.Fatalf("release: %d", code)
	}
	if code, _, stderr = cli(t, "release", "k-held", "--config", cfg, "--database-url", url); code != 1 || !strings.Contains(stderr, "not on hold") {
		t.Fatalf("second release: %d %s", code, stderr)
	}

	// resolve: in flight refused, then success, then refused as not processing.
	code, _, stderr = cli(t, "resolve", "k-young", "--retryable", "--reason", "x", "--config", cfg, "--database-url", url)
	if code != 1 || !strings.Contains(stderr, "in flight") || status(t, db, "k-young") != "processing" {
		t.Fatalf("resolve in flight: %d %s", code, stderr)
	}
	code, out, stderr = cli(t, "resolve", "k-resolve", "--completed", "--code", "201", "--body", `{"ticket_id":"T-77"}`,
		"--reason", "found it in the tickets UI", "--actor", "carol", "--config", cfg, "--database-url", url)
	if code != 0 || status(t, db, "k-resolve") != "completed" || strings.Contains(stderr, "note:") {
		t.Fatalf("resolve: %d %s %s", code, out, stderr)
	}
	// A body that is not a JSON object: stored, with a note on what an MCP
	// tool's retry receives.
	stuckKey(t, db, "create_ticket", "k-string", time.Minute)
	code, _, stderr = cli(t, "resolve", "k-string", "--completed", "--code", "200", "--body", `"ticket T-1 created"`,
		"--reason", "found it", "--config", cfg, "--database-url", url)
	if code != 0 || status(t, db, "k-string") != "completed" || !strings.Contains(stderr, "not a JSON object") {
		t.Fatalf("resolve with a string body: %d %s", code, stderr)
	}
	res, err := ledger.Claim(context.Background(), db.Pool, ledger.ClaimParams{Key: "k-resolve", Tool: "create_ticket", RequestHash: "h"})
	if err != nil || res.Outcome != ledger.Replay || !strings.Contains(string(res.Row.ResponseBody), "T-77") {
		t.Fatalf("replay after manual resolve: %v %+v", err, res)
	}
	code, _, stderr = cli(t, "resolve", "k-resolve", "--retryable", "--reason", "x", "--config", cfg, "--database-url", url)
	if code != 1 || !strings.Contains(stderr, "is final") {
		t.Fatalf("resolve of a completed key: %d %s", code, stderr)
	}

	// Without the serve configuration the tool's window is unknown: refused.
	stuckKey(t, db, "create_ticket", "k-noconf", time.Hour)
	code, _, stderr = cli(t, "resolve", "k-noconf", "--retryable", "--reason", "x", "--database-url", url)
	if code != 1 || !strings.Contains(stderr, "no configuration loaded") || status(t, db, "k-noconf") != "processing" {
		t.Fatalf("resolve without config: %d %s", code, stderr)
	}
	// A key marked failed_retryable whose effect turns up after all.
	code, _, stderr = cli(t, "resolve", "k-noconf", "--retryable", "--reason", "x", "--config", cfg, "--database-url", url)
	if code != 0 {
		t.Fatalf("resolve --retryable: %d %s", code, stderr)
	}
	code, _, stderr = cli(t, "resolve", "k-noconf", "--completed", "--code", "201", "--body", `{"ticket_id":"T-9"}`, "--reason", "found it", "--config", cfg, "--database-url", url)
	if code != 0 || status(t, db, "k-noconf") != "completed" {
		t.Fatalf("resolve --completed of a failed_retryable key: %d %s", code, stderr)
	}

	// inspect shows the history with actors and reasons.
	code, out, _ = cli(t, "inspect", "k-resolve", "--config", cfg, "--database-url", url)
	if code != 0 || !strings.Contains(out, "operator_completed") || !strings.Contains(out, "carol") || !strings.Contains(out, "found it in the tickets UI") {
		t.Fatalf("inspect: %d\n%s", code, out)
	}
	code, out, _ = cli(t, "inspect", "--json", "k-held", "--config", cfg, "--database-url", url)
	var in struct {
		History []struct{ Action, Actor string }
	}
	if code != 0 || json.Unmarshal([]byte(out), &in) != nil || len(in.History) != 2 || in.History[0].Actor != "operator:alice" || in.History[1].Action != "release" {
		t.Fatalf("inspect --json: %d %s", code, out)
	}
	if code, _, stderr = cli(t, "inspect", "nope", "--database-url", url); code != 1 || !strings.Contains(stderr, "no key") {
		t.Fatalf("inspect missing: %d %s", code, stderr)
	}

	// status --json is one document.
	code, out, _ = cli(t, "status", "--json", "--config", cfg, "--database-url", url)
	var st map[string]any
	if code != 0 || json.Unmarshal([]byte(out), &st) != nil || st["tools"] == nil {
		t.Fatalf("status --json: %d %s", code, out)
	}
}

func TestSchemaRequired(t *testing.T) {
	t.Parallel()
	db := pgtest.NewEmpty(t)
	for _, args := range [][]string{{"reconcile"}, {"status"}, {"purge"}, {"inspect", "k"}, {"hold", "k", "--reason", "r"}} {
		code, _, stderr := cli(t, append(args, "--database-url", db.URL)...)
		if code != 1 || !strings.Contains(stderr, "ledgerkeeper migrate") {
			t.Errorf("%v on an unmigrated database: %d %s", args, code, stderr)
		}
	}
}

// The newcomer's first command keeps working: the whole loop, end to end,
// in a scratch database it drops afterwards.
func TestDemo(t *testing.T) {
	t.Parallel()
	db := pgtest.NewEmpty(t)
	// The most common admin URL: user postgres, database postgres (the
	// scratch database's name must replace the database, not the user).
	code, out, stderr := cli(t, "demo", "--database-url", pgtest.WithDatabase(db.URL, "postgres"))
	if code != 0 {
		t.Fatalf("demo exited %d\n%s\n%s", code, out, stderr)
	}
	for _, want := range []string{
		"1 completed, 1 marked retryable, 1 duplicate alerted, 1 no probe",
		`"idempotent_replay":true`,
		// The middleware's refusals are RFC 9457 problems with stable types.
		`wf-1 other body   -> 422 {"type":"https://ledgerkeeper.dev/problems/idempotency-key-reused"`,
		`wf-2 retry        -> 409 {"type":"https://ledgerkeeper.dev/problems/idempotency-key-in-flight"`,
		"2 message(s) posted",
		// Counted at the sink per workflow: one ticket per call, the
		// planted duplicate apart.
		"tickets in the sink: 5 (wf-1 1, wf-2 1, wf-3 1, wf-5 2)",
		// inspect shows what inspect shows: the row, its state, its trail.
		"-- 6. ledgerkeeper inspect wf-4:step-2:refund_payment --\nkey            wf-4:step-2:refund_payment",
		"History (1):",
		// The MCP step: one effect for two calls with one key.
		`first call wf-6:step-1:add_note -> "note 1 added" replay=false`,
		`retry      wf-6:step-1:add_note -> "note 1 added" replay=true`,
		"add_note ran 1 time(s) for one key",
		"probe self-check of create_ticket, before any of its keys changed (by hand: 'ledgerkeeper probe check'): trusted: the made-up key came back not_found; 1 of 1 completed keys came back found with their stored values",
		// The Slack step: buttons on the alert, a refusal, the operator's
		// confirmation and its effect on the row, the message and the audit.
		// Hold, not Release: the key is not held.
		"[Inspect] [Hold] [Mark retryable] [Store outcome]",
		// Once marked retryable from Slack, the one-key alert reads resolved.
		"the alert message, updated in place:\n  | ✅ Resolved: No probe configured (1 key)",
		"U0STRANGER (not in alerts.slack.operators) clicks Mark retryable -> 200; Slack shows them:\n  | You are not allowed to mark retryable from Slack",
		"U0DEMO (demo-oncall) clicks Mark retryable -> 200; ledgerkeeper asks for confirmation:\n  | [Mark retryable]",
		"  | demo-oncall marked `wf-4:step-2:refund_payment` retryable at ",
		"wf-4:step-2:refund_payment is now failed_retryable",
		"slack:U0STRANGER    operator   slack_refused",
		`slack:U0DEMO        operator   operator_marked_retryable {"forced": false, "reason": "checked the refunds table: no refund for wf-4 (by demo-oncall via Slack)"}`,
	} {
		if !strings.Contains(out, want) {
			t.Errorf("demo output lacks %q:\n%s", want, out)
		}
	}
	if n := strings.Count(out, "idempotency-key-in-flight"); n != 1 {
		t.Errorf("the demo shows wf-2's 409 %d times, want once", n)
	}
	if strings.Contains(out+stderr, "demo-signing-secret-not-a-real-one") {
		t.Error("the demo printed its signing secret")
	}
	if n := db.Count(t, "pg_database WHERE datname LIKE 'ledgerkeeper_demo_%'"); n != 0 {
		t.Fatalf("scratch database left behind: %d", n)
	}
}
