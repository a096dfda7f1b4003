package console

import (
	"context"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/ledgerkeeper/ledgerkeeper/alerts"
	"github.com/ledgerkeeper/ledgerkeeper/ledger"
	"github.com/ledgerkeeper/ledgerkeeper/ledger/ledgertest/testwait"
	"github.com/ledgerkeeper/ledgerkeeper/operator"
	"github.com/ledgerkeeper/ledgerkeeper/probes"
	"github.com/ledgerkeeper/ledgerkeeper/reconcile"
	"github.com/ledgerkeeper/ledgerkeeper/store"
)

// tickets is a real HTTP downstream that knows which tickets exist and
// counts every request it is asked.
type tickets struct {
	srv *httptest.Server

	mu       sync.Mutex
	found    map[string]bool
	all      bool // a broken downstream: every key is found, the made-up one too
	requests int
	// gate, when set, holds every request until it is closed; entered
	// announces each request held.
	gate    chan struct{}
	entered chan struct{}
}

func newTickets(t *testing.T) *tickets {
	t.Helper()
	d := &tickets{found: map[string]bool{}}
	d.srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		key := r.URL.Query().Get("idempotency_key")
		d.mu.Lock()
		d.requests++
		found, gate, entered := d.found[key] || d.all, d.gate, d.entered
		d.mu.Unlock()
		if gate != nil {
			select {
			case entered <- struct{}{}:
			case <-r.Context().Done():
				return
			}
			select {
			case <-gate:
			case <-r.Context().Done():
				return
			}
		}
		data := []map[string]any{}
		if found {
			data = append(data, map[string]any{"id": "T-" + key, "title": "printer " + cSecret})
		}
		w.Header().Set("Content-Type", "application/json")
		_ = json.NewEncoder(w).Encode(map[string]any{"data": data})
	}))
	t.Cleanup(d.srv.Close)
	return d
}

func (d *tickets) count() int {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.requests
}

func (d *tickets) set(f func(*tickets)) {
	d.mu.Lock()
	defer d.mu.Unlock()
	f(d)
}

// probe is the tool's http probe; its URL carries a credential the page
// must never show.
func (d *tickets) probe(t *testing.T) probes.Probe {
	t.Helper()
	p, err := probes.NewHTTP(probes.HTTPConfig{
		URL:          d.srv.URL + "/v1/tickets?idempotency_key={key}&api_key=" + cSecret,
		Match:        "data",
		ResponseCode: 201,
		ResponseBody: map[string]string{"ticket_id": "id", "title": "title"},
		Timeout:      5 * time.Second,
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = p.Close() })
	return p
}

// withRun gives the console serve's probes and reconciler over the
// downstream d: a real engine with the self-check on.
func withRun(t *testing.T, d *tickets, every time.Duration) func(*Config) {
	p := d.probe(t)
	return func(c *Config) {
		pool := c.Pool.(*pgxpool.Pool)
		engineFor := func(actor string) *reconcile.Engine {
			return reconcile.New(reconcile.Config{Actor: actor, BackoffBase: time.Hour,
				Tools: map[string]reconcile.Policy{cTool: {Probe: p, ProbeFingerprint: "fp-1"}}}, pool, nil, nil)
		}
		probing := engineFor("console")
		c.Run = RunConfig{
			Probe:  ProbeWith(probing),
			Policy: probing.Policy,
			Tools:  []string{cTool},
			Reconciler: func(_ context.Context, actor string) (*reconcile.Engine, io.Closer, error) {
				return engineFor(actor), io.NopCloser(nil), nil
			},
			SelfCheckInterval: 10 * time.Minute,
			ProbeEvery:        every,
		}
	}
}

// written counts every row the reconciler or an operator could write.
func (r *rig) written(t *testing.T) map[string]int {
	t.Helper()
	out := map[string]int{}
	for _, table := range []string{"reconcile_audit", "reconcile_state", "alert_outbox", "alert_state", "ledgerkeeper_runs", "probe_self_checks", "tool_breakers", "key_holds"} {
		out[table] = r.count(t, table)
	}
	out["keys not processing"] = r.count(t, `idempotency_keys WHERE status <> 'processing'`)
	out["keys updated"] = r.count(t, `idempotency_keys WHERE updated_at <> created_at`)
	return out
}

