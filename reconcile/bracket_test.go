package reconcile_test

import (
	"bytes"
	"context"
	"encoding/json"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/ledgerkeeper/ledgerkeeper/alerts"
	"github.com/ledgerkeeper/ledgerkeeper/internal/pgtest"
	"github.com/ledgerkeeper/ledgerkeeper/ledger"
	"github.com/ledgerkeeper/ledgerkeeper/ledger/ledgertest/testwait"
	"github.com/ledgerkeeper/ledgerkeeper/probes"
	"github.com/ledgerkeeper/ledgerkeeper/reconcile"
	"github.com/ledgerkeeper/ledgerkeeper/store"
)

// Ways the route in front of the tickets API breaks while ledgerkeeper
// runs.
const (
	routeOK = ""
	// routeHTML404: a bad route deploy sends every path to the ingress's
	// default backend, which answers 404 with its own HTML page.
	routeHTML404 = "html404"
	// routeEmpty: a blue/green switch points at an empty tickets database:
	// every lookup answers 200 with an empty list, a well-formed absence.
	routeEmpty = "empty"
)

// ingressAPI is a tickets API behind a router whose routes change while
// the reconciler runs. GET /v1/tickets?idempotency_key=K lists K's
// tickets; with ?ref= in the probe, a ticket also has to carry that ref.
// Any other path is the API's own JSON 404, as an API framework answers.
type ingressAPI struct {
	srv *httptest.Server

	mu      sync.Mutex
	tickets map[string]string // idempotency key -> ticket id
	route   string
	// flipTo replaces route when the flipAt-th request about a watched key
	// arrives (that request already sees the new route).
	flipTo  string
	flipAt  int
	watched map[string]bool
	seen    int
	hits    map[string]int
	total   int
}

func newIngressAPI(t *testing.T) *ingressAPI {
	a := &ingressAPI{tickets: map[string]string{}, hits: map[string]int{}, watched: map[string]bool{}}
	a.srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		q := r.URL.Query()
		key := q.Get("idempotency_key")
		a.mu.Lock()
		a.total++
		a.hits[key]++
		if a.watched[key] {
			a.seen++
			if a.flipAt > 0 && a.seen == a.flipAt {
				a.route = a.flipTo
			}
		}
		route, id := a.route, a.tickets[key]
		a.mu.Unlock()
		switch {
		case route == routeHTML404:
			w.Header().Set("Content-Type", "text/html")
			w.WriteHeader(http.StatusNotFound)
			_, _ = w.Write([]byte("<html><head><title>404 Not Found</title></head><body><center><h1>404 Not Found</h1></center><hr><center>nginx</center></body></html>"))
			return
		case r.URL.Path != "/v1/tickets":
			w.Header().Set("Content-Type", "application/json")
			w.WriteHeader(http.StatusNotFound)
			_, _ = w.Write([]byte(`{"error":{"code":"route_not_found"}}`))
			return
		case q.Has("ref") && q.Get("ref") == "":
			w.Header().Set("Content-Type", "application/json")
			w.WriteHeader(http.StatusBadRequest)
			_, _ = w.Write([]byte(`{"error":{"code":"ref_required"}}`))
			return
		}
		list := []map[string]any{}
		if id != "" && route != routeEmpty {
			list = append(list, map[string]any{"id": id, "idempotency_key": key})
		}
		w.Header().Set("Content-Type", "application/json")
		_ = json.NewEncoder(w).Encode(map[string]any{"data": list})
	}))
	t.Cleanup(a.srv.Close)
	return a
}

func (a *ingressAPI) create(key, id string) {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.tickets[key] = id
}

func (a *ingressAPI) set(f func(a *ingressAPI)) {
	a.mu.Lock()
	defer a.mu.Unlock()
	f(a)
}

func (a *ingressAPI) requests() int {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.total
}

func (a *ingressAPI) probeAt(t *testing.T, pathAndQuery string) probes.Probe {
	t.Helper()
	return ticketsProbe(t, a.srv.URL+pathAndQuery)
}

// completeThrough does what the tool server does for key: claim, create
// the ticket downstream, store the response.
func completeThrough(t *testing.T, db *pgtest.DB, a *ingressAPI, key, ticket string) {
	t.Helper()
	completeAsToolServer(t, db, key, ticket, `{"title":"printer on fire","ref":"R-1"}`, a.create)
}

// stuckWithTickets inserts processing keys past their window whose tickets
// exist downstream: marking any of them retryable would create a second
// ticket on the retry.
func stuckWithTickets(t *testing.T, db *pgtest.DB, a *ingressAPI, keys ...string) {
	t.Helper()
	for _, k := range keys {
		db.Exec(t, `INSERT INTO idempotency_keys (key, tool, request_hash, request_body, created_at, claimed_at, expires_at)
			VALUES ($1, 'create_ticket', 'h', '{"title":"x","ref":"R-9"}', now() - interval '1 minute', now() - interval '1 minute', now() + interval '1 day')`, k)
		a.create(k, "T-"+k)
	}
}

type bracketSetup struct {
	db     *pgtest.DB
	api    *ingressAPI
	logs   *syncBuffer
	reg    *prometheus.Registry
	engine func(pol reconcile.Policy, cfg reconcile.Config) *reconcile.Engine
}

