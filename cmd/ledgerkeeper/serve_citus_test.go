package main

import (
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"net/url"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"golang.org/x/crypto/bcrypt"

	"github.com/ledgerkeeper/ledgerkeeper/internal/citustest"
	"github.com/ledgerkeeper/ledgerkeeper/internal/engine"
	"github.com/ledgerkeeper/ledgerkeeper/internal/pgtest"
	"github.com/ledgerkeeper/ledgerkeeper/ledger"
	"github.com/ledgerkeeper/ledgerkeeper/ledger/ledgertest/testwait"
)

// citusLedger starts a Citus cluster of its own (a coordinator and
// citustest.Workers workers), makes a Citus database on it and migrates it
// with `ledgerkeeper migrate`, which distributes the ledger's tables. It
// runs in the ordinary test binary, whatever LEDGERKEEPER_TEST_ENGINE says:
// a missing Citus build fails the test. The cluster stops when the test
// ends.
func citusLedger(t *testing.T) (*citustest.Cluster, *pgtest.DB) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Minute) // the first build of Citus takes minutes
	defer cancel()
	c, err := citustest.Start(ctx)
	if err != nil {
		t.Fatalf("no Citus cluster for the test: %v", err)
	}
	t.Cleanup(c.Stop)
	const name = "ledgerkeeper_serve"
	if err := c.CreateDatabase(ctx, name, ""); err != nil {
		t.Fatal(err)
	}
	u := citustest.WithDatabase(c.Coordinator.URL, name)
	code, out, stderr := cli(t, "migrate", "--database-url", u)
	if code != 0 || !strings.Contains(out, "distributed idempotency_keys by key (citus)") {
		t.Fatalf("migrate on the coordinator: exit %d\n%s\n%s", code, out, stderr)
	}
	pool, err := pgxpool.New(ctx, u)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	return c, &pgtest.DB{Pool: pool, URL: u, Name: name}
}

// placement returns the shard of idempotency_keys key hashes to and the
// port of the worker holding it, from the coordinator's metadata.
func placement(t *testing.T, db *pgtest.DB, key string) (shard int64, port int) {
	t.Helper()
	err := db.Pool.QueryRow(context.Background(), `SELECT p.shardid, n.nodeport
		FROM pg_dist_placement p JOIN pg_dist_node n ON n.groupid = p.groupid
		WHERE p.shardid = get_shard_id_for_distribution_column('idempotency_keys', $1::text)`, key).Scan(&shard, &port)
	if err != nil {
		t.Fatalf("placement of %s: %v", key, err)
	}
	return shard, port
}

// keysOn returns n keys named prefix-0, prefix-1, … on the worker
// listening on port; with oneShard, all on one shard of it.
func keysOn(t *testing.T, db *pgtest.DB, port int, prefix string, n int, oneShard bool) []string {
	t.Helper()
	var keys []string
	byShard := map[int64][]string{}
	for i := 0; len(keys) < n; i++ {
		if i > 100*n {
			t.Fatalf("no %d keys %s-N on the worker at port %d among the first %d", n, prefix, port, i)
		}
		k := fmt.Sprintf("%s-%d", prefix, i)
		shard, on := placement(t, db, k)
		switch {
		case on != port:
		case oneShard:
			byShard[shard] = append(byShard[shard], k)
			if len(byShard[shard]) == n {
				keys = byShard[shard]
			}
		default:
			keys = append(keys, k)
		}
	}
	return keys
}

// stuckAtOnce inserts keys as stuckTickets does, in one statement: on one
// shard, one transaction of one worker, a pass sees all of them or none.
func stuckAtOnce(t *testing.T, db *pgtest.DB, rt *router, keys []string) {
	t.Helper()
	db.Exec(t, `INSERT INTO idempotency_keys (key, tool, request_hash, created_at, claimed_at, expires_at)
		SELECT k, 'create_ticket', 'h', now() - interval '1 minute', now() - interval '1 minute', now() + interval '1 day'
		FROM unnest($1::text[]) AS k`, keys)
	rt.set(func(rt *router) {
		for _, k := range keys {
			rt.tickets[k] = true
		}
	})
}

// expiredKeys inserts completed keys past their expiry, for the purge,
// whose tickets exist (the probe's self-check may draw them as completed
// samples).
func expiredKeys(t *testing.T, db *pgtest.DB, rt *router, keys ...string) {
	t.Helper()
	for _, k := range keys {
		db.Exec(t, `INSERT INTO idempotency_keys (key, tool, request_hash, status, response_code, response_body, created_at, expires_at)
			VALUES ($1, 'create_ticket', 'h', 'completed', 201, '{}', now() - interval '1 hour', now() - interval '1 minute')`, k)
		rt.set(func(rt *router) { rt.tickets[k] = true })
	}
}

