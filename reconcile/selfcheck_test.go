package reconcile_test

import (
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/ledgerkeeper/ledgerkeeper/alerts"
	"github.com/ledgerkeeper/ledgerkeeper/internal/pgtest"
	"github.com/ledgerkeeper/ledgerkeeper/ledger"
	"github.com/ledgerkeeper/ledgerkeeper/probes"
	"github.com/ledgerkeeper/ledgerkeeper/reconcile"
)

// ticketsAPI is a tickets service with a real router: GET /v1/tickets
// filters by idempotency_key, and (like many real APIs) ignores a query
// parameter it does not know and then lists every ticket. Any other path is
// the router's 404.
type ticketsAPI struct {
	srv *httptest.Server

	mu      sync.Mutex
	tickets []map[string]any // each has "id" and "idempotency_key"
	member  string           // the list's member name ("data"; "items" after the rename)
	status  int              // non-zero: answer every request with it
	hits    map[string]int   // idempotency key asked about -> requests
}

func newTicketsAPI(t *testing.T) *ticketsAPI {
	a := &ticketsAPI{member: "data", hits: map[string]int{}}
	mux := http.NewServeMux()
	mux.HandleFunc("GET /v1/tickets", func(w http.ResponseWriter, r *http.Request) {
		a.mu.Lock()
		defer a.mu.Unlock()
		q := r.URL.Query()
		a.hits[q.Get("idempotency_key")]++
		if a.status != 0 {
			w.WriteHeader(a.status)
			return
		}
		list := []map[string]any{}
		for _, tk := range a.tickets {
			if !q.Has("idempotency_key") || tk["idempotency_key"] == q.Get("idempotency_key") {
				list = append(list, tk)
			}
		}
		w.Header().Set("Content-Type", "application/json")
		_ = json.NewEncoder(w).Encode(map[string]any{a.member: list})
	})
	a.srv = httptest.NewServer(mux)
	t.Cleanup(a.srv.Close)
	return a
}

func (a *ticketsAPI) create(key, id string) {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.tickets = append(a.tickets, map[string]any{"id": id, "idempotency_key": key})
}

func (a *ticketsAPI) set(f func(a *ticketsAPI)) {
	a.mu.Lock()
	defer a.mu.Unlock()
	f(a)
}

func (a *ticketsAPI) hitsOf(key string) int {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.hits[key]
}

// probeAt builds the http probe an operator would configure, with url's
// path and query appended to the server's address.
func (a *ticketsAPI) probeAt(t *testing.T, pathAndQuery string) probes.Probe {
	t.Helper()
	return probes.Guard(ticketsProbe(t, a.srv.URL+pathAndQuery), 5*time.Second)
}

// ticketsProbe is the http probe an operator configures for a tickets API
// at url: match "data", response_code 201, ticket_id from "id".
func ticketsProbe(t *testing.T, url string) probes.Probe {
	t.Helper()
	p, err := probes.NewHTTP(probes.HTTPConfig{
		URL:          url,
		Match:        "data",
		ResponseCode: 201,
		ResponseBody: map[string]string{"ticket_id": "id"},
		Timeout:      5 * time.Second,
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = p.Close() })
	return p
}

const goodProbePath = "/v1/tickets?idempotency_key={key}"

// toolServerCompletes does what a tool server does: claim, create the
// ticket downstream, store the response.
func toolServerCompletes(t *testing.T, db *pgtest.DB, api *ticketsAPI, key, ticket string) {
	t.Helper()
	completeAsToolServer(t, db, key, ticket, `{"title":"printer on fire"}`, api.create)
}

// completeAsToolServer claims key of create_ticket with request, creates
// the ticket downstream (create) and stores the tool's response, as a tool
// server does: a key completed by its original attempt.
func completeAsToolServer(t *testing.T, db *pgtest.DB, key, ticket, request string, create func(key, id string)) {
	t.Helper()
	pool := newPool(t, db.URL, 1)
	res, err := ledger.Claim(bg, pool, ledger.ClaimParams{Key: key, Tool: "create_ticket", RequestHash: strings.Repeat("a", 64),
		RequestBody: json.RawMessage(request)})
	if err != nil || res.Outcome != ledger.New {
		t.Fatalf("claim %s: %v %v", key, res.Outcome, err)
	}
	create(key, ticket)
	if err := ledger.Complete(bg, pool, key, res.Row.ClaimedAt, 201, json.RawMessage(fmt.Sprintf(`{"ticket_id":%q}`, ticket))); err != nil {
		t.Fatal(err)
	}
}