func sameRows(t *testing.T, before, after map[string]int) {
	t.Helper()
	for k, n := range before {
		if after[k] != n {
			t.Errorf("%s: %d rows before, %d after", k, n, after[k])
		}
	}
}

func TestProbeNowAsksTheDownstreamWritesNothingAndShowsTheVerdictRedacted(t *testing.T) {
	d := newTickets(t)
	r := newRig(t, withRun(t, d, 0))
	r.putKey(t, "k-1", ledger.StatusProcessing, time.Hour)
	r.db.Exec(t, `UPDATE idempotency_keys SET updated_at = created_at`)
	d.set(func(d *tickets) { d.found["k-1"] = true })
	page := r.get(t, "bob", "/ui/key?key=k-1")
	wantIn(t, page.Body, `action="/ui/key/probe"`)
	wantNotIn(t, page.Body, `action="/ui/key/reconcile"`) // bob is not granted reconcile
	before := r.written(t)
	resp := r.post(t, "bob", "/ui/key/probe", url.Values{"key": {"k-1"}})
	wantStatus(t, resp, http.StatusOK)
	wantIn(t, resp.Body, `id="probe-verdict">found<`, "T-k-1", "would store", "HTTP 201", "/v1/tickets?idempotency_key=k-1", "HTTP 200")
	wantNotIn(t, resp.Body, cSecret)
	if n := d.count(); n != 1 {
		t.Errorf("the downstream was asked %d times, want 1", n)
	}
	sameRows(t, before, r.written(t))
	if got := r.key(t, "k-1"); got.Status != ledger.StatusProcessing {
		t.Errorf("the probed key is %s", got.Status)
	}
	if logs := r.logs.String(); !strings.Contains(logs, `msg="console: probe now" user=bob key=k-1 tool=create_ticket verdict=found`) {
		t.Errorf("the probe is not logged with its user:\n%s", logs)
	}
}

func TestProbeNowIsRateLimitedPerKey(t *testing.T) {
	d := newTickets(t)
	r := newRig(t, withRun(t, d, 0))
	r.putKey(t, "k-1", ledger.StatusProcessing, time.Hour)
	r.putKey(t, "k-2", ledger.StatusProcessing, time.Hour)
	wantStatus(t, r.post(t, "bob", "/ui/key/probe", url.Values{"key": {"k-1"}}), http.StatusOK)
	again := r.post(t, "alice", "/ui/key/probe", url.Values{"key": {"k-1"}})
	wantStatus(t, again, http.StatusTooManyRequests)
	wantIn(t, again.Body, "Probe not sent", "at most one per 5s per key")
	if again.Header.Get("Retry-After") == "" {
		t.Error("a refused probe says no Retry-After")
	}
	// Another key is not held back by the first.
	wantStatus(t, r.post(t, "bob", "/ui/key/probe", url.Values{"key": {"k-2"}}), http.StatusOK)
	if n := d.count(); n != 2 {
		t.Errorf("the downstream was asked %d times, want 2 (the refused probe sent nothing)", n)
	}
	if logs := r.logs.String(); !strings.Contains(logs, `msg="console: probe now refused" user=alice key=k-1`) {
		t.Errorf("the refusal is not logged with its user:\n%s", logs)
	}
}

func TestProbeNowRunsOneProbeAtATimePerKey(t *testing.T) {
	d := newTickets(t)
	r := newRig(t, withRun(t, d, time.Nanosecond)) // no spacing: only one at a time
	r.putKey(t, "k-1", ledger.StatusProcessing, time.Hour)
	gate, entered := make(chan struct{}), make(chan struct{}, 1)
	d.set(func(d *tickets) { d.gate, d.entered = gate, entered })
	first := make(chan int, 1)
	go func() {
		req, err := http.NewRequest(http.MethodPost, r.srv.URL+"/ui/key/probe", strings.NewReader(url.Values{"key": {"k-1"}}.Encode()))
		if err != nil {
			first <- 0
			return
		}
		req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
		req.Header.Set("Sec-Fetch-Site", "same-origin")
		req.SetBasicAuth("bob", passwords["bob"])
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			first <- 0
			return
		}
		_ = resp.Body.Close()
		first <- resp.StatusCode
	}()
	testwait.Recv(t, entered, 10*time.Second)
	second := r.post(t, "bob", "/ui/key/probe", url.Values{"key": {"k-1"}})
	wantStatus(t, second, http.StatusTooManyRequests)
	wantIn(t, second.Body, "already running for this key")
	close(gate)
	if st := testwait.Recv(t, first, 10*time.Second); st != http.StatusOK {
		t.Fatalf("the first probe: status %d", st)
	}
	d.set(func(d *tickets) { d.gate = nil })
	wantStatus(t, r.post(t, "bob", "/ui/key/probe", url.Values{"key": {"k-1"}}), http.StatusOK)
	if n := d.count(); n != 2 {
		t.Errorf("the downstream was asked %d times, want 2", n)
	}
}