func newBracketSetup(t *testing.T) *bracketSetup {
	t.Helper()
	s := &bracketSetup{db: pgtest.New(t), api: newIngressAPI(t), logs: &syncBuffer{}, reg: prometheus.NewRegistry()}
	metrics := reconcile.NewMetrics(s.reg)
	s.engine = func(pol reconcile.Policy, cfg reconcile.Config) *reconcile.Engine {
		pol.ProcessingWindow = time.Second
		cfg.Actor, cfg.BackoffBase = "test-replica", time.Hour
		cfg.Tools = map[string]reconcile.Policy{"create_ticket": pol}
		return reconcile.New(cfg, newPool(t, s.db.URL, 8), slog.New(slog.NewTextHandler(s.logs, nil)), metrics)
	}
	return s
}

// syncBuffer is a log sink safe for the engine's goroutines.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) count(substr string) int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return strings.Count(s.b.String(), substr)
}

// untouched fails unless every key is still processing with no attempt
// counted and no audit row: its verdict was withheld, not applied.
func untouched(t *testing.T, db *pgtest.DB, keys ...string) {
	t.Helper()
	for _, k := range keys {
		if r := row(t, db, k); r.Status != ledger.StatusProcessing {
			t.Errorf("key %s is %s, want processing", k, r.Status)
		}
		if n := db.Count(t, `reconcile_audit WHERE key = $1`, k); n != 0 {
			t.Errorf("key %s has %d audit rows: a withheld verdict was written", k, n)
		}
		if n := db.Count(t, `reconcile_state WHERE key = $1 AND (attempts > 0 OR lease_owner IS NOT NULL)`, k); n != 0 {
			t.Errorf("key %s: an attempt was counted or its lease kept", k)
		}
	}
}

// The ingress turns every path into its HTML 404 between two passes: the
// first pass's trusted check vouches for nothing after it, so the second
// pass's own check sees the change before any key is probed. Three keys
// whose tickets exist stay processing; on-call is told once.
func TestIngress404BetweenTwoPassesChangesNoKey(t *testing.T) {
	t.Parallel()
	s := newBracketSetup(t)
	completeThrough(t, s.db, s.api, "wf-1:step-1", "T-1")
	e := s.engine(reconcile.Policy{Probe: s.api.probeAt(t, goodProbePath), ProbeFingerprint: "v1"}, reconcile.Config{})
	stuckWithTickets(t, s.db, s.api, "wf-0:step-1")
	if rep := run(t, e, reconcile.Options{}); rep.Actions[reconcile.ActionCompleted] != 1 {
		t.Fatalf("first pass: %v, want the one stuck key completed", rep.Actions)
	}

	s.api.set(func(a *ingressAPI) { a.route = routeHTML404 })
	stuckWithTickets(t, s.db, s.api, "wf-2:step-1", "wf-3:step-1", "wf-4:step-1")
	rep := run(t, e, reconcile.Options{})
	untouched(t, s.db, "wf-2:step-1", "wf-3:step-1", "wf-4:step-1")
	if rep.Tools[0].SelfCheck == nil || rep.Tools[0].SelfCheck.Trusted() {
		t.Fatalf("second pass self-check = %+v, want a fresh one, not trusted", rep.Tools[0].SelfCheck)
	}
	if n := alertsOf(t, s.db, alerts.ReasonProbeUntrusted, "firing"); n != 1 {
		t.Fatalf("%d probe_untrusted alerts, want 1", n)
	}
	run(t, e, reconcile.Options{})
	if n := alertsOf(t, s.db, alerts.ReasonProbeUntrusted, "firing"); n != 1 {
		t.Fatalf("%d probe_untrusted alerts after another pass, want still 1", n)
	}

	s.api.set(func(a *ingressAPI) { a.route = routeOK }) // the route is fixed
	run(t, e, reconcile.Options{})
	for _, k := range []string{"wf-2:step-1", "wf-3:step-1", "wf-4:step-1"} {
		if r := row(t, s.db, k); r.Status != ledger.StatusCompleted {
			t.Fatalf("after the fix %s is %s, want completed (its ticket exists)", k, r.Status)
		}
	}
	if n := alertsOf(t, s.db, alerts.ReasonProbeUntrusted, "resolved"); n != 1 {
		t.Fatalf("%d resolved probe_untrusted notices, want 1", n)
	}
}

// The route breaks in the middle of a batch, after the check that opened
// it: the answers that came after the change are wrong, and so may be the
// ones before (nobody can tell which). The check after the batch's last
// answer fails, so no verdict of the batch is written: every key stays
// processing with no attempt counted, and the alert says what changed
// between the two checks.
func TestRouteBreaksMidBatchWithholdsTheWholeBatch(t *testing.T) {
	t.Parallel()
	for _, route := range []string{routeHTML404, routeEmpty} {
		t.Run(route, func(t *testing.T) {
			t.Parallel()
			s := newBracketSetup(t)
			completeThrough(t, s.db, s.api, "wf-1:step-1", "T-1")
			keys := []string{"k1", "k2", "k3", "k4", "k5", "k6"}
			stuckWithTickets(t, s.db, s.api, keys...)
			s.api.set(func(a *ingressAPI) {
				for _, k := range keys {
					a.watched[k] = true
				}
				a.flipAt, a.flipTo = 3, route
			})
			e := s.engine(reconcile.Policy{Probe: s.api.probeAt(t, goodProbePath), ProbeFingerprint: "v1", Concurrency: 2}, reconcile.Config{})
			rep := run(t, e, reconcile.Options{})
			untouched(t, s.db, keys...)
			if rep.Withheld != len(keys) || rep.Actions[reconcile.ActionWithheldUntrusted] != len(keys) {
				t.Fatalf("report: withheld %d, actions %v; want all %d keys withheld_untrusted", rep.Withheld, rep.Actions, len(keys))
			}
			if n := s.db.Count(t, `alert_outbox WHERE reason = 'probe_untrusted' AND details->>'note' LIKE '%what changed%'`); n != 1 {
				t.Fatalf("%d probe_untrusted alerts saying what changed between the checks, want 1", n)
			}
		})
	}
}