func checkedEngine(t *testing.T, db *pgtest.DB, probe probes.Probe, fingerprint string) *reconcile.Engine {
	t.Helper()
	return reconcile.New(reconcile.Config{Actor: "test-replica", BackoffBase: time.Hour,
		Tools: map[string]reconcile.Policy{"create_ticket": {ProcessingWindow: time.Second, Probe: probe, ProbeFingerprint: fingerprint}},
	}, newPool(t, db.URL, 4), nil, nil)
}

func alertsOf(t *testing.T, db *pgtest.DB, reason alerts.Reason, kind string) int {
	t.Helper()
	return db.Count(t, `alert_outbox WHERE reason = $1 AND kind = $2`, string(reason), kind)
}

// The four configuration faults a user makes on day one, end to end: a real
// tickets API with a router, keys completed by the tool server, and a stuck
// key. Each broken probe would resolve the stuck key wrongly; the
// self-check catches it first, so nothing changes and on-call is told once.
func TestSelfCheckCatchesDayOneProbeFaults(t *testing.T) {
	t.Parallel()
	cases := []struct {
		name string
		// path is the probe's URL after the host; prepare changes the API.
		path    string
		prepare func(a *ticketsAPI)
		// stuckHappened: the stuck key's ticket exists downstream.
		stuckHappened bool
		samples       int
	}{
		{name: "renamed field", path: goodProbePath, prepare: func(a *ticketsAPI) { a.member = "items" }, stuckHappened: true, samples: 3},
		{name: "typo in path", path: "/v1/ticket?idempotency_key={key}", stuckHappened: true, samples: 3},
		// Misspelt filter: the API ignores it and lists every ticket; in a
		// quiet hour that is one, so every key looks found.
		{name: "filter ignored", path: "/v1/tickets?idempotency-key={key}", stuckHappened: false, samples: 1},
		{name: "wrong member in match", path: goodProbePath, prepare: func(a *ticketsAPI) { a.member = "results" }, stuckHappened: true, samples: 2},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			db := pgtest.New(t)
			api := newTicketsAPI(t)
			for i := range tc.samples {
				toolServerCompletes(t, db, api, fmt.Sprintf("wf-%d:step-1", i), fmt.Sprintf("T-%d", i))
			}
			stuck(t, db, "create_ticket", time.Minute, "wf-stuck:step-1")
			if tc.stuckHappened {
				api.create("wf-stuck:step-1", "T-stuck")
			}
			if tc.prepare != nil {
				api.set(tc.prepare)
			}
			e := checkedEngine(t, db, api.probeAt(t, tc.path), "broken")

			for pass := 1; pass <= 2; pass++ {
				rep := run(t, e, reconcile.Options{})
				if len(rep.Keys) != 0 {
					t.Fatalf("pass %d decided %+v with an untrusted probe", pass, rep.Keys)
				}
				if len(rep.Tools) != 1 || !rep.Tools[0].Untrusted || rep.Tools[0].SelfCheck == nil ||
					rep.Tools[0].SelfCheck.Outcome != reconcile.CheckUntrusted {
					t.Fatalf("pass %d: tool report %+v, want untrusted", pass, rep.Tools)
				}
			}
			if k := row(t, db, "wf-stuck:step-1"); k.Status != ledger.StatusProcessing {
				t.Fatalf("stuck key is %s, want processing", k.Status)
			}
			if n := db.Count(t, `reconcile_audit WHERE key = 'wf-stuck:step-1'`); n != 0 {
				t.Fatalf("%d audit rows for the stuck key, want 0", n)
			}
			if n := db.Count(t, `reconcile_state WHERE key = 'wf-stuck:step-1' AND attempts > 0`); n != 0 {
				t.Fatal("the stuck key's attempts were counted")
			}
			if api.hitsOf("wf-stuck:step-1") != 0 && tc.path == goodProbePath {
				t.Fatal("the stuck key was probed with an untrusted probe")
			}
			if n := alertsOf(t, db, alerts.ReasonProbeUntrusted, "firing"); n != 1 {
				t.Fatalf("%d probe_untrusted alerts after two passes, want exactly 1", n)
			}
			var details string
			if err := db.Pool.QueryRow(bg, `SELECT details::text FROM alert_outbox WHERE reason = 'probe_untrusted'`).Scan(&details); err != nil {
				t.Fatal(err)
			}
			if !strings.Contains(details, "wf-0:step-1") && !strings.Contains(details, reconcile.SelfCheckKeyPrefix) {
				t.Fatalf("the alert names no sample: %s", details)
			}
			if n := db.Count(t, `probe_self_checks WHERE tool = 'create_ticket' AND outcome = 'untrusted'`); n != 1 {
				t.Fatal("the failed check was not recorded")
			}

			// Fixed: the probe as it should be, a new configuration. The
			// check passes, the key is decided right, the alert resolves.
			api.set(func(a *ticketsAPI) { a.member = "data" })
			fixed := checkedEngine(t, db, api.probeAt(t, goodProbePath), "fixed")
			rep := run(t, fixed, reconcile.Options{})
			want := ledger.StatusFailedRetryable
			if tc.stuckHappened {
				want = ledger.StatusCompleted
			}
			if k := row(t, db, "wf-stuck:step-1"); k.Status != want {
				t.Fatalf("after the fix the stuck key is %s, want %s (report %+v)", k.Status, want, rep)
			}
			if n := alertsOf(t, db, alerts.ReasonProbeUntrusted, "resolved"); n != 1 {
				t.Fatalf("%d resolved notices for probe_untrusted, want 1", n)
			}
		})
	}
}

