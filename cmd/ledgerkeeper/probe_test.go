package main

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/ledgerkeeper/ledgerkeeper/internal/exampletool"
	"github.com/ledgerkeeper/ledgerkeeper/internal/pgtest"
	"github.com/ledgerkeeper/ledgerkeeper/reconcile"
)

// ticketRouter is a tickets API with a real router: GET /v1/tickets
// filters by idempotency_key; any other path is the router's 404 (what a
// typo'd probe path gets). status, when set, answers every request with it.
type ticketRouter struct {
	srv     *httptest.Server
	mu      sync.Mutex
	tickets map[string]string // idempotency key -> ticket id
	status  int
	asked   map[string]int  // idempotency key -> requests
	queries map[string]bool // raw query strings received
}

func newTicketRouter(t *testing.T) *ticketRouter {
	tr := &ticketRouter{tickets: map[string]string{}, asked: map[string]int{}, queries: map[string]bool{}}
	mux := http.NewServeMux()
	mux.HandleFunc("GET /v1/tickets", func(w http.ResponseWriter, r *http.Request) {
		tr.mu.Lock()
		defer tr.mu.Unlock()
		key := r.URL.Query().Get("idempotency_key")
		tr.asked[key]++
		tr.queries[r.URL.RawQuery] = true
		if tr.status != 0 {
			w.WriteHeader(tr.status)
			return
		}
		data := []map[string]any{}
		if id, ok := tr.tickets[key]; ok {
			data = append(data, map[string]any{"id": id, "idempotency_key": key})
		}
		w.Header().Set("Content-Type", "application/json")
		// Echoes the credentials it got, as some APIs do in their answers.
		_ = json.NewEncoder(w).Encode(map[string]any{"data": data, "auth_seen": r.Header.Get("Authorization")})
	})
	tr.srv = httptest.NewServer(mux)
	t.Cleanup(tr.srv.Close)
	return tr
}

func (tr *ticketRouter) create(key, id string) {
	tr.mu.Lock()
	defer tr.mu.Unlock()
	tr.tickets[key] = id
}

func (tr *ticketRouter) setStatus(code int) {
	tr.mu.Lock()
	defer tr.mu.Unlock()
	tr.status = code
}

func (tr *ticketRouter) askedAbout(key string) int {
	tr.mu.Lock()
	defer tr.mu.Unlock()
	return tr.asked[key]
}

func (tr *ticketRouter) sawQueryContaining(s string) bool {
	tr.mu.Lock()
	defer tr.mu.Unlock()
	for q := range tr.queries {
		if strings.Contains(q, s) {
			return true
		}
	}
	return false
}

// probeConfig is a configuration whose create_ticket probe asks
// tr.srv.URL+path, with an Authorization header if auth is given;
// refund_payment has no probe.
func probeConfig(t *testing.T, tr *ticketRouter, path string, auth ...string) string {
	t.Helper()
	headers := ""
	if len(auth) > 0 {
		headers = fmt.Sprintf("\n      headers: {Authorization: %q}", auth[0])
	}
	return writeFile(t, "ledgerkeeper.yaml", fmt.Sprintf(`reconcile:
  grace: 1s
  alert_after_attempts: 1
tools:
  create_ticket:
    processing_window: 2s
    probe:
      type: http
      url: "%s%s"
      match: data
      response_code: 201
      response_body: {ticket_id: id}%s
  refund_payment:
    processing_window: 2s
`, tr.srv.URL, path, headers))
}

// completedKey is a key its tool server completed itself: the ground
// truth a self-check samples.
func completedKey(t *testing.T, db *pgtest.DB, tool, key, ticket string) {
	t.Helper()
	db.Exec(t, `INSERT INTO idempotency_keys (key, tool, request_hash, status, response_code, response_body, created_at, claimed_at, updated_at, expires_at)
		VALUES ($1, $2, 'h', 'completed', 201, jsonb_build_object('ticket_id', $3::text), now() - interval '1 minute',
			now() - interval '1 minute', now() - interval '50 seconds', now() + interval '1 day')`, key, tool, ticket)
}