// The route is broken when the pass starts and fixed while its keys are
// probed: the answers before the fix said "absent" for tickets that exist.
// Only a check before the batch's first probe sees that, so it is run
// fresh for every pass, never taken from an earlier pass's record: the
// check after the batch would pass.
func TestRouteBrokenBeforeTheBatchIsCaughtByItsOpener(t *testing.T) {
	t.Parallel()
	s := newBracketSetup(t)
	completeThrough(t, s.db, s.api, "wf-1:step-1", "T-1")
	pol := reconcile.Policy{Probe: s.api.probeAt(t, goodProbePath), ProbeFingerprint: "v1", Concurrency: 1}
	stuckWithTickets(t, s.db, s.api, "wf-0:step-1")
	run(t, s.engine(pol, reconcile.Config{}), reconcile.Options{}) // a trusted check on record

	keys := []string{"k1", "k2", "k3"}
	stuckWithTickets(t, s.db, s.api, keys...)
	s.api.set(func(a *ingressAPI) {
		a.route = routeEmpty
		for _, k := range keys {
			a.watched[k] = true
		}
		a.flipAt, a.flipTo = len(keys), routeOK
	})
	run(t, s.engine(pol, reconcile.Config{}), reconcile.Options{})
	if n := s.db.Count(t, `idempotency_keys WHERE status = 'failed_retryable'`); n != 0 {
		t.Fatalf("%d keys whose tickets exist were marked retryable", n)
	}
	untouched(t, s.db, keys...)
}

// A typo'd path on a tool with no completed key: the API's router answers
// its JSON 404 for everything, so the made-up key passes and nothing shows
// the probe can find anything. The not_found verdicts are held with one
// probe_unwitnessed alert. A canary then shows the probe is broken (it
// cannot find the canary), and once the path is fixed the keys are decided
// right.
func TestTypoedPathWithNoCompletedKeyIsHeldUntilWitnessed(t *testing.T) {
	t.Parallel()
	s := newBracketSetup(t)
	keys := []string{"wf-1:step-1", "wf-2:step-1"}
	stuckWithTickets(t, s.db, s.api, keys...)
	typo := reconcile.Policy{Probe: s.api.probeAt(t, "/v1/tiket?idempotency_key={key}"), ProbeFingerprint: "typo"}

	for range 2 {
		rep := run(t, s.engine(typo, reconcile.Config{}), reconcile.Options{})
		untouched(t, s.db, keys...)
		if rep.Actions[reconcile.ActionWithheldUnwitnessed] != len(keys) {
			t.Fatalf("actions %v, want both keys withheld_unwitnessed", rep.Actions)
		}
	}
	if n := alertsOf(t, s.db, alerts.ReasonProbeUnwitnessed, "firing"); n != 1 {
		t.Fatalf("%d probe_unwitnessed alerts after two passes, want 1", n)
	}
	if n := s.db.Count(t, `alert_outbox WHERE reason = 'probe_unwitnessed' AND details->>'note' LIKE '%probe canary add%'`); n != 1 {
		t.Fatal("the probe_unwitnessed alert does not say how to add a canary")
	}

	// An effect known to exist downstream, declared as a canary.
	s.api.create("canary-ticket", "T-canary")
	typo.Canaries = []reconcile.Canary{{Key: "canary-ticket"}}
	run(t, s.engine(typo, reconcile.Config{}), reconcile.Options{})
	untouched(t, s.db, keys...)
	if n := alertsOf(t, s.db, alerts.ReasonProbeUntrusted, "firing"); n != 1 {
		t.Fatal("the canary did not expose the typo'd path as probe_untrusted")
	}

	fixed := reconcile.Policy{Probe: s.api.probeAt(t, goodProbePath), ProbeFingerprint: "fixed", Canaries: typo.Canaries}
	run(t, s.engine(fixed, reconcile.Config{}), reconcile.Options{})
	for _, k := range keys {
		if r := row(t, s.db, k); r.Status != ledger.StatusCompleted {
			t.Fatalf("%s is %s after the fix, want completed (its ticket exists)", k, r.Status)
		}
	}
	if n := alertsOf(t, s.db, alerts.ReasonProbeUnwitnessed, "resolved"); n != 1 {
		t.Fatal("probe_unwitnessed was not resolved once a sample came back found")
	}
}