// probeGate is a tickets API in front of a router that holds the probes
// of the keys it gates until it is released: keys leased and in flight.
type probeGate struct {
	srv  *httptest.Server
	open chan struct{}

	once    sync.Once
	mu      sync.Mutex
	gated   map[string]bool
	entered map[string]bool
}

func newProbeGate(t *testing.T, rt *router, keys ...string) *probeGate {
	g := &probeGate{open: make(chan struct{}), gated: map[string]bool{}, entered: map[string]bool{}}
	for _, k := range keys {
		g.gated[k] = true
	}
	target, err := url.Parse(rt.srv.URL)
	if err != nil {
		t.Fatal(err)
	}
	proxy := httputil.NewSingleHostReverseProxy(target)
	g.srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		key := r.URL.Query().Get("idempotency_key")
		g.mu.Lock()
		gated := g.gated[key]
		if gated {
			g.entered[key] = true
		}
		g.mu.Unlock()
		if gated {
			select {
			case <-g.open:
			case <-r.Context().Done():
				return
			}
		}
		proxy.ServeHTTP(w, r)
	}))
	t.Cleanup(g.srv.Close)
	t.Cleanup(g.release) // before Close: a held request would keep it waiting
	return g
}

// holds reports whether the probes of all of keys have arrived.
func (g *probeGate) holds(keys []string) func() bool {
	return func() bool {
		g.mu.Lock()
		defer g.mu.Unlock()
		for _, k := range keys {
			if !g.entered[k] {
				return false
			}
		}
		return true
	}
}

// release lets the held probes and every later one through.
func (g *probeGate) release() { g.once.Do(func() { close(g.open) }) }