// snapshot is every table probing by hand must leave alone: a digest of
// each, rows and contents.
func snapshot(t *testing.T, db *pgtest.DB) map[string]string {
	t.Helper()
	out := map[string]string{}
	for _, table := range []string{"idempotency_keys", "reconcile_state", "reconcile_audit", "alert_outbox", "alert_state", "probe_self_checks", "tool_breakers", "probe_canaries"} {
		var n int
		var digest string
		err := db.Pool.QueryRow(context.Background(), `SELECT count(*), coalesce(md5(string_agg(t::text, '|' ORDER BY t::text)), '') FROM `+table+` t`).Scan(&n, &digest)
		if err != nil {
			t.Fatalf("snapshot of %s: %v", table, err)
		}
		out[table] = fmt.Sprintf("%d rows, %s", n, digest)
	}
	return out
}

func sameSnapshot(t *testing.T, what string, before, after map[string]string) {
	t.Helper()
	for table, b := range before {
		if after[table] != b {
			t.Errorf("%s wrote to %s: before %s, after %s", what, table, b, after[table])
		}
	}
}

// probeRunDoc is the part of `probe run --json` the tests read.
type probeRunDoc struct {
	Key      string `json:"key"`
	Tool     string `json:"tool"`
	InLedger bool   `json:"in_ledger"`
	Status   string `json:"status"`
	Requests []struct {
		Method      string `json:"method"`
		URL         string `json:"url"`
		Answered    bool   `json:"answered"`
		HTTPStatus  int    `json:"http_status"`
		BodyExcerpt string `json:"body_excerpt"`
	} `json:"requests"`
	Verdict    string `json:"verdict"`
	Error      string `json:"error"`
	WouldStore *struct {
		Code int             `json:"response_code"`
		Body json.RawMessage `json:"response_body"`
	} `json:"would_store"`
	Stored *struct {
		Code int `json:"response_code"`
	} `json:"stored"`
	Mismatched []string `json:"mismatched_fields"`
	Written    bool     `json:"written"`
}

// says reports whether out contains want, however the columns are padded.
func says(out, want string) bool {
	return strings.Contains(strings.Join(strings.Fields(out), " "), strings.Join(strings.Fields(want), " "))
}

func sameJSON(got json.RawMessage, want string) bool {
	var g, w any
	return json.Unmarshal(got, &g) == nil && json.Unmarshal([]byte(want), &w) == nil && fmt.Sprint(g) == fmt.Sprint(w)
}

// probeSecret is the value of $PROBE_TEST_TOKEN in the tests that put a
// secret in the probe URL's query.
const probeSecret = "tok-9f8e7d6c5b4a"