func TestWithoutAProberOrReconcilerTheButtonsAreAbsentAndThePostsSaySo(t *testing.T) {
	r := newRig(t)
	r.putKey(t, "k-1", ledger.StatusProcessing, time.Hour)
	page := r.get(t, "alice", "/ui/key?key=k-1")
	wantNotIn(t, page.Body, `action="/ui/key/probe"`, `action="/ui/key/reconcile"`)
	before := r.written(t)
	p := r.post(t, "alice", "/ui/key/probe", url.Values{"key": {"k-1"}})
	wantStatus(t, p, http.StatusServiceUnavailable)
	wantIn(t, p.Body, "Probe now is not available here")
	rc := r.post(t, "alice", "/ui/key/reconcile", url.Values{"key": {"k-1"}, "confirm": {"yes"}})
	wantStatus(t, rc, http.StatusServiceUnavailable)
	wantIn(t, rc.Body, "Reconcile this key now is not available here")
	sameRows(t, before, r.written(t))
}

func TestReconcileNowDecidesTheStuckKeyAndRecordsThePassAsTheUser(t *testing.T) {
	d := newTickets(t)
	r := newRig(t, withRun(t, d, 0))
	r.putKey(t, "k-1", ledger.StatusProcessing, time.Hour)
	r.putKey(t, "k-other", ledger.StatusProcessing, time.Hour)
	d.set(func(d *tickets) { d.found["k-1"], d.found["k-other"] = true, true })
	page := r.get(t, "alice", "/ui/key?key=k-1")
	wantIn(t, page.Body, `action="/ui/key/reconcile"`)
	// First the confirmation: what the pass may change for retries;
	// nothing asked, nothing written.
	before := r.written(t)
	ask := r.post(t, "alice", "/ui/key/reconcile", url.Values{"key": {"k-1"}})
	wantStatus(t, ask, http.StatusOK)
	wantIn(t, ask.Body, "Reconcile this key now: confirm", "every retry of this key receives it", `name="confirm" value="yes"`)
	sameRows(t, before, r.written(t))
	if n := d.count(); n != 0 {
		t.Errorf("the confirmation asked the downstream %d times", n)
	}
	resp := r.post(t, "alice", "/ui/key/reconcile", url.Values{"key": {"k-1"}, "confirm": {"yes"}})
	wantStatus(t, resp, http.StatusOK)
	wantIn(t, resp.Body, "Reconcile now: decided: completed", "console:alice", "probe said found")
	wantNotIn(t, resp.Body, cSecret)
	got := r.key(t, "k-1")
	if got.Status != ledger.StatusCompleted || got.ResponseCode == nil || *got.ResponseCode != 201 || !strings.Contains(string(got.ResponseBody), "T-k-1") {
		t.Fatalf("k-1 after reconcile now: %s %v %s", got.Status, got.ResponseCode, got.ResponseBody)
	}
	if n := r.count(t, `reconcile_audit WHERE key = 'k-1'`); n != 1 {
		t.Errorf("audit rows of k-1: %d, want 1", n)
	}
	if n := r.count(t, `reconcile_audit WHERE key = 'k-1' AND action = 'completed' AND actor = 'console:alice'`); n != 1 {
		t.Errorf("k-1's completion is not audited as console:alice")
	}
	if n := r.count(t, `ledgerkeeper_runs WHERE kind = 'reconcile' AND actor = 'console:alice' AND (stats->>'keys')::int = 1`); n != 1 {
		t.Errorf("the pass is not recorded as console:alice's: %d rows", n)
	}
	// The pass was restricted to the key: the other stuck key, whose
	// effect exists too, is left for the reconciler.
	if other := r.key(t, "k-other"); other.Status != ledger.StatusProcessing {
		t.Errorf("k-other was decided by a pass of k-1: %s", other.Status)
	}
	runs := r.get(t, "bob", "/ui/runs")
	wantIn(t, runs.Body, "console:alice", "1 completed")
}