// A stored trusted check vouches for no later pass, whichever replica made
// it: every pass checks the probe again before its first probe (the
// opener) and after its last answer (the closer), one pair per batch.
func TestStoredCheckNeverVouchesForALaterPass(t *testing.T) {
	t.Parallel()
	db := pgtest.New(t)
	api := newTicketsAPI(t)
	toolServerCompletes(t, db, api, "wf-1:step-1", "T-1")
	// Three stuck keys, one per pass; none of their effects happened.
	stuck(t, db, "create_ticket", time.Minute, "s1", "s2", "s3")
	probe := api.probeAt(t, goodProbePath)

	run(t, checkedEngine(t, db, probe, "v1"), reconcile.Options{Limit: 1})
	if api.hitsOf("wf-1:step-1") != 2 {
		t.Fatalf("sample probed %d times by the first pass, want 2 (opener and closer)", api.hitsOf("wf-1:step-1"))
	}
	rep := run(t, checkedEngine(t, db, probe, "v1"), reconcile.Options{Limit: 1})
	if api.hitsOf("wf-1:step-1") != 4 {
		t.Fatalf("sample probed %d times after the second pass, want 4: a stored check vouched for a later pass", api.hitsOf("wf-1:step-1"))
	}
	if sc := rep.Tools[0].SelfCheck; sc == nil || sc.Cached || !sc.Trusted() {
		t.Fatalf("second pass self-check = %+v, want a fresh trusted one", sc)
	}
	if n := db.Count(t, `idempotency_keys WHERE status = 'failed_retryable'`); n != 2 {
		t.Fatalf("%d keys marked retryable after two passes of one key, want 2", n)
	}
}

// One record deleted downstream since is a disagreement about that key,
// not a broken probe: reported and counted, the tool keeps working.
func TestSelfCheckDisagreementDoesNotBlock(t *testing.T) {
	t.Parallel()
	db := pgtest.New(t)
	api := newTicketsAPI(t)
	for i := range 3 {
		toolServerCompletes(t, db, api, fmt.Sprintf("wf-%d:step-1", i), fmt.Sprintf("T-%d", i))
	}
	api.set(func(a *ticketsAPI) { a.tickets = a.tickets[1:] }) // wf-0's ticket deleted downstream
	stuck(t, db, "create_ticket", time.Minute, "wf-stuck:step-1")
	api.create("wf-stuck:step-1", "T-stuck")

	rep := run(t, checkedEngine(t, db, api.probeAt(t, goodProbePath), "v1"), reconcile.Options{})
	sc := rep.Tools[0].SelfCheck
	if sc == nil || !sc.Trusted() || sc.Disagreements != 1 {
		t.Fatalf("self-check = %+v, want trusted with 1 disagreement", sc)
	}
	if k := row(t, db, "wf-stuck:step-1"); k.Status != ledger.StatusCompleted {
		t.Fatalf("stuck key is %s, want completed", k.Status)
	}
	// Recorded by the opener and again by the closer (the column adds up).
	if n := db.Count(t, `probe_self_checks WHERE disagreements = 2`); n != 1 {
		t.Fatal("the disagreement was not recorded by both checks of the batch")
	}
	if n := alertsOf(t, db, alerts.ReasonProbeUntrusted, "firing"); n != 0 {
		t.Fatal("one disagreement raised probe_untrusted")
	}
}