// `probe run` probes any key whatever its status, shows the request (the
// api_key from ${PROBE_TEST_TOKEN} redacted), the answer, the verdict and
// the outcome a found verdict would store, and writes nothing.
//
// Not parallel: it sets $PROBE_TEST_TOKEN.
func TestProbeRun(t *testing.T) {
	t.Setenv("PROBE_TEST_TOKEN", probeSecret)
	db := pgtest.New(t)
	tr := newTicketRouter(t)
	cfg := probeConfig(t, tr, "/v1/tickets?idempotency_key={key}&api_key=${PROBE_TEST_TOKEN}", "Bearer ${PROBE_TEST_TOKEN}")
	url := db.URL
	completedKey(t, db, "create_ticket", "k-done", "T-1")
	tr.create("k-done", "T-1")
	stuckKey(t, db, "create_ticket", "k-proc", time.Minute)
	tr.create("k-proc", "T-2")
	stuckKey(t, db, "refund_payment", "k-refund", time.Minute)
	completedKey(t, db, "create_ticket", "k-gone", "T-3") // its ticket deleted downstream since
	before := snapshot(t, db)

	noSecret := func(what, out, stderr string) {
		t.Helper()
		if strings.Contains(out+stderr, probeSecret) {
			t.Errorf("%s: the probe URL's secret is printed:\nstdout %s\nstderr %s", what, out, stderr)
		}
	}

	// A completed key: found, with the outcome it would store next to the
	// stored one.
	code, out, stderr := cli(t, "probe", "run", "k-done", "--config", cfg, "--database-url", url)
	noSecret("probe run k-done", out, stderr)
	if code != 0 {
		t.Fatalf("probe run k-done: %d\n%s\n%s", code, out, stderr)
	}
	for _, want := range []string{
		"status completed in the ledger",
		"GET " + tr.srv.URL + "/v1/tickets?idempotency_key=k-done&api_key=[redacted]",
		"200 OK",
		`{"auth_seen":"[redacted]","data":[{"id":"T-1","idempotency_key":"k-done"}]}`,
		"Accept, Authorization (values not shown)",
		"verdict found",
		`would store  response_code 201, response_body {"ticket_id":"T-1"}`,
		"the probe's fields match the stored outcome",
		"Nothing is written",
		// probe check stores nothing: the advice must not say it does.
		"none stored yet: a reconcile pass of the tool stores one ('ledgerkeeper probe check --tool create_ticket' runs one now, storing nothing)",
	} {
		if !says(out, want) {
			t.Errorf("probe run k-done lacks %q:\n%s", want, out)
		}
	}
	if !tr.sawQueryContaining("api_key=" + probeSecret) {
		t.Fatal("the downstream did not get the real token: the probe asked something else")
	}

	// A completed key the probe does not find: said to be worth a look.
	code, out, stderr = cli(t, "probe", "run", "k-gone", "--config", cfg, "--database-url", url)
	if code != 0 || !says(out, "verdict not_found") || !strings.Contains(out, "the ledger holds this key's outcome, so its effect exists") || strings.Contains(out, "would store") {
		t.Fatalf("probe run of a completed key not found downstream: %d\n%s\n%s", code, out, stderr)
	}

	// A processing key, --json (flags after the key): one document.
	code, out, stderr = cli(t, "probe", "run", "k-proc", "--json", "--config", cfg, "--database-url", url)
	noSecret("probe run k-proc --json", out, stderr)
	var doc probeRunDoc
	if err := json.Unmarshal([]byte(out), &doc); code != 0 || err != nil {
		t.Fatalf("probe run --json: %d %v\n%s\n%s", code, err, out, stderr)
	}
	if doc.Key != "k-proc" || doc.Tool != "create_ticket" || !doc.InLedger || doc.Status != "processing" || doc.Verdict != "found" || doc.Written ||
		len(doc.Requests) != 1 || doc.Requests[0].Method != http.MethodGet || !doc.Requests[0].Answered || doc.Requests[0].HTTPStatus != 200 ||
		!strings.HasSuffix(doc.Requests[0].URL, "idempotency_key=k-proc&api_key=[redacted]") || !strings.Contains(doc.Requests[0].BodyExcerpt, `"T-2"`) ||
		doc.WouldStore == nil || doc.WouldStore.Code != 201 || !sameJSON(doc.WouldStore.Body, `{"ticket_id":"T-2"}`) || doc.Stored != nil {
		t.Fatalf("probe run --json document: %+v\n%s", doc, out)
	}

	// A key not in the ledger, with --tool: probed with no request body.
	code, out, stderr = cli(t, "probe", "run", "--tool", "create_ticket", "k-never", "--json", "--config", cfg, "--database-url", url)
	noSecret("probe run k-never", out, stderr)
	doc = probeRunDoc{}
	if err := json.Unmarshal([]byte(out), &doc); code != 0 || err != nil || doc.InLedger || doc.Verdict != "not_found" || doc.WouldStore != nil || tr.askedAbout("k-never") != 1 {
		t.Fatalf("probe run of a key not in the ledger: %d %v %+v\n%s", code, err, doc, stderr)
	}

	// The downstream answers garbage: the probe still ran (exit 0), the
	// error is shown, nothing would be stored.
	tr.setStatus(http.StatusUnauthorized)
	code, out, stderr = cli(t, "probe", "run", "k-proc", "--config", cfg, "--database-url", url)
	noSecret("probe run, 401", out, stderr)
	if code != 0 || !strings.Contains(out, "401 Unauthorized") || !strings.Contains(out, "unknown") || !strings.Contains(out, "unexpected status 401") || strings.Contains(out, "would store") {
		t.Fatalf("probe run on a 401: %d\n%s\n%s", code, out, stderr)
	}
	tr.setStatus(0)

	for _, c := range []struct {
		name string
		args []string
		want int
		msg  string
	}{
		{"not in the ledger, no --tool", []string{"k-never"}, 1, `key "k-never" not in the ledger: pass --tool`},
		{"unknown tool", []string{"k-done", "--tool", "send_fax"}, 2, `unknown tool "send_fax"`},
		{"tool without a probe", []string{"k-refund"}, 2, `tool "refund_payment" has no probe`},
		{"--tool without a probe", []string{"k-done", "--tool", "refund_payment"}, 2, `tool "refund_payment" has no probe`},
		{"no key", []string{}, 2, "accepts 1 arg"},
		{"bad flag", []string{"k-done", "--bogus"}, 2, "unknown flag"},
	} {
		code, out, stderr := cli(t, append(append([]string{"probe", "run"}, c.args...), "--config", cfg, "--database-url", url)...)
		noSecret(c.name, out, stderr)
		if code != c.want || !strings.Contains(stderr, c.msg) {
			t.Errorf("%s: exit %d, stderr %q; want %d and %q", c.name, code, stderr, c.want, c.msg)
		}
	}
	code, _, stderr = cli(t, "probe", "run", "k-done", "--config", cfg, "--database-url", "postgres://u:hunter2@127.0.0.1:1/x")
	if code != 1 || !strings.Contains(stderr, "cannot reach database") || strings.Contains(stderr, "hunter2") {
		t.Errorf("database unreachable: %d %q", code, stderr)
	}

	sameSnapshot(t, "probe run", before, snapshot(t, db))
}