func TestReconcileNowLeavesAHeldKeyAlone(t *testing.T) {
	d := newTickets(t)
	r := newRig(t, withRun(t, d, 0))
	r.putKey(t, "k-1", ledger.StatusProcessing, time.Hour)
	d.set(func(d *tickets) { d.found["k-1"] = true })
	if _, err := operator.Hold(bg, r.db.Pool, operator.HoldRequest{Key: "k-1", Reason: "looking", Actor: "carol"}); err != nil {
		t.Fatal(err)
	}
	resp := r.post(t, "alice", "/ui/key/reconcile", url.Values{"key": {"k-1"}, "confirm": {"yes"}})
	wantStatus(t, resp, http.StatusOK)
	wantIn(t, resp.Body, "nothing decided", "on hold")
	if got := r.key(t, "k-1"); got.Status != ledger.StatusProcessing {
		t.Errorf("the held key is %s", got.Status)
	}
	if n := r.count(t, `reconcile_audit WHERE key = 'k-1' AND action <> 'hold'`); n != 0 {
		t.Errorf("%d audit rows besides the hold", n)
	}
}

func TestReconcileNowDecidesNothingWhileTheProbeIsUntrustedOrTheBreakerOpen(t *testing.T) {
	d := newTickets(t)
	r := newRig(t, withRun(t, d, 0))
	r.putKey(t, "k-1", ledger.StatusProcessing, time.Hour)
	// A broken downstream finds the made-up key too: the self-check fails.
	d.set(func(d *tickets) { d.all = true })
	resp := r.post(t, "alice", "/ui/key/reconcile", url.Values{"key": {"k-1"}, "confirm": {"yes"}})
	wantStatus(t, resp, http.StatusOK)
	wantIn(t, resp.Body, "nothing decided", "untrusted")
	if got := r.key(t, "k-1"); got.Status != ledger.StatusProcessing {
		t.Fatalf("an untrusted probe's verdict was applied: %s", got.Status)
	}
	if n := r.count(t, `reconcile_audit WHERE key = 'k-1'`); n != 0 {
		t.Errorf("%d audit rows of k-1 under an untrusted probe", n)
	}
	checks := r.get(t, "bob", "/ui/checks")
	wantIn(t, checks.Body, "no: the last self-check was untrusted")

	d.set(func(d *tickets) { d.all, d.found["k-1"] = false, true })
	r.db.Exec(t, `INSERT INTO tool_breakers (tool, consecutive_failures, opens, open_until, last_error) VALUES ($1, 5, 1, now() + interval '10 minutes', 'timeout')
		ON CONFLICT (tool) DO UPDATE SET opens = 1, open_until = now() + interval '10 minutes'`, cTool)
	asked := d.count()
	open := r.post(t, "alice", "/ui/key/reconcile", url.Values{"key": {"k-1"}, "confirm": {"yes"}})
	wantIn(t, open.Body, "nothing decided", "circuit breaker")
	if got := r.key(t, "k-1"); got.Status != ledger.StatusProcessing {
		t.Fatalf("a key was decided with the breaker open: %s", got.Status)
	}
	if n := d.count(); n != asked {
		t.Errorf("the downstream was asked %d times with the breaker open", n-asked)
	}
}

func TestReconcileNowNeedsTheGrantAndARefusalWritesNothing(t *testing.T) {
	d := newTickets(t)
	r := newRig(t, withRun(t, d, 0))
	r.putKey(t, "k-1", ledger.StatusProcessing, time.Hour)
	r.db.Exec(t, `UPDATE idempotency_keys SET updated_at = created_at`)
	d.set(func(d *tickets) { d.found["k-1"] = true })
	before := r.written(t)
	for _, user := range []string{"bob", "carol"} {
		resp := r.post(t, user, "/ui/key/reconcile", url.Values{"key": {"k-1"}, "confirm": {"yes"}})
		wantStatus(t, resp, http.StatusForbidden)
		wantIn(t, resp.Body, "not granted reconcile")
	}
	sameRows(t, before, r.written(t))
	if n := d.count(); n != 0 {
		t.Errorf("the downstream was asked %d times by refused requests", n)
	}
	carol := r.get(t, "carol", "/ui/key?key=k-1")
	wantNotIn(t, carol.Body, `action="/ui/key/reconcile"`)
	// Granted reconcile alone: the button, and the pass.
	g := newRig(t, withRun(t, d, 0), func(c *Config) { c.Operators = map[string][]Action{"bob": {ActionReconcile}} })
	g.putKey(t, "k-1", ledger.StatusProcessing, time.Hour)
	wantIn(t, g.get(t, "bob", "/ui/key?key=k-1").Body, `action="/ui/key/reconcile"`)
	wantStatus(t, g.post(t, "bob", "/ui/key/reconcile", url.Values{"key": {"k-1"}, "confirm": {"yes"}}), http.StatusOK)
	if got := g.key(t, "k-1"); got.Status != ledger.StatusCompleted {
		t.Errorf("bob's granted reconcile left k-1 %s", got.Status)
	}
}