// serve on a Citus cluster, end to end: `ledgerkeeper migrate` distributes
// the ledger; serve resolves stuck keys on every worker's shards, one
// audit row each, and purges expired keys on both. Then one worker stops
// while keys of its shards are being probed, and keys get stuck on the
// other: nothing is decided for the stopped worker's keys while it is
// down, and once it is back every key of the outage, on either worker, is
// resolved with exactly one audit row, and the expired keys are purged.
func TestServeOnCitusResolvesEveryKeyOnceThroughAWorkerOutage(t *testing.T) {
	// Not parallel: the store's shapes are chosen per process
	// (internal/engine), and serve on this cluster turns the Citus ones on
	// for every test running meanwhile on plain PostgreSQL.
	was := engine.Citus()
	t.Cleanup(func() { engine.SetCitus(was) })
	start := time.Now()
	c, db := citusLedger(t)
	t.Logf("cluster up and migrated in %s", time.Since(start).Round(time.Millisecond))
	live, down := c.Workers[0], c.Workers[1]

	rt := newRouter(t)
	// The stopped worker's keys: leased and probed when it stops.
	inFlight := keysOn(t, db, down.Port, "wf-in-flight", 3, true)
	gate := newProbeGate(t, rt, inFlight...)
	slack := newSlackServer(t)
	addr := freeAddr(t)
	cfg := citusServeConfig(t, gate.srv.URL, slack.srv.URL, addr)

	// 16 stuck keys, 8 on each worker's shards, and 4 expired keys on
	// each; a completed key whose ticket exists, the probe's witness.
	var first []string
	for _, w := range c.Workers {
		first = append(first, keysOn(t, db, w.Port, fmt.Sprintf("wf-%d", w.Port), 8, false)...)
		expiredKeys(t, db, rt, keysOn(t, db, w.Port, fmt.Sprintf("wf-%d:expired", w.Port), 4, false)...)
	}
	completedTicket(t, db, rt, "wf-witness:done")
	stuckTickets(t, db, rt, first...)
	logs := serveWith(t, db, cfg, slack)
	resolved := func(keys []string) func() bool { return eachKey(t, db, keys, `status = 'completed'`, 1) }
	gone := func(keys []string) func() bool { return eachKey(t, db, keys, `true`, 0) }
	testwait.Eventually(t, resolved(first), 40*time.Second, "every stuck key of both workers completed")
	testwait.Eventually(t, func() bool {
		return db.Count(t, `idempotency_keys WHERE key LIKE '%:expired-%'`) == 0
	}, 20*time.Second, "every expired key purged")
	auditedOnce(t, db, first)
	t.Logf("16 keys on 2 workers resolved and purged at %s", time.Since(start).Round(time.Millisecond))

	// Keys of the worker about to stop are leased and in flight when it
	// stops (one pass leases them all: they are on one shard, inserted at
	// once).
	stuckAtOnce(t, db, rt, inFlight)
	testwait.Eventually(t, gate.holds(inFlight), 20*time.Second, "the probes of the keys in flight")
	var runsBefore int64
	if err := db.Pool.QueryRow(context.Background(), `SELECT coalesce(max(id), 0) FROM ledgerkeeper_runs`).Scan(&runsBefore); err != nil {
		t.Fatal(err)
	}
	var downShards []int64
	if err := db.Pool.QueryRow(context.Background(), `SELECT array_agg(p.shardid ORDER BY p.shardid)
		FROM pg_dist_placement p JOIN pg_dist_node n ON n.groupid = p.groupid JOIN pg_dist_shard s ON s.shardid = p.shardid
		WHERE s.logicalrelid = 'idempotency_keys'::regclass AND n.nodeport = $1`, down.Port).Scan(&downShards); err != nil {
		t.Fatal(err)
	}
	stopped := time.Now()
	if err := c.StopNode(down); err != nil {
		t.Fatal(err)
	}
	t.Logf("worker %d stopped in %s", down.Port, time.Since(stopped).Round(time.Millisecond))
	gate.release()
	// A tool's claim of a key on the stopped worker fails: it is down for
	// its shards.
	if _, err := ledger.Claim(context.Background(), db.Pool, ledger.ClaimParams{Key: keysOn(t, db, down.Port, "wf-new-down", 1, false)[0], Tool: "create_ticket", RequestHash: "h"}); err == nil {
		t.Fatal("a claim of a key on the stopped worker succeeded")
	}
	// Keys stuck on the running worker while the other is down: they and
	// its expired keys are reconciled and purged while it is down, the
	// reads that find work going shard by shard past the stopped worker's.
	during := keysOn(t, db, live.Port, "wf-during", 4, false)
	stuckTickets(t, db, rt, during...)
	duringExpired := keysOn(t, db, live.Port, "wf-during:expired", 4, false)
	expiredKeys(t, db, rt, duringExpired...)
	testwait.Eventually(t, resolved(during), 40*time.Second, "the running worker's keys completed while the other is down")
	testwait.Eventually(t, gone(duringExpired), 20*time.Second, "the running worker's expired keys purged while the other is down")
	auditedOnce(t, db, during)
	t.Logf("the running worker's keys resolved and purged with the other down at %s", time.Since(start).Round(time.Millisecond))

	// /readyz stays 200 and names the stopped worker and its shards.
	node := fmt.Sprintf("127.0.0.1:%d", down.Port)
	body, code := getStatus(t, "http://"+addr+"/readyz")
	if code != http.StatusOK || !strings.Contains(body, "degraded") || !strings.Contains(body, node) || !strings.Contains(body, shardsText(downShards)) {
		t.Errorf("/readyz with a worker down: %d %q; want 200 naming %s and its shards %s", code, body, node, shardsText(downShards))
	}
	// The console's overview answers, names the worker and says what it
	// cannot show.
	code, page := httpDo(t, http.MethodGet, "http://"+addr+"/ui/", "alice", "alice-pw", nil)
	if code != http.StatusOK || !strings.Contains(page, "Citus worker unreachable") || !strings.Contains(page, node) ||
		!strings.Contains(page, "Not shown while a Citus worker is down") {
		t.Errorf("the console's overview with a worker down: %d\n%s", code, page)
	}
	// One alert names the worker, however many passes and keys met it.
	workerAlerts := func() int {
		n := 0
		for _, m := range slack.messages() {
			if strings.Contains(m, "cannot be reached from the coordinator") && strings.Contains(m, node) {
				n++
			}
		}
		return n
	}
	testwait.Eventually(t, func() bool { return workerAlerts() >= 1 }, 20*time.Second, "the alert naming the stopped worker")
	var runsNow int64
	if err := db.Pool.QueryRow(context.Background(), `SELECT coalesce(max(id), 0) FROM ledgerkeeper_runs`).Scan(&runsNow); err != nil {
		t.Fatal(err)
	}
	testwait.Eventually(t, func() bool {
		return db.Count(t, `ledgerkeeper_runs WHERE kind = 'reconcile' AND id > $1`, runsNow) >= 3
	}, 30*time.Second, "three more reconcile passes with the worker down")
	if n := workerAlerts(); n != 1 {
		t.Errorf("%d alerts naming the stopped worker, want 1", n)
	}
	if n := strings.Count(slack.all(), "wf-in-flight"); n != 0 {
		t.Errorf("the stopped worker's keys were alerted one by one (%d mentions)", n)
	}
	// A worker's outage is not a failover of the coordinator: the pool
	// stays on it.
	if strings.Contains(logs.String(), "database failed over") {
		t.Errorf("a worker's outage was taken for a failover of the coordinator:\n%s", logs.String())
	}
	if !strings.Contains(logs.String(), "Citus worker unreachable") {
		t.Errorf("no line naming the unreachable worker logged:\n%s", logs.String())
	}

	// The worker is back: every key of the outage is resolved, once; none
	// of the stopped worker's keys was decided before it was back.
	var back time.Time
	if err := db.Pool.QueryRow(context.Background(), `SELECT now()`).Scan(&back); err != nil {
		t.Fatal(err)
	}
	if err := c.StartNode(context.Background(), down); err != nil {
		t.Fatal(err)
	}
	all := append(append([]string{}, inFlight...), during...)
	testwait.Eventually(t, resolved(all), 40*time.Second, "every key of the outage completed once the worker is back")
	auditedOnce(t, db, all)
	if n := db.Count(t, `reconcile_audit WHERE key = ANY($1) AND created_at < $2`, inFlight, back); n != 0 {
		t.Errorf("%d audit rows of the stopped worker's keys written before it was back", n)
	}
	testwait.Eventually(t, func() bool {
		return db.Count(t, `idempotency_keys WHERE key LIKE '%:expired-%'`) == 0
	}, 20*time.Second, "the expired keys of the outage purged")
	testwait.Eventually(t, func() bool { return strings.Contains(slack.all(), "reachable again") }, 20*time.Second,
		"the worker's alert resolved")
	if body := get(t, "http://"+addr+"/readyz"); strings.Contains(body, "degraded") {
		t.Errorf("/readyz with every worker back: %q", body)
	}
	if code, page := httpDo(t, http.MethodGet, "http://"+addr+"/ui/", "alice", "alice-pw", nil); code != http.StatusOK ||
		strings.Contains(page, "Citus worker unreachable") || strings.Contains(page, "Not shown") {
		t.Errorf("the console's overview with every worker back: %d\n%s", code, page)
	}
	t.Logf("done at %s", time.Since(start).Round(time.Millisecond))
}