// probeCheckDoc is the part of `probe check --json` the tests read.
type probeCheckDoc struct {
	Trusted bool `json:"trusted"`
	Written bool `json:"written"`
	Tools   []struct {
		Tool              string                  `json:"tool"`
		Outcome           string                  `json:"outcome"`
		Summary           string                  `json:"summary"`
		PresentUnverified bool                    `json:"present_unverified"`
		Samples           []reconcile.SampleCheck `json:"samples"`
		Absent            reconcile.SampleCheck   `json:"absent"`
	} `json:"tools"`
}

// `probe check` runs the self-check now: trusted (exit 0) on a good probe,
// untrusted (exit 1) on a typo'd path (its router's text 404s are unknown),
// inconclusive (exit 1) when the downstream does not answer; it writes
// nothing, and the URL's secret is never printed.
//
// Not parallel: it sets $PROBE_TEST_TOKEN.
func TestProbeCheck(t *testing.T) {
	t.Setenv("PROBE_TEST_TOKEN", probeSecret)
	db := pgtest.New(t)
	tr := newTicketRouter(t)
	good := probeConfig(t, tr, "/v1/tickets?idempotency_key={key}&api_key=${PROBE_TEST_TOKEN}")
	typo := probeConfig(t, tr, "/v1/ticket?idempotency_key={key}&api_key=${PROBE_TEST_TOKEN}")
	url := db.URL
	for i := range 3 {
		key := fmt.Sprintf("k-done-%d", i)
		completedKey(t, db, "create_ticket", key, fmt.Sprintf("T-%d", i))
		tr.create(key, fmt.Sprintf("T-%d", i))
	}
	// A stuck key whose ticket exists: a reconcile pass would complete it;
	// probe check must not.
	stuckKey(t, db, "create_ticket", "k-stuck", time.Minute)
	tr.create("k-stuck", "T-9")
	before := snapshot(t, db)

	code, out, stderr := cli(t, "probe", "check", "--config", good, "--database-url", url)
	if code != 0 || strings.Contains(out+stderr, probeSecret) {
		t.Fatalf("probe check of a good probe: %d\n%s\n%s", code, out, stderr)
	}
	for _, want := range []string{"create_ticket: TRUSTED", "3 of 3 completed keys came back found with their stored values",
		reconcile.SelfCheckKeyPrefix, "k-done-0", "every checked probe is trusted"} {
		if !strings.Contains(out, want) {
			t.Errorf("probe check output lacks %q:\n%s", want, out)
		}
	}
	if strings.Contains(out, "refund_payment") {
		t.Errorf("a tool without a probe was checked:\n%s", out)
	}

	code, out, stderr = cli(t, "probe", "check", "--json", "--tool", "create_ticket", "--config", good, "--database-url", url)
	var doc probeCheckDoc
	if err := json.Unmarshal([]byte(out), &doc); code != 0 || err != nil {
		t.Fatalf("probe check --json: %d %v\n%s\n%s", code, err, out, stderr)
	}
	if !doc.Trusted || doc.Written || len(doc.Tools) != 1 || doc.Tools[0].Outcome != "trusted" || len(doc.Tools[0].Samples) != 3 ||
		doc.Tools[0].Absent.Expect != "not_found" || doc.Tools[0].Absent.Verdict != "not_found" || !strings.HasPrefix(doc.Tools[0].Absent.Key, reconcile.SelfCheckKeyPrefix) {
		t.Fatalf("probe check --json document: %+v", doc)
	}
	for _, s := range doc.Tools[0].Samples {
		if s.Expect != "found" || s.Verdict != "found" || !s.Passed {
			t.Errorf("sample %+v", s)
		}
	}

	// The typo'd path: the router's text 404 for every sample, unknown.
	code, out, stderr = cli(t, "probe", "check", "--config", typo, "--database-url", url)
	if code != 1 || strings.Contains(out+stderr, probeSecret) {
		t.Fatalf("probe check of a typo'd path: %d\n%s\n%s", code, out, stderr)
	}
	for _, want := range []string{"create_ticket: UNTRUSTED", "0 of 3 completed keys", "probe untrusted: no key of this tool changes state",
		"k-done-1  found  unknown  NO"} {
		if !says(out, want) {
			t.Errorf("untrusted probe check output lacks %q:\n%s", want, out)
		}
	}
	if !strings.Contains(stderr, "probe check: create_ticket untrusted") {
		t.Errorf("stderr %q", stderr)
	}
	code, out, _ = cli(t, "probe", "check", "--config", typo, "--database-url", url, "--json")
	doc = probeCheckDoc{}
	if err := json.Unmarshal([]byte(out), &doc); code != 1 || err != nil || doc.Trusted || doc.Tools[0].Outcome != "untrusted" {
		t.Fatalf("untrusted --json: %d %v %s", code, err, out)
	}

	// The downstream does not answer: inconclusive, exit 1.
	tr.setStatus(http.StatusServiceUnavailable)
	code, out, stderr = cli(t, "probe", "check", "--config", good, "--database-url", url)
	if code != 1 || !strings.Contains(out, "create_ticket: INCONCLUSIVE") || !strings.Contains(out, "the downstream did not answer") || strings.Contains(out+stderr, probeSecret) {
		t.Fatalf("probe check of a downstream answering 503: %d\n%s\n%s", code, out, stderr)
	}
	tr.setStatus(0)

	for _, c := range []struct {
		name string
		args []string
		msg  string
	}{
		{"unknown tool", []string{"--tool", "send_fax"}, `unknown tool "send_fax"`},
		{"tool without a probe", []string{"--tool", "refund_payment"}, `tool "refund_payment" has no probe`},
		{"positional argument", []string{"create_ticket"}, "unknown command"},
	} {
		code, _, stderr := cli(t, append(append([]string{"probe", "check"}, c.args...), "--config", good, "--database-url", url)...)
		if code != 2 || !strings.Contains(stderr, c.msg) {
			t.Errorf("%s: exit %d, stderr %q; want 2 and %q", c.name, code, stderr, c.msg)
		}
	}

	sameSnapshot(t, "probe check", before, snapshot(t, db))
}