func TestAnUnknownActionNamesReconcileAmongTheKnown(t *testing.T) {
	r := newRig(t)
	_, err := New(Config{Pool: r.db.Pool, Auth: AuthNone, Loopback: true, Operators: map[string][]Action{"x": {"reboot"}}})
	if err == nil || !strings.Contains(err.Error(), "store_outcome, reconcile)") {
		t.Errorf("unknown action: %v", err)
	}
}

// insertCheck stores a self-check of tool whose samples carry a secret in
// their evidence and error.
func (r *rig) insertCheck(t *testing.T, tool, outcome string, ev any) {
	t.Helper()
	b, err := json.Marshal(ev)
	if err != nil {
		t.Fatal(err)
	}
	r.db.Exec(t, `INSERT INTO probe_self_checks (tool, outcome, fingerprint, samples, present_failed, absent_verdict, summary, evidence, actor, checked_at)
		VALUES ($1, $2, 'fp-1', 2, 1, 'not_found', $3, $4, 'replica-7', now() - interval '1 minute')`,
		tool, outcome, outcome+": the made-up key came back not_found; token "+cSecret, string(b))
}

func TestChecksPageShowsEachSampleTheBreakerAndTheTrustRedacted(t *testing.T) {
	r := newRig(t, func(c *Config) { c.Run.SelfCheckInterval = 10 * time.Minute })
	r.insertCheck(t, cTool, "trusted", map[string]any{
		"samples": []map[string]any{
			{"key": "done-1", "expect": "found", "verdict": "found", "passed": true, "source": "completed", "evidence": map[string]any{"http_status": 200, "seen": cSecret}},
			{"key": "canary-1", "expect": "found", "verdict": "not_found", "passed": false, "source": "canary", "error": "GET /v1?api_key=" + cSecret + ": 404"},
		},
		"absent": map[string]any{"key": "ledgerkeeper-self-check:abc", "expect": "not_found", "verdict": "not_found", "passed": true},
	})
	r.insertCheck(t, "send_invoice", "untrusted", map[string]any{"samples": []any{},
		"absent": map[string]any{"key": "ledgerkeeper-self-check:def", "expect": "not_found", "verdict": "found", "passed": false}})
	r.db.Exec(t, `INSERT INTO tool_breakers (tool, consecutive_failures, opens, open_until, last_error) VALUES ('send_invoice', 5, 2, now() + interval '10 minutes', $1)`,
		"dial tcp: password="+cSecret)
	if _, err := store.AddCanary(bg, r.db.Pool, store.Canary{Tool: cTool, Key: "canary-1", Reason: "kept ticket T-1", Actor: "alice"}); err != nil {
		t.Fatal(err)
	}
	resp := r.get(t, "bob", "/ui/checks")
	wantStatus(t, resp, http.StatusOK)
	wantIn(t, resp.Body, `id="tool-create_ticket"`, "<td>done-1</td><td>completed</td><td>found</td><td>found</td><td>passed</td>",
		"<td>canary-1</td><td>canary</td><td>found</td><td>not_found</td><td>FAILED</td>",
		"<td>ledgerkeeper-self-check:abc</td><td>made-up key</td><td>not_found</td><td>not_found</td><td>passed</td>",
		"trusted at ", "by replica-7", "yes: the last self-check passed", "canary-1</code> (operator, marked by alice",
		`id="tool-send_invoice"`, "no: the circuit breaker is open until", "2 opening(s)", "due from ")
	wantNotIn(t, resp.Body, cSecret)
	if strings.Count(resp.Body, "[redacted]") < 4 {
		t.Errorf("the secrets are not shown redacted:\n%s", resp.Body)
	}
}