// A healthy probe with no completed key holds a not_found until a canary
// witnesses presence, then decides it.
func TestNotFoundIsBelievedOnceACanaryIsFound(t *testing.T) {
	t.Parallel()
	s := newBracketSetup(t)
	s.db.Exec(t, `INSERT INTO idempotency_keys (key, tool, request_hash, request_body, created_at, claimed_at, expires_at)
		VALUES ('never-happened', 'create_ticket', 'h', '{"title":"x"}', now() - interval '1 minute', now() - interval '1 minute', now() + interval '1 day')`)
	pol := reconcile.Policy{Probe: s.api.probeAt(t, goodProbePath), ProbeFingerprint: "v1"}
	run(t, s.engine(pol, reconcile.Config{}), reconcile.Options{})
	untouched(t, s.db, "never-happened")

	s.api.create("canary-ticket", "T-canary")
	pol.Canaries = []reconcile.Canary{{Key: "canary-ticket"}}
	rep := run(t, s.engine(pol, reconcile.Config{}), reconcile.Options{})
	if r := row(t, s.db, "never-happened"); r.Status != ledger.StatusFailedRetryable {
		t.Fatalf("key is %s with a canary found, want failed_retryable (report %v)", r.Status, rep.Actions)
	}
	if sc := rep.Tools[0].SelfCheck; sc == nil || sc.PresentUnverified || sc.Samples[0].Source != reconcile.SourceCanary {
		t.Fatalf("self-check = %+v, want the canary found", sc)
	}
}

// The tool's newest completed key at any age witnesses presence when none
// is recent; when its effect is gone downstream (the downstream's own
// retention), that is no failure of the probe.
func TestOldCompletedKeyWitnessesButNeverFails(t *testing.T) {
	t.Parallel()
	s := newBracketSetup(t)
	completeThrough(t, s.db, s.api, "old:step-1", "T-old")
	s.db.Exec(t, `UPDATE idempotency_keys SET created_at = now() - interval '30 days', updated_at = now() - interval '30 days'`)
	s.db.Exec(t, `INSERT INTO idempotency_keys (key, tool, request_hash, request_body, created_at, claimed_at, expires_at)
		VALUES ('never-happened', 'create_ticket', 'h', '{"title":"x"}', now() - interval '1 minute', now() - interval '1 minute', now() + interval '1 day')`)
	pol := reconcile.Policy{Probe: s.api.probeAt(t, goodProbePath), ProbeFingerprint: "v1"}
	rep := run(t, s.engine(pol, reconcile.Config{}), reconcile.Options{})
	if r := row(t, s.db, "never-happened"); r.Status != ledger.StatusFailedRetryable {
		t.Fatalf("key is %s, want failed_retryable witnessed by the old key (report %+v)", r.Status, rep.Tools[0].SelfCheck)
	}

	s.api.set(func(a *ingressAPI) { delete(a.tickets, "old:step-1") })
	s.db.Exec(t, `INSERT INTO idempotency_keys (key, tool, request_hash, request_body, created_at, claimed_at, expires_at)
		VALUES ('never-happened-2', 'create_ticket', 'h', '{"title":"x"}', now() - interval '1 minute', now() - interval '1 minute', now() + interval '1 day')`)
	rep = run(t, s.engine(pol, reconcile.Config{}), reconcile.Options{})
	if sc := rep.Tools[0].SelfCheck; sc == nil || !sc.Trusted() || !sc.PresentUnverified {
		t.Fatalf("self-check = %+v, want trusted, present side unverified", sc)
	}
	untouched(t, s.db, "never-happened-2")
	if n := alertsOf(t, s.db, alerts.ReasonProbeUntrusted, "firing"); n != 0 {
		t.Fatal("an old key gone downstream made the probe untrusted")
	}
}

// A probe that reads a request field ({request.ref}) on a tool with no
// completed key: the made-up key is shaped like the due key's request, so
// the probe renders and the absent side answers; the key whose ticket
// exists is decided, and no false probe_untrusted is raised.
func TestTemplatedRequestFieldWithNoCompletedKeyIsDecided(t *testing.T) {
	t.Parallel()
	s := newBracketSetup(t)
	stuckWithTickets(t, s.db, s.api, "wf-1:step-1")
	pol := reconcile.Policy{Probe: s.api.probeAt(t, "/v1/tickets?idempotency_key={key}&ref={request.ref}"), ProbeFingerprint: "v1"}
	rep := run(t, s.engine(pol, reconcile.Config{}), reconcile.Options{})
	if r := row(t, s.db, "wf-1:step-1"); r.Status != ledger.StatusCompleted {
		t.Fatalf("key is %s, want completed (self-check %+v)", r.Status, rep.Tools[0].SelfCheck)
	}
	if n := s.db.Count(t, `alert_outbox WHERE reason IN ('probe_untrusted', 'probe_unwitnessed')`); n != 0 {
		t.Fatalf("%d false alerts for a healthy templated probe", n)
	}
	// A canary with its request: not_found verdicts are believed too.
	s.api.create("canary-ticket", "T-canary")
	pol.Canaries = []reconcile.Canary{{Key: "canary-ticket", Request: json.RawMessage(`{"ref":"R-7"}`)}}
	s.db.Exec(t, `INSERT INTO idempotency_keys (key, tool, request_hash, request_body, created_at, claimed_at, expires_at)
		VALUES ('never-happened', 'create_ticket', 'h', '{"title":"x","ref":"R-8"}', now() - interval '1 minute', now() - interval '1 minute', now() + interval '1 day')`)
	run(t, s.engine(pol, reconcile.Config{}), reconcile.Options{})
	if r := row(t, s.db, "never-happened"); r.Status != ledger.StatusFailedRetryable {
		t.Fatalf("key is %s, want failed_retryable", r.Status)
	}
}