// A tool with no key completed by its tool server: only the made-up key is
// checked, and the check says so.
func TestProbeCheckPresentSideUnverified(t *testing.T) {
	t.Parallel()
	db := pgtest.New(t)
	tr := newTicketRouter(t)
	cfg := probeConfig(t, tr, "/v1/tickets?idempotency_key={key}")
	code, out, stderr := cli(t, "probe", "check", "--config", cfg, "--database-url", db.URL)
	if code != 1 || !strings.Contains(out, "create_ticket: TRUSTED") || !strings.Contains(out, "present side unverified") ||
		!strings.Contains(stderr, "probe canary add") {
		t.Fatalf("probe check without samples: exit %d, want 1 saying how to add a canary\n%s\n%s", code, out, stderr)
	}
	// A canary the probe finds witnesses the present side: exit 0.
	tr.create("kept-ticket", "T-kept")
	if code, out, stderr := cli(t, "probe", "canary", "add", "kept-ticket", "--tool", "create_ticket", "--reason", "kept for the self-check",
		"--config", cfg, "--database-url", db.URL); code != 0 {
		t.Fatalf("canary add: %d %s %s", code, out, stderr)
	}
	code, out, stderr = cli(t, "probe", "check", "--config", cfg, "--database-url", db.URL)
	if code != 0 || strings.Contains(out, "present side unverified") {
		t.Fatalf("probe check with a canary found: exit %d\n%s\n%s", code, out, stderr)
	}
}