// raise raises an alert as the reconciler does, in one transaction.
func (r *rig) raise(t *testing.T, a alerts.Alert) {
	t.Helper()
	tx, err := r.db.Pool.Begin(bg)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = tx.Rollback(bg) }()
	if _, err := alerts.Raise(bg, tx, a, time.Hour); err != nil {
		t.Fatal(err)
	}
	if err := tx.Commit(bg); err != nil {
		t.Fatal(err)
	}
}

func TestAlertsPageShowsDeliveryAndSlackActsRedactedAndPagesByKeyset(t *testing.T) {
	r := newRig(t, func(c *Config) { c.PageSize = 2 })
	for _, k := range []string{"a-1", "a-2", "a-3"} {
		r.putKey(t, k, ledger.StatusProcessing, time.Hour)
		r.raise(t, alerts.Alert{Reason: alerts.ReasonProbeFailing, Tool: cTool, Key: k})
	}
	r.raise(t, alerts.Alert{Reason: alerts.ReasonDownstreamUnreachable, Tool: cTool})
	// a-1's message failed twice; a-2's was delivered.
	r.db.Exec(t, `UPDATE alert_outbox SET attempts = 2, last_error = $1, last_error_class = 'retryable', last_attempt_at = now(),
		next_attempt_at = now() + interval '5 minutes' WHERE key = 'a-1'`, "slack: 503 from https://hooks.example/"+cSecret)
	r.db.Exec(t, `UPDATE alert_outbox SET status = 'sent', sent_at = now(), attempts = 1 WHERE key = 'a-2'`)
	if _, err := operator.Hold(bg, r.db.Pool, operator.HoldRequest{Key: "a-1", Reason: "from slack", Actor: "slack:U0CAROL"}); err != nil {
		t.Fatal(err)
	}
	first := r.get(t, "bob", "/ui/alerts")
	wantStatus(t, first, http.StatusOK)
	// Firing, by subject: key:a-1, key:a-2 on the first page.
	wantIn(t, first.Body, `<a href="/ui/key?key=a-1">a-1</a>`, `<a href="/ui/checks#tool-create_ticket">create_ticket</a>`,
		`class="delivery failing">failing</span>, 2 attempt(s) (retryable), next try`,
		`class="delivery delivered">delivered</span> at`, "slack:U0CAROL: hold at",
		`rel="next" href="/ui/alerts?after=key%3Aa-2&amp;after_reason=probe_failing"`)
	wantNotIn(t, first.Body, cSecret, `<td>tool-wide</td><td>`)
	if !strings.Contains(first.Body, "[redacted]") {
		t.Errorf("the delivery error is not shown redacted")
	}
	second := r.get(t, "bob", "/ui/alerts?after=key%3Aa-2&after_reason=probe_failing")
	wantStatus(t, second, http.StatusOK)
	firing := second.Body[strings.Index(second.Body, `id="firing"`):strings.Index(second.Body, `id="resolved"`)]
	wantIn(t, firing, `key=a-3"`, "tool-wide", "downstream_unreachable")
	wantNotIn(t, firing, `key=a-1"`, `key=a-2"`, `rel="next"`)

	// Messages page by id, newest first; resolutions are listed.
	tx, err := r.db.Pool.Begin(bg)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := alerts.ResolveKey(bg, tx, cTool, "a-3", "completed by reconciler"); err != nil {
		t.Fatal(err)
	}
	if err := tx.Commit(bg); err != nil {
		t.Fatal(err)
	}
	page := r.get(t, "bob", "/ui/alerts")
	resolved := page.Body[strings.Index(page.Body, `id="resolved"`):strings.Index(page.Body, `id="messages"`)]
	wantIn(t, resolved, `key=a-3"`, "completed by reconciler", "pending")
	var newest int64
	if err := r.db.Pool.QueryRow(bg, `SELECT max(id) FROM alert_outbox`).Scan(&newest); err != nil {
		t.Fatal(err)
	}
	msgs := page.Body[strings.Index(page.Body, `id="messages"`):]
	wantIn(t, msgs, "<td>resolved</td>", `href="/ui/alerts?before=`)
	older := r.get(t, "bob", "/ui/alerts?before="+strconv.FormatInt(newest-1, 10))
	msgs = older.Body[strings.Index(older.Body, `id="messages"`):]
	wantNotIn(t, msgs, "<td>resolved</td>")
	wantStatus(t, r.get(t, "bob", "/ui/alerts?before=x"), http.StatusBadRequest)
}