// A downstream that answers 503 to everything: the self-check's unanswered
// made-up key is counted before any key is probed, so with breaker.failures
// 5 the downstream sees at most 5 requests before the breaker opens, and
// one per half-open trial after; each opening is logged, counted and
// alerted once.
func TestDeadDownstreamOpensTheBreakerWithinItsThreshold(t *testing.T) {
	t.Parallel()
	s := newBracketSetup(t)
	completeThrough(t, s.db, s.api, "wf-1:step-1", "T-1")
	stuckWithTickets(t, s.db, s.api, "s1", "s2", "s3")
	p := probeOf(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		s.api.mu.Lock()
		s.api.total++
		s.api.hits[r.URL.Query().Get("idempotency_key")]++
		s.api.mu.Unlock()
		w.WriteHeader(http.StatusServiceUnavailable)
	}))
	e := s.engine(reconcile.Policy{Probe: p, ProbeFingerprint: "v1"},
		// The cooldown must outlast the "open: nothing sent" pass below even
		// on a loaded machine (200 ms did not, on Citus in CI).
		reconcile.Config{Breaker: reconcile.BreakerConfig{Failures: 5, Cooldown: 3 * time.Second, MaxCooldown: 3 * time.Second}})
	passes := 0
	for s.db.Count(t, `tool_breakers WHERE opens > 0`) == 0 {
		if passes++; passes > 6 {
			t.Fatal("the breaker did not open in 6 passes")
		}
		run(t, e, reconcile.Options{})
	}
	if n := s.api.requests(); n > 5 {
		t.Fatalf("the downstream saw %d requests before the breaker opened, want at most 5", n)
	}
	s.api.mu.Lock()
	keyHits := s.api.hits["s1"] + s.api.hits["s2"] + s.api.hits["s3"]
	s.api.mu.Unlock()
	if keyHits != 0 {
		t.Fatalf("stuck keys were probed %d times after the self-check went unanswered", keyHits)
	}
	untouched(t, s.db, "s1", "s2", "s3")
	run(t, e, reconcile.Options{}) // open: nothing sent
	before := s.api.requests()
	if before > 5 {
		t.Fatalf("a pass probed while the breaker was open (%d requests)", before)
	}
	testwait.Eventually(t, func() bool {
		return s.db.Count(t, `tool_breakers WHERE open_until <= now()`) == 1
	}, 10*time.Second, "the breaker's cooldown to pass")
	run(t, e, reconcile.Options{}) // half-open: one trial
	if n := s.api.requests() - before; n != 1 {
		t.Fatalf("the half-open trial sent %d requests, want 1", n)
	}
	if n := s.db.Count(t, `tool_breakers WHERE opens = 2`); n != 1 {
		t.Fatal("the failed trial did not re-open the breaker")
	}
	if n := s.logs.count("circuit breaker opened"); n != 2 {
		t.Fatalf("%d 'circuit breaker opened' log lines for 2 openings", n)
	}
	if n := series(t, s.reg, "ledgerkeeper_reconcile_breaker_opens_total", "create_ticket"); n != 2 {
		t.Fatalf("breaker_opens_total = %v for 2 openings", n)
	}
	if n := alertsOf(t, s.db, alerts.ReasonDownstreamUnreachable, "firing"); n != 1 {
		t.Fatalf("%d downstream_unreachable alerts for one outage, want 1", n)
	}
}

// Sixteen keys of a tool whose self-check is off, one pass, every probe
// unanswered: the breaker opens in one writer group's transaction, and
// that opening is logged, counted and alerted once however many keys the
// group held.
func TestBreakerOpeningIsReportedOncePerOpening(t *testing.T) {
	t.Parallel()
	s := newBracketSetup(t)
	keys := make([]string, 16)
	for i := range keys {
		keys[i] = "k" + string(rune('a'+i))
	}
	stuckWithTickets(t, s.db, s.api, keys...)
	p := probeOf(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.WriteHeader(http.StatusServiceUnavailable)
	}))
	e := s.engine(reconcile.Policy{Probe: p, SelfCheckDisabled: true, Concurrency: 16},
		reconcile.Config{Breaker: reconcile.BreakerConfig{Failures: 5}, Concurrency: 16})
	rep := run(t, e, reconcile.Options{})
	if n := s.db.Count(t, `tool_breakers WHERE opens = 1`); n != 1 {
		t.Fatal("the breaker did not open")
	}
	if n := s.logs.count("circuit breaker opened"); n != 1 {
		t.Fatalf("%d 'circuit breaker opened' log lines for one opening", n)
	}
	if n := series(t, s.reg, "ledgerkeeper_reconcile_breaker_opens_total", "create_ticket"); n != 1 {
		t.Fatalf("breaker_opens_total = %v for one opening", n)
	}
	outbox := alertsOf(t, s.db, alerts.ReasonDownstreamUnreachable, "firing")
	if outbox != 1 {
		t.Fatalf("%d downstream_unreachable outbox rows, want 1", outbox)
	}
	unreachable := 0
	for _, k := range rep.Keys {
		for _, a := range k.Alerts {
			if a == string(alerts.ReasonDownstreamUnreachable) {
				unreachable++
			}
		}
	}
	if unreachable != 1 {
		t.Fatalf("the report lists downstream_unreachable on %d keys, want 1 (alerts_raised %d)", unreachable, rep.AlertsRaised)
	}
}