// A found whose mapped values differ from what the tool server stored is a
// failed sample: a probe matching the wrong record is broken.
func TestSelfCheckComparesStoredValues(t *testing.T) {
	t.Parallel()
	db := pgtest.New(t)
	api := newTicketsAPI(t)
	toolServerCompletes(t, db, api, "wf-1:step-1", "T-1")
	api.set(func(a *ticketsAPI) { a.tickets[0]["id"] = "T-other" })
	e := checkedEngine(t, db, api.probeAt(t, goodProbePath), "v1")
	r, err := e.SelfCheck(bg, "create_ticket")
	if err != nil {
		t.Fatal(err)
	}
	if r.Outcome != reconcile.CheckUntrusted || len(r.Samples) != 1 || len(r.Samples[0].Mismatched) != 1 || r.Samples[0].Mismatched[0] != "ticket_id" {
		t.Fatalf("check = %+v, want untrusted on ticket_id", r)
	}
	if n := db.Count(t, `probe_self_checks`); n != 0 {
		t.Fatal("Engine.SelfCheck wrote its result")
	}
}

// No key completed by the tool server yet: the absent side alone decides,
// and the result says the present side is unverified. Keys the reconciler
// completed are never samples (their outcome came from the probe itself).
func TestSelfCheckPresentSideUnverified(t *testing.T) {
	t.Parallel()
	db := pgtest.New(t)
	api := newTicketsAPI(t)
	stuck(t, db, "create_ticket", time.Minute, "wf-stuck:step-1")
	api.create("wf-stuck:step-1", "T-stuck")
	e := checkedEngine(t, db, api.probeAt(t, goodProbePath), "v1")
	rep := run(t, e, reconcile.Options{})
	sc := rep.Tools[0].SelfCheck
	if sc == nil || !sc.Trusted() || !sc.PresentUnverified || !strings.Contains(sc.Summary, "present side unverified") {
		t.Fatalf("self-check = %+v, want trusted, present side unverified", sc)
	}
	if k := row(t, db, "wf-stuck:step-1"); k.Status != ledger.StatusCompleted {
		t.Fatalf("stuck key is %s, want completed", k.Status)
	}
	r, err := e.SelfCheck(bg, "create_ticket")
	if err != nil {
		t.Fatal(err)
	}
	if len(r.Samples) != 0 {
		t.Fatalf("a key completed by the reconciler was drawn as a sample: %+v", r.Samples)
	}
}

// A downstream that does not answer can vouch for nothing: the check is
// inconclusive, nothing changes, no probe_untrusted alert (it is not the
// probe's fault), and the failures count towards the breaker.
func TestSelfCheckInconclusiveWhenDownstreamDown(t *testing.T) {
	t.Parallel()
	db := pgtest.New(t)
	api := newTicketsAPI(t)
	toolServerCompletes(t, db, api, "wf-1:step-1", "T-1")
	stuck(t, db, "create_ticket", time.Minute, "wf-stuck:step-1")
	api.set(func(a *ticketsAPI) { a.status = http.StatusServiceUnavailable })
	rep := run(t, checkedEngine(t, db, api.probeAt(t, goodProbePath), "v1"), reconcile.Options{})
	if sc := rep.Tools[0].SelfCheck; sc == nil || sc.Outcome != reconcile.CheckInconclusive {
		t.Fatalf("self-check = %+v, want inconclusive", rep.Tools[0].SelfCheck)
	}
	if len(rep.Keys) != 0 || row(t, db, "wf-stuck:step-1").Status != ledger.StatusProcessing {
		t.Fatal("a key was decided without a trusted probe")
	}
	if n := alertsOf(t, db, alerts.ReasonProbeUntrusted, "firing"); n != 0 {
		t.Fatal("an unreachable downstream raised probe_untrusted")
	}
	// The made-up key goes first and alone: unanswered, the samples are
	// not sent, so a dead downstream costs one request per check.
	if n := db.Count(t, `tool_breakers WHERE tool = 'create_ticket' AND consecutive_failures = 1`); n != 1 {
		t.Fatal("the check's unanswered probe was not counted by the breaker")
	}
	if n := api.hitsOf("wf-1:step-1"); n != 0 {
		t.Fatalf("the sample was probed %d times after the made-up key went unanswered", n)
	}
	if sc := rep.Tools[0].SelfCheck; sc.SamplesNotSent != 1 {
		t.Fatalf("samples_not_sent = %d, want 1", sc.SamplesNotSent)
	}
}