// A Citus worker's alert (shards_unreachable: no tool, no key) is shown as
// the worker, escaped, in the firing, resolved and messages tables: no
// link to an empty tool's checks, no "tool-wide", no link to a key. The
// tool's and the key's alerts beside it are shown as before.
func TestAlertsPageNamesTheCitusWorkerOfAWorkerAlert(t *testing.T) {
	r := newRig(t)
	r.putKey(t, "a-1", ledger.StatusProcessing, time.Hour)
	r.raise(t, alerts.Alert{Reason: alerts.ReasonProbeFailing, Tool: cTool, Key: "a-1"})
	r.raise(t, alerts.Alert{Reason: alerts.ReasonDownstreamUnreachable, Tool: cTool})
	// As the reconciler does: each in the transaction that found it.
	tx, err := r.db.Pool.Begin(bg)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = tx.Rollback(bg) }()
	for _, node := range []string{"127.0.0.1:9702", "<b>w</b>:9703", "10.0.0.9:5432"} {
		if _, err := alerts.RaiseNode(bg, tx, alerts.NodeAlert{Node: node, Shards: []int64{102008}}, time.Hour); err != nil {
			t.Fatal(err)
		}
	}
	if err := tx.Commit(bg); err != nil {
		t.Fatal(err)
	}
	if _, err := alerts.ResolveNode(bg, r.db.Pool, "10.0.0.9:5432", "reachable again"); err != nil {
		t.Fatal(err)
	}

	page := r.get(t, "bob", "/ui/alerts")
	wantStatus(t, page, http.StatusOK)
	wantNotIn(t, page.Body, `checks#tool-"`, `href="/ui/key?key="`, "<b>w</b>")
	firing := page.Body[strings.Index(page.Body, `id="firing"`):strings.Index(page.Body, `id="resolved"`)]
	wantIn(t, firing, `<td colspan="2">Citus worker 127.0.0.1:9702</td>`, `<td colspan="2">Citus worker &lt;b&gt;w&lt;/b&gt;:9703</td>`,
		`<a href="/ui/checks#tool-create_ticket">create_ticket</a>`, `<a href="/ui/key?key=a-1">a-1</a>`)
	wantNotIn(t, firing, "10.0.0.9:5432")
	if n := strings.Count(firing, "tool-wide"); n != 1 {
		t.Errorf("the firing table says tool-wide %d times, want once (the tool's alert):\n%s", n, firing)
	}
	_, row, ok := strings.Cut(firing, "Citus worker 127.0.0.1:9702")
	if !ok {
		t.Fatalf("the firing table does not name the worker:\n%s", firing)
	}
	row, _, _ = strings.Cut(row, "</tr>")
	wantIn(t, row, `class="delivery pending">pending</span>, 0 attempt(s)`)
	wantNotIn(t, row, "<a ")

	resolved := page.Body[strings.Index(page.Body, `id="resolved"`):strings.Index(page.Body, `id="messages"`)]
	wantIn(t, resolved, `<td>shards_unreachable</td><td colspan="2">Citus worker 10.0.0.9:5432</td>`, "reachable again")
	wantNotIn(t, resolved, "tool-wide")
	msgs := page.Body[strings.Index(page.Body, `id="messages"`):]
	for _, node := range []string{"127.0.0.1:9702", "&lt;b&gt;w&lt;/b&gt;:9703", "10.0.0.9:5432"} {
		wantIn(t, msgs, `<td>shards_unreachable</td><td colspan="2">Citus worker `+node+`</td>`)
	}
	wantIn(t, msgs, `<td>probe_failing</td><td>create_ticket</td><td><a href="/ui/key?key=a-1">a-1</a></td>`,
		`<td>downstream_unreachable</td><td>create_ticket</td><td></td>`)
}