// resolved_alerts counts every alert the pass resolved: here the
// probe_untrusted of a probe fixed since, and the key alerts of keys it
// decided.
func TestResolvedAlertsCountsEveryResolution(t *testing.T) {
	t.Parallel()
	s := newBracketSetup(t)
	completeThrough(t, s.db, s.api, "wf-1:step-1", "T-1")
	stuckWithTickets(t, s.db, s.api, "s1")
	s.api.set(func(a *ingressAPI) { a.route = routeEmpty })
	pol := reconcile.Policy{Probe: s.api.probeAt(t, goodProbePath), ProbeFingerprint: "v1"}
	run(t, s.engine(pol, reconcile.Config{}), reconcile.Options{})
	if n := alertsOf(t, s.db, alerts.ReasonProbeUntrusted, "firing"); n != 1 {
		t.Fatal("no probe_untrusted to resolve")
	}
	s.api.set(func(a *ingressAPI) { a.route = routeOK })
	rep := run(t, s.engine(pol, reconcile.Config{}), reconcile.Options{})
	if rep.ResolvedAlerts != 1 {
		t.Fatalf("resolved_alerts = %d, want 1 (the probe_untrusted)", rep.ResolvedAlerts)
	}
}

// A canary an operator marked (store.AddCanary, as `probe canary add`
// does) witnesses presence like a declared one.
func TestMarkedCanaryWitnessesPresence(t *testing.T) {
	t.Parallel()
	s := newBracketSetup(t)
	s.db.Exec(t, `INSERT INTO idempotency_keys (key, tool, request_hash, request_body, created_at, claimed_at, expires_at)
		VALUES ('never-happened', 'create_ticket', 'h', '{"title":"x"}', now() - interval '1 minute', now() - interval '1 minute', now() + interval '1 day')`)
	s.api.create("kept-ticket", "T-kept")
	if _, err := store.AddCanary(bg, s.db.Pool, store.Canary{Tool: "create_ticket", Key: "kept-ticket", Reason: "kept for the self-check", Actor: "alice"}); err != nil {
		t.Fatal(err)
	}
	rep := run(t, s.engine(reconcile.Policy{Probe: s.api.probeAt(t, goodProbePath), ProbeFingerprint: "v1"}, reconcile.Config{}), reconcile.Options{})
	if r := row(t, s.db, "never-happened"); r.Status != ledger.StatusFailedRetryable {
		t.Fatalf("key is %s, want failed_retryable witnessed by the marked canary (%+v)", r.Status, rep.Tools[0].SelfCheck)
	}
}

// A probe that cannot be built for the made-up key (it reads a request
// field and the due key has no request body to shape it on) asked the
// downstream nothing: the check is inconclusive with the reason, never
// untrusted, and no false probe_untrusted is raised.
func TestUnrenderableMadeUpKeyIsInconclusive(t *testing.T) {
	t.Parallel()
	s := newBracketSetup(t)
	s.db.Exec(t, `INSERT INTO idempotency_keys (key, tool, request_hash, created_at, claimed_at, expires_at)
		VALUES ('no-body', 'create_ticket', 'h', now() - interval '1 minute', now() - interval '1 minute', now() + interval '1 day')`)
	pol := reconcile.Policy{Probe: s.api.probeAt(t, "/v1/tickets?idempotency_key={key}&ref={request.ref}"), ProbeFingerprint: "v1"}
	rep := run(t, s.engine(pol, reconcile.Config{}), reconcile.Options{})
	sc := rep.Tools[0].SelfCheck
	if sc == nil || sc.Outcome != reconcile.CheckInconclusive || !sc.Absent.NotRendered || !strings.Contains(sc.Summary, "could not be rendered") {
		t.Fatalf("self-check = %+v, want inconclusive: not rendered", sc)
	}
	if n := s.db.Count(t, `alert_outbox WHERE reason = 'probe_untrusted'`); n != 0 {
		t.Fatal("an unrenderable made-up key raised probe_untrusted")
	}
	if n := s.db.Count(t, `tool_breakers WHERE consecutive_failures > 0`); n != 0 {
		t.Fatal("a probe never sent was counted by the breaker")
	}
	untouched(t, s.db, "no-body")
	if n := s.api.requests(); n != 0 {
		t.Fatalf("the downstream got %d requests", n)
	}
}

// A tool with keys in flight and none due is checked once per
// self_check.interval: its check vouches for nothing, but `status` stays
// current and a broken probe is reported before its keys come due.
func TestToolWithNothingDueIsCheckedOncePerInterval(t *testing.T) {
	t.Parallel()
	s := newBracketSetup(t)
	completeThrough(t, s.db, s.api, "wf-1:step-1", "T-1")
	s.db.Exec(t, `INSERT INTO idempotency_keys (key, tool, request_hash, expires_at) VALUES ('in-flight', 'create_ticket', 'h', now() + interval '1 day')`)
	pol := reconcile.Policy{Probe: s.api.probeAt(t, goodProbePath), ProbeFingerprint: "v1"}
	e := s.engine(pol, reconcile.Config{SelfCheck: reconcile.SelfCheckConfig{Interval: time.Hour}})
	run(t, e, reconcile.Options{})
	if n := s.db.Count(t, `probe_self_checks WHERE outcome = 'trusted'`); n != 1 {
		t.Fatal("a tool with nothing due and no stored check was not checked")
	}
	before := s.api.requests()
	run(t, e, reconcile.Options{})
	if n := s.api.requests() - before; n != 0 {
		t.Fatalf("a check younger than self_check.interval was repeated (%d requests)", n)
	}
	untouched(t, s.db, "in-flight")

	s.api.set(func(a *ingressAPI) { a.route = routeHTML404 })
	run(t, s.engine(pol, reconcile.Config{SelfCheck: reconcile.SelfCheckConfig{Interval: time.Nanosecond}}), reconcile.Options{})
	if n := alertsOf(t, s.db, alerts.ReasonProbeUntrusted, "firing"); n != 1 {
		t.Fatal("a broken probe of a tool with nothing due was not reported once its check was older than the interval")
	}
	untouched(t, s.db, "in-flight")
}