// `status` shows each tool's stored self-check: an untrusted probe first
// and prominently, a disagreement with the key to inspect, a present side
// unverified.
func TestStatusShowsProbeSelfChecks(t *testing.T) {
	t.Parallel()
	db := pgtest.New(t)
	tr := newTicketRouter(t)
	good := probeConfig(t, tr, "/v1/tickets?idempotency_key={key}")
	typo := probeConfig(t, tr, "/v1/ticket?idempotency_key={key}")
	url := db.URL
	for i := range 3 {
		key := fmt.Sprintf("k-done-%d", i)
		completedKey(t, db, "create_ticket", key, fmt.Sprintf("T-%d", i))
		if i > 0 { // k-done-0's ticket was deleted downstream since
			tr.create(key, fmt.Sprintf("T-%d", i))
		}
	}
	stuckKey(t, db, "create_ticket", "k-stuck", time.Minute)
	tr.create("k-stuck", "T-9")

	// The typo'd probe: the pass's self-check fails, nothing changes.
	if code, out, stderr := cli(t, "reconcile", "--no-alerts", "--config", typo, "--database-url", url); code != 0 {
		t.Fatalf("reconcile: %d %s %s", code, out, stderr)
	}
	if status(t, db, "k-stuck") != "processing" {
		t.Fatal("a key changed state under an untrusted probe")
	}
	code, out, stderr := cli(t, "status", "--config", typo, "--database-url", url)
	if code != 0 {
		t.Fatalf("status: %d %s %s", code, out, stderr)
	}
	first := strings.SplitN(out, "\n\n", 3)
	if len(first) < 2 || !strings.Contains(first[1], "!! create_ticket: probe untrusted: no key of this tool changes state") {
		t.Errorf("status does not lead with the untrusted probe:\n%s", out)
	}
	for _, want := range []string{"yes, UNTRUSTED", "Probe self-checks:", "create_ticket: untrusted at",
		"k-done-1 (want found): got unknown", "probe check --tool create_ticket"} {
		if !strings.Contains(out, want) {
			t.Errorf("status lacks %q:\n%s", want, out)
		}
	}
	code, out, _ = cli(t, "status", "--json", "--config", typo, "--database-url", url)
	var st struct {
		Tools []struct {
			Tool       string `json:"tool"`
			ProbeCheck string `json:"probe_self_check"`
		} `json:"tools"`
		ProbeChecks []struct {
			Tool, Outcome string
			Blocking      bool
			Failed        []reconcile.SampleCheck
		} `json:"probe_self_checks"`
		Warnings []string `json:"warnings"`
	}
	// Four failed: the three completed keys and the made-up one, whose
	// router 404 is unknown, not absence.
	if code != 0 || json.Unmarshal([]byte(out), &st) != nil || len(st.ProbeChecks) != 1 || st.ProbeChecks[0].Outcome != "untrusted" ||
		!st.ProbeChecks[0].Blocking || len(st.ProbeChecks[0].Failed) != 4 || len(st.Tools) != 1 || st.Tools[0].ProbeCheck != "untrusted" ||
		len(st.Warnings) == 0 || !strings.Contains(st.Warnings[0], "probe untrusted") {
		t.Fatalf("status --json: %d %+v\n%s", code, st, out)
	}

	// The fixed probe: trusted, with one disagreement (k-done-0 is gone
	// downstream) seen by each check of the batch's bracket (the count
	// adds up per check), which does not block the tool.
	if code, out, stderr := cli(t, "reconcile", "--no-alerts", "--config", good, "--database-url", url); code != 0 {
		t.Fatalf("reconcile: %d %s %s", code, out, stderr)
	}
	if status(t, db, "k-stuck") != "completed" {
		t.Fatal("k-stuck not completed under the trusted probe")
	}
	code, out, _ = cli(t, "status", "--config", good, "--database-url", url)
	for _, want := range []string{"create_ticket: trusted at", "yes, trusted", "2 disagreement(s)", "latest: k-done-0", "probe run KEY"} {
		if code != 0 || !strings.Contains(out, want) {
			t.Errorf("status lacks %q:\n%s", want, out)
		}
	}
	if strings.Contains(out, "!!") || strings.Contains(out, "UNTRUSTED") {
		t.Errorf("a trusted probe shown as untrusted:\n%s", out)
	}
	if strings.Contains(out, "stale:") {
		t.Errorf("a check seconds old shown as stale (self_check.interval 10m):\n%s", out)
	}
	// The same check under a configuration whose interval it outlived.
	short := strings.Replace(readConfig(t, good), "tools:", "self_check:\n  interval: 1ms\ntools:", 1)
	code, out, _ = cli(t, "status", "--config", writeFile(t, "short.yaml", short), "--database-url", url)
	if code != 0 || !strings.Contains(out, "stale: older than self_check.interval") {
		t.Errorf("status under self_check.interval 1ms does not say the check is stale:\n%s", out)
	}
}