func TestRunsPageShowsEachPassReportRedactedAndPagesByKeyset(t *testing.T) {
	r := newRig(t, func(c *Config) { c.PageSize = 2 })
	record := func(run store.Run) {
		t.Helper()
		if err := store.RecordRun(bg, r.db.Pool, run); err != nil {
			t.Fatal(err)
		}
	}
	start := time.Now().Add(-time.Minute)
	record(store.Run{Kind: "reconcile", Actor: "replica-1", StartedAt: start, Stats: json.RawMessage(`{"actions":{"completed":3,"backoff":1},"keys":4,"alerts_raised":1,"withheld":2,"given_back":5}`)})
	record(store.Run{Kind: "alerts", Actor: "replica-1", StartedAt: start, Stats: json.RawMessage(`{"claimed":2,"messages":1}`)})
	record(store.Run{Kind: "purge", Actor: "replica-2", StartedAt: start, Stats: json.RawMessage(`{"keys_deleted":1200,"batches":3}`)})
	record(store.Run{Kind: "reconcile", Actor: "operator:alice", StartedAt: start, Stats: json.RawMessage(`{"actions":{},"keys":0,"alerts_raised":0}`),
		Error: "lease keys: connect postgres://lk:" + cSecret + "@db/ledger: refused"})
	first := r.get(t, "bob", "/ui/runs")
	wantStatus(t, first, http.StatusOK)
	wantIn(t, first.Body, "operator:alice", "error: lease keys", "replica-2", "1200 purged", "3 batch(es)", `rel="next"`)
	wantNotIn(t, first.Body, cSecret, "replica-1")
	next := first.Body[strings.Index(first.Body, `rel="next" href="`)+len(`rel="next" href="`):]
	next = strings.ReplaceAll(next[:strings.Index(next, `"`)], "&amp;", "&")
	second := r.get(t, "bob", next)
	wantStatus(t, second, http.StatusOK)
	// The oldest reconcile pass: examined = decided + withheld + given back.
	wantIn(t, second.Body, "replica-1", "<td>11</td><td>4</td><td>5</td>", "1 backoff, 3 completed, 2 withheld, 1 alert(s) raised")
	wantNotIn(t, second.Body, "operator:alice", `rel="next"`, "claimed")
	all := r.get(t, "bob", "/ui/runs?kind=alerts")
	wantIn(t, all.Body, "2 alert(s) claimed, 1 message(s) posted")
	wantStatus(t, r.get(t, "bob", "/ui/runs?kind=nope"), http.StatusBadRequest)
}

func TestRunPagesNeedASignedInUser(t *testing.T) {
	r := newRig(t)
	for _, p := range []string{"/ui/checks", "/ui/alerts", "/ui/runs"} {
		wantStatus(t, r.get(t, "", p), http.StatusUnauthorized)
		wantStatus(t, r.get(t, "bob", p), http.StatusOK)
	}
}

func TestProbeNowRefusesAKeyWithoutAProbeOrNotInTheLedger(t *testing.T) {
	d := newTickets(t)
	r := newRig(t, withRun(t, d, 0))
	r.db.Exec(t, `INSERT INTO idempotency_keys (key, tool, request_hash, created_at, claimed_at, expires_at)
		VALUES ('k-other', 'send_invoice', 'h', now() - interval '1 hour', now() - interval '1 hour', now() + interval '1 day')`)
	noProbe := r.post(t, "bob", "/ui/key/probe", url.Values{"key": {"k-other"}})
	wantStatus(t, noProbe, http.StatusConflict)
	wantIn(t, noProbe.Body, "Tool send_invoice has no probe: nothing was asked")
	missing := r.post(t, "bob", "/ui/key/probe", url.Values{"key": {"k-nope"}})
	wantStatus(t, missing, http.StatusNotFound)
	if n := d.count(); n != 0 {
		t.Errorf("the downstream was asked %d times", n)
	}
}

func TestReconcileNowLeavesAKeyInFlightAlone(t *testing.T) {
	d := newTickets(t)
	r := newRig(t, withRun(t, d, 0))
	r.putKey(t, "k-1", ledger.StatusProcessing, time.Second) // inside its 30 s window
	d.set(func(d *tickets) { d.found["k-1"] = true })
	resp := r.post(t, "alice", "/ui/key/reconcile", url.Values{"key": {"k-1"}, "confirm": {"yes"}})
	wantStatus(t, resp, http.StatusOK)
	wantIn(t, resp.Body, "nothing decided", "in flight")
	if got := r.key(t, "k-1"); got.Status != ledger.StatusProcessing {
		t.Errorf("a key in flight was decided: %s", got.Status)
	}
	if n := r.count(t, `reconcile_audit WHERE key = 'k-1'`); n != 0 {
		t.Errorf("%d audit rows of a key in flight", n)
	}
}