// The downstream asks to wait (429, Retry-After: 1) when the closing check
// probes it: the batch's answers wait under their leases, the pause is
// waited out, the closer runs again and the batch is written, in the same
// pass, with no attempt counted for the pause.
func TestPauseDuringTheClosingCheckIsWaitedOut(t *testing.T) {
	t.Parallel()
	db := pgtest.New(t)
	api := newPoliteAPI(t, 0, 0)
	madeUp := 0
	api.throttle = func(_ int, key string) string { // called under the API's lock
		if strings.HasPrefix(key, reconcile.SelfCheckKeyPrefix) {
			if madeUp++; madeUp == 2 {
				return "1"
			}
		}
		return ""
	}
	stuckMany(t, db, "tickets", 3)
	e, _ := politeEngine(t, db, reconcile.Config{Tools: map[string]reconcile.Policy{
		"tickets": {Probe: api.probe(t), WitnessNotRequired: true},
	}})
	rep := run(t, e, reconcile.Options{})
	if rep.Decided != 3 || rep.Withheld != 0 {
		t.Fatalf("decided %d, withheld %d (%v); want the batch written after the pause", rep.Decided, rep.Withheld, rep.Actions)
	}
	if n := db.Count(t, `reconcile_state WHERE attempts > 1`); n != 0 {
		t.Fatal("the pause counted an attempt")
	}
}

// The only witness is the tool's newest completed key, which the opener
// does not find and the closer does: the batch's not_found is held (both
// checks of its bracket must see a witness) and on-call is told, though
// the closer alone saw one.
func TestNotFoundNeedsAWitnessInTheOpenerToo(t *testing.T) {
	t.Parallel()
	s := newBracketSetup(t)
	completeThrough(t, s.db, s.api, "old:step-1", "T-old")
	s.db.Exec(t, `UPDATE idempotency_keys SET created_at = now() - interval '30 days', updated_at = now() - interval '30 days'`)
	s.db.Exec(t, `INSERT INTO idempotency_keys (key, tool, request_hash, request_body, created_at, claimed_at, expires_at)
		VALUES ('never-happened', 'create_ticket', 'h', '{"title":"x"}', now() - interval '1 minute', now() - interval '1 minute', now() + interval '1 day')`)
	// The old ticket is found again from the first probe of a stuck key on.
	s.api.set(func(a *ingressAPI) {
		delete(a.tickets, "old:step-1")
		a.watched["never-happened"] = true
	})
	var once sync.Once
	pol := reconcile.Policy{Probe: probeFunc(func(ctx context.Context, k probes.Key) probes.Result {
		if k.Key == "never-happened" {
			once.Do(func() { s.api.create("old:step-1", "T-old") })
		}
		return s.api.probeAt(t, goodProbePath).Probe(ctx, k)
	}), ProbeFingerprint: "v1"}
	rep := run(t, s.engine(pol, reconcile.Config{}), reconcile.Options{})
	untouched(t, s.db, "never-happened")
	if rep.Actions[reconcile.ActionWithheldUnwitnessed] != 1 {
		t.Fatalf("actions %v, want the not_found withheld_unwitnessed", rep.Actions)
	}
	if n := alertsOf(t, s.db, alerts.ReasonProbeUnwitnessed, "firing"); n != 1 {
		t.Fatalf("%d probe_unwitnessed alerts, want 1: a held not_found is always told", n)
	}
}

// probeFunc adapts a function to probes.Probe.
type probeFunc func(context.Context, probes.Key) probes.Result

func (f probeFunc) Probe(ctx context.Context, k probes.Key) probes.Result { return f(ctx, k) }

// A Retry-After during the closer longer than the batch's leases can be
// held through is not waited out: the batch is given back at once, so no
// other replica probes keys whose answers this one still holds, and
// nothing of it is written.
func TestPauseLongerThanTheLeasesGivesTheBatchBack(t *testing.T) {
	t.Parallel()
	db := pgtest.New(t)
	api := newPoliteAPI(t, 0, 0)
	madeUp := 0
	api.throttle = func(_ int, key string) string {
		if strings.HasPrefix(key, reconcile.SelfCheckKeyPrefix) {
			if madeUp++; madeUp == 2 {
				return "8"
			}
		}
		return ""
	}
	stuckMany(t, db, "tickets", 2)
	e, _ := politeEngine(t, db, reconcile.Config{Lease: 6 * time.Second, Tools: map[string]reconcile.Policy{
		"tickets": {Probe: api.probe(t), WitnessNotRequired: true, ProbeTimeout: time.Second}}})
	start := time.Now()
	rep := run(t, e, reconcile.Options{})
	if rep.Withheld != 2 || rep.Decided != 0 {
		t.Fatalf("withheld %d, decided %d (%v); want the batch given back", rep.Withheld, rep.Decided, rep.Actions)
	}
	if d := time.Since(start); d > 5*time.Second {
		t.Fatalf("the pass took %s: it waited for a pause its leases could not outlast", d)
	}
	if n := db.Count(t, `reconcile_state WHERE lease_owner IS NOT NULL OR attempts > 0`); n != 0 {
		t.Fatal("a withheld key kept its lease or counted an attempt")
	}
	if n := db.Count(t, `reconcile_audit`); n != 0 {
		t.Fatalf("%d audit rows for a batch given back", n)
	}
}