func readConfig(t *testing.T, path string) string {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// `probe check` and `probe run` work on the demo's own configuration
// against the example tool server: a ticket created through the tool is
// found by its probe, and the made-up key is not.
//
// Not parallel: it sets $TOOL_URL and $SLACK_API_URL, as the demo does.
func TestProbeOnDemoConfig(t *testing.T) {
	db := pgtest.New(t)
	tool := exampletool.New(exampletool.Config{Ledger: db.Pool, Sink: db.Pool})
	if err := tool.Migrate(context.Background()); err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(tool.Handler())
	t.Cleanup(srv.Close)
	t.Setenv("TOOL_URL", srv.URL)
	t.Setenv("SLACK_API_URL", "http://127.0.0.1:1/api/")
	cfg := writeFile(t, "demo.yaml", string(demoConfig))

	req, _ := http.NewRequest(http.MethodPost, srv.URL+"/tools/create_ticket", strings.NewReader(`{"title":"Printer on fire","account_id":"A-7"}`))
	req.Header.Set("Idempotency-Key", "wf-1:step-1:create_ticket")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusCreated {
		t.Fatalf("create_ticket: %d", resp.StatusCode)
	}

	code, out, stderr := cli(t, "probe", "check", "--config", cfg, "--database-url", db.URL)
	if code != 0 || !strings.Contains(out, "create_ticket: TRUSTED") || !strings.Contains(out, "1 of 1 completed keys came back found with their stored values") {
		t.Fatalf("probe check on the demo's configuration: %d\n%s\n%s", code, out, stderr)
	}
	code, out, stderr = cli(t, "probe", "run", "wf-1:step-1:create_ticket", "--config", cfg, "--database-url", db.URL)
	if code != 0 || !says(out, "verdict found") || !strings.Contains(out, "the probe's fields match the stored outcome") {
		t.Fatalf("probe run on the demo's configuration: %d\n%s\n%s", code, out, stderr)
	}
	t.Logf("probe run on the demo's configuration:\n%s", out)
}

// `probe run` and `probe check` with an sql probe on a real downstream
// PostgreSQL: the query and its arguments are shown, the row is the
// outcome it would store, a field that differs from the stored outcome is
// named; the downstream's DSN never appears.
func TestProbeRunAndCheckSQL(t *testing.T) {
	t.Parallel()
	db := pgtest.New(t)
	down := pgtest.NewEmpty(t)
	down.Exec(t, `CREATE TABLE charges (id text PRIMARY KEY, idempotency_key text NOT NULL, amount_cents bigint NOT NULL)`)
	down.Exec(t, `INSERT INTO charges VALUES ('ch_1', 'k-1', 1200), ('ch_2', 'k-2', 500)`)
	cfg := sqlProbeConfig(t, down.URL, "SELECT id AS charge_id, amount_cents FROM charges WHERE idempotency_key = $1", "[key]", "{}")
	stuckKey(t, db, "charge_card", "k-1", time.Minute)
	db.Exec(t, `INSERT INTO idempotency_keys (key, tool, request_hash, status, response_code, response_body, created_at, claimed_at, updated_at, expires_at)
		VALUES ('k-2', 'charge_card', 'h', 'completed', 200, '{"charge_id":"ch_2","amount_cents":499}', now() - interval '1 minute',
			now() - interval '1 minute', now() - interval '50 seconds', now() + interval '1 day')`)
	before := snapshot(t, db)

	code, out, stderr := cli(t, "probe", "run", "k-1", "--config", cfg, "--database-url", db.URL)
	if code != 0 || strings.Contains(out+stderr, down.URL) {
		t.Fatalf("probe run with an sql probe: %d\n%s\n%s", code, out, stderr)
	}
	for _, want := range []string{"sql probe", "query SELECT id AS charge_id, amount_cents FROM charges WHERE idempotency_key = $1", "args key",
		"verdict found", `would store response_code 200, response_body {"amount_cents":1200,"charge_id":"ch_1"}`} {
		if !says(out, want) {
			t.Errorf("probe run lacks %q:\n%s", want, out)
		}
	}
	code, out, _ = cli(t, "probe", "run", "k-2", "--config", cfg, "--database-url", db.URL)
	if code != 0 || !says(out, "DIFFERS from what the probe found in: amount_cents") {
		t.Errorf("probe run of a completed key whose amount changed downstream: %d\n%s", code, out)
	}
	// One sample of one drawn, failing on its value: untrusted.
	code, out, _ = cli(t, "probe", "check", "--config", cfg, "--database-url", db.URL)
	if code != 1 || !says(out, "charge_card: UNTRUSTED") || !says(out, "k-2 found found NO amount_cents") {
		t.Errorf("probe check of an sql probe whose sample differs: %d\n%s", code, out)
	}
	sameSnapshot(t, "probe run/check with an sql probe", before, snapshot(t, db))
}