// eachKey is a wait condition: each of keys has want rows of
// idempotency_keys matching cond. Key by key, so that each count goes to
// its key's shard and answers while a worker is down.
func eachKey(t *testing.T, db *pgtest.DB, keys []string, cond string, want int) func() bool {
	return func() bool {
		for _, k := range keys {
			if db.Count(t, `idempotency_keys WHERE key = $1 AND `+cond, k) != want {
				return false
			}
		}
		return true
	}
}

// shardsText is shard ids as the messages list them.
func shardsText(ids []int64) string {
	out := make([]string, len(ids))
	for i, id := range ids {
		out[i] = strconv.FormatInt(id, 10)
	}
	return strings.Join(out, ", ")
}

// citusServeConfig is serve's configuration for the Citus end-to-end
// tests: every job each second, a 1 s window, the tickets API at tickets,
// Slack at slack, the listener at addr.
func citusServeConfig(t *testing.T, tickets, slack, addr string) string {
	t.Helper()
	hash, err := bcrypt.GenerateFromPassword([]byte("alice-pw"), bcrypt.MinCost)
	if err != nil {
		t.Fatal(err)
	}
	return writeFile(t, "serve.yaml", fmt.Sprintf(`schedule:
  reconcile: "@every 1s"
  purge: "@every 1s"
  alerts: "@every 1s"
reconcile:
  grace: 1s
  alert_after_attempts: 1
  lease: 12s
  backoff_base: 1s
  backoff_max: 2s
retention:
  min_age: 2s
tools:
  create_ticket:
    processing_window: 1s
    probe:
      type: http
      url: "%s/v1/tickets?idempotency_key={key}"
      match: data
      response_code: 201
      timeout: 3s
alerts:
  slack:
    token: xoxb-test-token
    channel: "#oncall"
    api_url: "%s/api/"
http:
  listen: "%s"
console:
  users: {alice: %q}
`, tickets, slack, addr, hash))
}

// auditedOnce fails the test unless each key has exactly one audit row,
// its completion.
func auditedOnce(t *testing.T, db *pgtest.DB, keys []string) {
	t.Helper()
	for _, k := range keys {
		// Key by key, on its shard: it answers with a worker down.
		var all, completed int
		if err := db.Pool.QueryRow(context.Background(), `SELECT count(*), count(*) FILTER (WHERE action = 'completed')
			FROM reconcile_audit WHERE key = $1`, k).Scan(&all, &completed); err != nil {
			t.Fatal(err)
		}
		if all != 1 || completed != 1 {
			t.Errorf("key %s: %d audit rows, %d of them its completion; want exactly one, its completion", k, all, completed)
		}
	}
}