// A short pause during the closer is waited out with the batch's leases
// renewed first, so they outlast the wait and the closer after it.
func TestPauseDuringTheCloserRenewsTheBatchsLeases(t *testing.T) {
	t.Parallel()
	db := pgtest.New(t)
	api := newPoliteAPI(t, 0, 0)
	madeUp := 0
	var atPause, atRerun time.Time
	leaseUntil := func(agg string) time.Time {
		var at time.Time
		if err := db.Pool.QueryRow(bg, `SELECT `+agg+`(lease_expires_at) FROM reconcile_state WHERE lease_owner IS NOT NULL`).Scan(&at); err != nil {
			t.Error(err)
		}
		return at
	}
	api.throttle = func(_ int, key string) string {
		if !strings.HasPrefix(key, reconcile.SelfCheckKeyPrefix) {
			return ""
		}
		switch madeUp++; madeUp {
		case 2: // the closer
			atPause = leaseUntil("max")
			return "1"
		case 3: // the closer again, after the pause
			atRerun = leaseUntil("min")
		}
		return ""
	}
	stuckMany(t, db, "tickets", 2)
	e, _ := politeEngine(t, db, reconcile.Config{Lease: 8 * time.Second, Tools: map[string]reconcile.Policy{
		"tickets": {Probe: api.probe(t), WitnessNotRequired: true, ProbeTimeout: time.Second}}})
	rep := run(t, e, reconcile.Options{})
	if rep.Decided != 2 {
		t.Fatalf("decided %d (%v), want the batch written after the pause", rep.Decided, rep.Actions)
	}
	if !atRerun.After(atPause) {
		t.Fatalf("leases at the rerun end %s, at the pause %s: not renewed before the wait", atRerun, atPause)
	}
}

// confirm_not_found_after measures between the probes, not between the
// writes: a second not_found answered moments after the first is no
// confirmation, even when its batch was written seconds later (its closing
// check waited out a Retry-After).
func TestConfirmationIsMeasuredBetweenAnswers(t *testing.T) {
	t.Parallel()
	db := pgtest.New(t)
	api := newPoliteAPI(t, 0, 0)
	madeUp := 0
	api.throttle = func(_ int, key string) string {
		if strings.HasPrefix(key, reconcile.SelfCheckKeyPrefix) {
			if madeUp++; madeUp == 4 { // the second pass's closer
				return "6"
			}
		}
		return ""
	}
	stuckMany(t, db, "tickets", 1)
	e, _ := politeEngine(t, db, reconcile.Config{ConfirmNotFoundAfter: 5 * time.Second, Tools: map[string]reconcile.Policy{
		"tickets": {Probe: api.probe(t), WitnessNotRequired: true}}})
	opts := reconcile.Options{Keys: []string{"tickets-000001"}}
	if rep := run(t, e, opts); rep.Actions[reconcile.ActionAwaitingConfirmation] != 1 {
		t.Fatalf("first pass %v, want awaiting_confirmation", rep.Actions)
	}
	rep := run(t, e, opts)
	if r := row(t, db, "tickets-000001"); r.Status != ledger.StatusProcessing || rep.Actions[reconcile.ActionAwaitingConfirmation] != 1 {
		t.Fatalf("second pass %v, key %s: a not_found answered moments after the first was taken as confirmed", rep.Actions, r.Status)
	}
}

// The downstream asks to wait, and its route breaks during the pause and is
// fixed right after the key given back is probed again: the check that
// opened the batch before the pause cannot vouch for that probe, so the
// batch after the pause opens with a fresh check, which sees the broken
// route; the key, whose ticket exists, is not marked retryable.
func TestKeysGivenBackByAPauseStartAFreshBatch(t *testing.T) {
	t.Parallel()
	s := newBracketSetup(t)
	completeThrough(t, s.db, s.api, "wf-1:step-1", "T-1")
	stuckWithTickets(t, s.db, s.api, "k1")
	var mu sync.Mutex
	askedK1 := 0
	empty := false
	p := probeOf(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		key := r.URL.Query().Get("idempotency_key")
		mu.Lock()
		if key == "k1" {
			askedK1++
			switch askedK1 {
			case 1: // asks to wait, and the route breaks meanwhile
				empty = true
				mu.Unlock()
				w.Header().Set("Retry-After", "3")
				w.WriteHeader(http.StatusTooManyRequests)
				return
			case 2: // answered from the broken route, which is then fixed
				defer func() { empty = false }()
			}
		}
		broken := empty
		mu.Unlock()
		list := []map[string]any{}
		if key == "wf-1:step-1" || key == "k1" {
			if !broken {
				list = append(list, map[string]any{"id": "T-" + key})
			}
		}
		w.Header().Set("Content-Type", "application/json")
		_ = json.NewEncoder(w).Encode(map[string]any{"data": list})
	}))
	run(t, s.engine(reconcile.Policy{Probe: p, ProbeFingerprint: "v1"}, reconcile.Config{}), reconcile.Options{})
	if r := row(t, s.db, "k1"); r.Status == ledger.StatusFailedRetryable {
		t.Fatal("k1, whose ticket exists, was marked retryable from an answer no fresh check preceded")
	}
}

// probeOf is the http probe of a downstream served by h (the tickets
// lookup, match "data").
func probeOf(t *testing.T, h http.Handler) probes.Probe {
	t.Helper()
	srv := httptest.NewServer(h)
	t.Cleanup(srv.Close)
	return ticketsProbe(t, srv.URL+goodProbePath)
}
