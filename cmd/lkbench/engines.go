package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"text/tabwriter"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/ledgerkeeper/ledgerkeeper/internal/citustest"
	"github.com/ledgerkeeper/ledgerkeeper/internal/engine"
	"github.com/ledgerkeeper/ledgerkeeper/ledger"
	"github.com/ledgerkeeper/ledgerkeeper/ledger/ledgertest/pgembed"
	"github.com/ledgerkeeper/ledgerkeeper/migrations"
	"github.com/ledgerkeeper/ledgerkeeper/reconcile"
)

// The engines benchmark's fixed settings: the reconcile pass is
// `lkbench reconcile`'s (its 20 ms downstream, concurrency 32, the
// self-check bracket on, as the daemon runs by default).
const (
	enginesDB          = "lkbench_engines"
	enginesConcurrency = 32
	enginesLatency     = 20 * time.Millisecond
	// connPoll is how often each node's client connections are counted
	// during a window (for the peak).
	connPoll = 250 * time.Millisecond
)

// plainSettings are citustest's nodes' settings, less Citus: the
// PostgreSQL side runs as the Citus nodes do, so a ratio compares the
// engines, not their configurations. The Citus nodes run with fsync,
// synchronous_commit and full_page_writes off (pgembed's non-durable
// cluster turns the same three off).
var plainSettings = map[string]string{
	"max_prepared_transactions":   "200",
	"log_min_messages":            "warning",
	"log_autovacuum_min_duration": "-1",
}

// runEngines measures the same work on plain PostgreSQL and on a Citus
// cluster (a coordinator and two workers, internal/citustest), rounds
// interleaved: claims of fresh keys by concurrent clients, and one
// reconcile pass over a backlog of stuck keys; with each node's CPU in
// every window.
func runEngines(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("engines", flag.ContinueOnError)
	fs.SetOutput(stderr)
	duration := fs.Duration("duration", 10*time.Second, "length of each claims round")
	clients := fs.Int("clients", 16, "concurrent clients claiming and completing fresh keys (one pool connection each)")
	rounds := fs.Int("rounds", 3, "measured rounds per engine and measurement, interleaved between the engines")
	backlog := fs.Int("backlog", 2000, "stuck keys reconciled by each measured pass")
	jsonOut := fs.String("json", "", "also write the results as JSON to FILE")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if *duration <= 0 || *clients < 1 || *rounds < 1 || *backlog < 2 {
		return errors.New("--duration must be positive, --clients and --rounds at least 1, --backlog at least 2")
	}
	logf := logger(stderr)
	ds, err := startDownstream(enginesLatency, 0)
	if err != nil {
		return err
	}
	defer ds.stop()
	devNull, err := os.OpenFile(os.DevNull, os.O_WRONLY, 0)
	if err != nil {
		return err
	}
	defer devNull.Close()

	logf("starting an ephemeral PostgreSQL cluster with fsync, synchronous_commit and full_page_writes off (as the Citus nodes run)")
	pg, err := pgembed.Start(ctx, pgembed.Options{Settings: plainSettings, StartTimeout: 2 * time.Minute})
	if err != nil {
		return err
	}
	defer pg.Stop()
	plainSrv := &server{adminURL: pg.URL, stop: pg.Stop}
	plainURL, err := plainSrv.createDB(ctx, enginesDB, "")
	if err != nil {
		return err
	}
	logf("starting a Citus cluster: a coordinator and %d workers (building Citus first if it is not in the cache)", citustest.Workers)
	cluster, err := citustest.Start(ctx)
	if err != nil {
		return err
	}
	defer cluster.Stop()
	if err := cluster.CreateDatabase(ctx, enginesDB, ""); err != nil {
		return err
	}
	// The coordinator's counts of single- and multi-shard executions and
	// of connections to the workers, for the sessions opened after this.
	if err := citustest.Exec(ctx, cluster.Coordinator.URL, "ALTER DATABASE "+enginesDB+" SET citus.enable_stat_counters = on"); err != nil {
		return fmt.Errorf("citus: %w", err)
	}

	plain := &engineRig{name: "postgresql"}
	if err := plain.open(ctx, plainURL, []nodeAt{{"postgresql", plainURL}}, *clients); err != nil {
		return err
	}
	defer plain.close()
	citus := &engineRig{name: "citus", citus: true}
	nodes := []nodeAt{{"coordinator", citustest.WithDatabase(cluster.Coordinator.URL, enginesDB)}}
	for i, w := range cluster.Workers {
		nodes = append(nodes, nodeAt{fmt.Sprintf("worker %d", i+1), citustest.WithDatabase(w.URL, enginesDB)})
	}
	if err := citus.open(ctx, nodes[0].url, nodes, *clients); err != nil {
		return err
	}
	defer citus.close()
	rigs := []*engineRig{plain, citus}
	for _, r := range rigs {
		hp, closeProbe, err := ds.probe(enginesConcurrency)
		if err != nil {
			return err
		}
		defer closeProbe()
		r.engine = benchEngine("lkbench", enginesConcurrency, hp, bracketOn, r.recon, devNull)
	}
	out := enginesReport{Clients: *clients, Duration: duration.String(), Rounds: *rounds, Backlog: *backlog,
		Concurrency: enginesConcurrency, LatencyMs: ms(enginesLatency), Workers: citustest.Workers, LoadBefore: loadAvg()}
	if err := citus.recon.QueryRow(ctx, `SELECT count(*) FROM pg_dist_shard WHERE logicalrelid = 'idempotency_keys'::regclass`).Scan(&out.Shards); err != nil {
		return fmt.Errorf("citus: count idempotency_keys' shards: %w", err)
	}
	if err := citus.recon.QueryRow(ctx, `SELECT extversion FROM pg_extension WHERE extname = 'citus'`).Scan(&out.CitusVersion); err != nil {
		return err
	}
	if err := plain.recon.QueryRow(ctx, `SHOW server_version`).Scan(&out.PostgreSQLVersion); err != nil {
		return err
	}
	logf("citus %s, idempotency_keys in %d shards; PostgreSQL %s", out.CitusVersion, out.Shards, out.PostgreSQLVersion)

	var seq atomic.Int64
	for _, r := range rigs {
		logf("%s: warm-up (claims for 1 s each way, a reconcile pass over %d keys)", r.name, 4*enginesConcurrency)
		for _, v := range []claimVariant{claimsOwn, claimsRaw, claimsOneStatement} {
			if _, err := r.claims(ctx, time.Second, &seq, v); err != nil {
				return err
			}
		}
		if err := r.loadBacklog(ctx, 4*enginesConcurrency); err != nil {
			return err
		}
		if _, _, err := r.reconcilePass(ctx, ds, 4*enginesConcurrency); err != nil {
			return err
		}
	}
	for i := range *rounds {
		for j := range rigs {
			r := rigs[(i+j)%len(rigs)] // alternate which engine goes first
			for k := range 3 {
				v := claimVariant((i + k) % 3) // and which variant goes first on it
				what := v.String()
				w, err := r.measure(ctx, i+1, what, func() (int, claimLatency, error) {
					lat, err := r.claims(ctx, *duration, &seq, v)
					return lat.n, lat, err
				})
				if err != nil {
					return err
				}
				logf("%s %s round %d: %.0f claims/s, p50 %.2f ms, p99 %.2f ms, server CPU %.3f ms/claim, client %.3f ms/claim, load %s",
					r.name, what, i+1, w.PerSec, w.P50ms, w.P99ms, w.serverMsPer(), w.clientMsPer(), w.Load)
				switch v {
				case claimsRaw:
					out.RawClaims = append(out.RawClaims, w)
				case claimsOneStatement:
					out.OneStatementClaims = append(out.OneStatementClaims, w)
				default:
					out.Claims = append(out.Claims, w)
				}
			}
		}
	}
	for i := range *rounds {
		for j := range rigs {
			r := rigs[(i+j)%len(rigs)]
			if err := r.loadBacklog(ctx, *backlog); err != nil {
				return err
			}
			w, err := r.measure(ctx, i+1, "reconcile", func() (int, claimLatency, error) {
				n, _, err := r.reconcilePass(ctx, ds, *backlog)
				return n, claimLatency{}, err
			})
			if err != nil {
				return err
			}
			logf("%s reconcile round %d: %.0f keys/s, server CPU %.3f ms/key, client %.3f ms/key, load %s",
				r.name, i+1, w.PerSec, w.serverMsPer(), w.clientMsPer(), w.Load)
			out.Reconcile = append(out.Reconcile, w)
		}
	}
	out.LoadAfter = loadAvg()
	out.ClaimSummary = summariseEngines(out.Claims)
	out.ReconcileSummary = summariseEngines(out.Reconcile)
	out.ClaimRatios = engineRatiosOf(out.Claims, out.ClaimSummary)
	out.RawClaimSummary = summariseEngines(out.RawClaims)
	out.RawClaimRatios = engineRatiosOf(out.RawClaims, out.RawClaimSummary)
	out.OneStatementSummary = summariseEngines(out.OneStatementClaims)
	out.OneStatementRatios = engineRatiosOf(out.OneStatementClaims, out.OneStatementSummary)
	out.ReconcileRatios = engineRatiosOf(out.Reconcile, out.ReconcileSummary)
	printEngines(stdout, out)
	if *jsonOut != "" {
		b, _ := json.MarshalIndent(out, "", "  ")
		return os.WriteFile(*jsonOut, b, 0o644) //nolint:gosec // G306: a benchmark's results, read by anyone
	}
	return nil
}

// nodeAt names one server and the benchmark database's URL on it.
type nodeAt struct{ name, url string }

// engineRig is one engine under test: its pools on the database
// ledgerkeeper connects to (the coordinator on Citus) and every node it
// watches.
type engineRig struct {
	name  string
	citus bool
	// claimPool has one connection per client; recon is the reconcile
	// engine's pool (concurrency + 4, the daemon's default) and the
	// loader's.
	claimPool, recon *pgxpool.Pool
	engine           *reconcile.Engine
	nodes            []*watchedNode
	// statements counts what both pools send.
	statements statementCounter
}

func (r *engineRig) open(ctx context.Context, url string, nodes []nodeAt, clients int) error {
	var err error
	if r.claimPool, err = r.pool(ctx, url, clients, "lkbench-claims"); err != nil {
		return err
	}
	if r.recon, err = r.pool(ctx, url, enginesConcurrency+4, "ledgerkeeper"); err != nil {
		return err
	}
	if _, err := migrations.Up(ctx, r.recon, nil); err != nil {
		return fmt.Errorf("%s: migrate: %w", r.name, err)
	}
	for _, n := range nodes {
		w, err := watchNode(ctx, n.name, n.url)
		if err != nil {
			return fmt.Errorf("%s: %w", r.name, err)
		}
		r.nodes = append(r.nodes, w)
	}
	return nil
}

// pool is newPool's pool with the rig's statement counter.
func (r *engineRig) pool(ctx context.Context, url string, conns int, app string) (*pgxpool.Pool, error) {
	pc, err := pgxpool.ParseConfig(url)
	if err != nil {
		return nil, err
	}
	pc.MaxConns, pc.MinConns = int32(conns), int32(conns) //nolint:gosec // G115: a benchmark flag; a pool beyond int32 is not a benchmark anyone runs
	pc.ConnConfig.RuntimeParams["application_name"] = app
	pc.ConnConfig.Tracer = &r.statements
	return pgxpool.NewWithConfig(ctx, pc)
}

func (r *engineRig) close() {
	for _, n := range r.nodes {
		_ = n.conn.Close(context.Background())
	}
	if r.recon != nil {
		r.recon.Close()
	}
	if r.claimPool != nil {
		r.claimPool.Close()
	}
}

// claimLatency is the claims' count and the latency of claim plus
// complete.
type claimLatency struct {
	n        int
	p50, p99 time.Duration
}

// claimVariant is one way of doing a claims round's work.
type claimVariant int

const (
	// claimsOwn: ledger.Claim in the engine's own shape (on Citus the
	// upsert, ledger.UseCitusShapes), then ledger.Complete.
	claimsOwn claimVariant = iota
	// claimsRaw: hotpath's raw minimum, two plain statements.
	claimsRaw
	// claimsOneStatement: ledger.Claim in PostgreSQL's one-statement
	// shape on both engines (on PostgreSQL the same as claimsOwn: a noise
	// floor), then ledger.Complete.
	claimsOneStatement
)

func (v claimVariant) String() string {
	return [...]string{"claims", "claims, raw minimum", "claims, one-statement shape"}[v]
}

// claims runs the tool side's work for a fresh key, ledger.Claim then
// ledger.Complete (the two statements ledger.Middleware sends for a new
// key, without HTTP), from every client in a loop for d; every claim
// must be New.
func (r *engineRig) claims(ctx context.Context, d time.Duration, seq *atomic.Int64, v claimVariant) (claimLatency, error) {
	raw := v == claimsRaw
	// The claim's shape is chosen per process (ledger.UseCitusShapes):
	// the engine's own, as a tool server on it has, or the one-statement
	// shape on both.
	ledger.UseCitusShapes(r.citus && v == claimsOwn)
	ctx, cancel := context.WithTimeout(ctx, d)
	defer cancel()
	clients := int(r.claimPool.Config().MaxConns)
	lats := make([][]time.Duration, clients)
	errs := make([]error, clients)
	var wg sync.WaitGroup
	body := json.RawMessage(`{"title":"bench ticket","customer_id":"cus_42","amount_cents":1200}`)
	answer := json.RawMessage(`{"ticket_id":"T-1"}`)
	hash := strings.Repeat("a", 64)
	for c := range clients {
		wg.Go(func() {
			// Statements run on a context of their own: a claim in flight
			// at the deadline completes, so no key is left processing.
			opCtx := context.WithoutCancel(ctx)
			for ctx.Err() == nil {
				key := fmt.Sprintf("eng-%s-%012d", r.name, seq.Add(1))
				start := time.Now()
				var err error
				if raw {
					err = rawClaimComplete(opCtx, r.claimPool, key, body, answer)
				} else {
					var res ledger.ClaimResult
					res, err = ledger.Claim(opCtx, r.claimPool, ledger.ClaimParams{Key: key, Tool: "create_ticket", RequestHash: hash, RequestBody: body})
					if err == nil && res.Outcome != ledger.New {
						err = fmt.Errorf("claim of fresh key %s: outcome %s, want new", key, res.Outcome)
					}
					if err == nil {
						err = ledger.Complete(opCtx, r.claimPool, key, res.Row.ClaimedAt, 201, answer)
					}
				}
				if err != nil {
					errs[c] = err
					return
				}
				lats[c] = append(lats[c], time.Since(start))
			}
		})
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		return claimLatency{}, fmt.Errorf("%s claims: %w", r.name, err)
	}
	all := slices.Concat(lats...)
	if len(all) == 0 {
		return claimLatency{}, fmt.Errorf("%s claims: none completed in %s", r.name, d)
	}
	slices.Sort(all)
	return claimLatency{n: len(all), p50: quantile(all, 0.5), p99: quantile(all, 0.99)}, nil
}

// rawClaimComplete is hotpath's raw minimum for a fresh key: its claim
// and its completion by plain pgx.
func rawClaimComplete(ctx context.Context, db *pgxpool.Pool, key string, body, answer json.RawMessage) error {
	var claimedAt time.Time
	if err := db.QueryRow(ctx, rawClaim, key, "create_ticket", strings.Repeat("a", 64), string(body), ledger.DefaultTTL).Scan(&claimedAt); err != nil {
		return fmt.Errorf("raw claim of %s: %w", key, err)
	}
	tag, err := db.Exec(ctx, rawComplete, key, claimedAt, 201, string(answer))
	if err == nil && tag.RowsAffected() != 1 {
		err = fmt.Errorf("completed %d rows", tag.RowsAffected())
	}
	if err != nil {
		return fmt.Errorf("raw complete of %s: %w", key, err)
	}
	return nil
}

// loadBacklog replaces the ledger with n stuck keys and the witnesses
// (stuckKeys, as `lkbench reconcile` loads them), then checkpoints every
// node (stuckKeys checkpoints the coordinator only), so no pass pays for
// the load's dirty pages.
func (r *engineRig) loadBacklog(ctx context.Context, n int) error {
	if err := stuckKeys(ctx, r.recon, n); err != nil {
		return fmt.Errorf("%s: %w", r.name, err)
	}
	for _, node := range r.nodes[1:] {
		if _, err := node.conn.Exec(ctx, `CHECKPOINT`); err != nil {
			return fmt.Errorf("%s: checkpoint %s: %w", r.name, node.name, err)
		}
	}
	return nil
}

// reconcilePass runs one pass of the engine over the n keys loadBacklog
// left and checks it decided every key, as `lkbench reconcile` checks its
// passes.
func (r *engineRig) reconcilePass(ctx context.Context, ds *downstreamProc, n int) (int, reconcile.Report, error) {
	// The store's statement shapes are chosen per process
	// (internal/engine); the passes never overlap, so each sets its own.
	engine.SetCitus(r.citus)
	hits0, err := ds.hits(ctx)
	if err != nil {
		return 0, reconcile.Report{}, err
	}
	rep, err := r.engine.Run(ctx, reconcile.Options{})
	if err != nil {
		return 0, rep, fmt.Errorf("%s reconcile: %w", r.name, err)
	}
	if err := checkPass(rep, n, bracketOn); err != nil {
		return 0, rep, fmt.Errorf("%s reconcile: %w", r.name, err)
	}
	hits1, err := ds.hits(ctx)
	if err != nil {
		return 0, rep, err
	}
	if err := checkDownstream(hits1.minus(hits0), n, bracketOn); err != nil {
		return 0, rep, fmt.Errorf("%s reconcile: %w", r.name, err)
	}
	return n, rep, nil
}

// statementCounter counts the statements a pool sends, alone or in a
// batch (the reconciler's store pipelines its per-key statements).
type statementCounter struct{ n atomic.Int64 }

func (c *statementCounter) TraceQueryStart(ctx context.Context, _ *pgx.Conn, _ pgx.TraceQueryStartData) context.Context {
	c.n.Add(1)
	return ctx
}

func (c *statementCounter) TraceQueryEnd(context.Context, *pgx.Conn, pgx.TraceQueryEndData) {}

func (c *statementCounter) TraceBatchStart(ctx context.Context, _ *pgx.Conn, _ pgx.TraceBatchStartData) context.Context {
	return ctx
}

func (c *statementCounter) TraceBatchQuery(context.Context, *pgx.Conn, pgx.TraceBatchQueryData) {
	c.n.Add(1)
}

func (c *statementCounter) TraceBatchEnd(context.Context, *pgx.Conn, pgx.TraceBatchEndData) {}

// watchedNode is one server as the benchmark watches it: its processes'
// CPU (the postmaster and its children, pgCPU) and, on a connection of
// its own to the benchmark's database, its transactions and client
// connections there.
type watchedNode struct {
	name string
	cpu  *pgCPU
	conn *pgx.Conn
}

func watchNode(ctx context.Context, name, url string) (*watchedNode, error) {
	conn, err := pgx.Connect(ctx, url)
	if err != nil {
		return nil, fmt.Errorf("watch %s: %w", name, err)
	}
	cpu, err := newPGCPU(ctx, conn)
	if err != nil {
		_ = conn.Close(ctx)
		return nil, fmt.Errorf("watch %s: find its postmaster: %w", name, err)
	}
	return &watchedNode{name: name, cpu: cpu, conn: conn}, nil
}

// citusCounters are a Citus node's counters of the benchmark's
// database (citus_stat_counters, kept by the sessions with
// citus.enable_stat_counters on, read at once: unlike pg_stat_database's,
// which an idle backend may publish 10 s late).
type citusCounters struct {
	// SingleShard and MultiShard count the statements the node ran on
	// distributed tables, routed to one shard or fanned out to several.
	SingleShard int64 `json:"single_shard"`
	MultiShard  int64 `json:"multi_shard"`
	// Connected counts the connections the node opened to other nodes;
	// Reused the times it used one it had open.
	Connected int64 `json:"connections_opened"`
	Reused    int64 `json:"connections_reused"`
}

func (c citusCounters) minus(o citusCounters) citusCounters {
	return citusCounters{SingleShard: c.SingleShard - o.SingleShard, MultiShard: c.MultiShard - o.MultiShard,
		Connected: c.Connected - o.Connected, Reused: c.Reused - o.Reused}
}

func (n *watchedNode) counters(ctx context.Context) (citusCounters, error) {
	var c citusCounters
	err := n.conn.QueryRow(ctx, `SELECT query_execution_single_shard, query_execution_multi_shard,
			connection_establishment_succeeded, connection_reused
		FROM citus_stat_counters WHERE name = current_database()`).Scan(&c.SingleShard, &c.MultiShard, &c.Connected, &c.Reused)
	if err != nil {
		return c, fmt.Errorf("%s: citus_stat_counters: %w", n.name, err)
	}
	return c, nil
}

func (n *watchedNode) connections(ctx context.Context) (int, error) {
	var c int
	err := n.conn.QueryRow(ctx, `SELECT count(*) FROM pg_stat_activity
		WHERE datname = current_database() AND backend_type = 'client backend' AND pid <> pg_backend_pid()`).Scan(&c)
	if err != nil {
		return 0, fmt.Errorf("%s: connections: %w", n.name, err)
	}
	return c, nil
}

// measure runs work as one measured window: every node's CPU and this
// process's before and after it, the peak of each node's client
// connections during it, the statements the clients sent and, on Citus,
// the coordinator's counters.
func (r *engineRig) measure(ctx context.Context, round int, what string, work func() (int, claimLatency, error)) (engineWindow, error) {
	w := engineWindow{Engine: r.name, Measurement: what, Round: round}
	var c0 citusCounters
	if r.citus {
		var err error
		if c0, err = r.nodes[0].counters(ctx); err != nil {
			return w, err
		}
	}
	q0 := r.statements.n.Load()
	cpu0 := make([]time.Duration, len(r.nodes))
	for i, n := range r.nodes {
		var err error
		if cpu0[i], err = n.cpu.sample(); err != nil {
			return w, err
		}
	}
	peaks := r.pollConnections(ctx)
	self0 := selfCPU()
	start := time.Now()
	units, lat, err := work()
	el := time.Since(start)
	self := selfCPU() - self0
	cpu1 := make([]time.Duration, len(r.nodes))
	for i, n := range r.nodes {
		var err error
		if cpu1[i], err = n.cpu.sample(); err != nil {
			return w, err
		}
	}
	w.Statements = r.statements.n.Load() - q0
	peak, perr := peaks()
	if err != nil {
		return w, err
	}
	if perr != nil {
		return w, perr
	}
	if r.citus {
		c1, err := r.nodes[0].counters(ctx)
		if err != nil {
			return w, err
		}
		d := c1.minus(c0)
		w.Citus = &d
	}
	w.Units, w.Seconds, w.PerSec, w.ClientCPU = units, el.Seconds(), float64(units)/el.Seconds(), self
	w.P50ms, w.P99ms = ms(lat.p50), ms(lat.p99)
	for i, n := range r.nodes {
		w.Nodes = append(w.Nodes, nodeWindow{Node: n.name, CPU: cpu1[i] - cpu0[i], PeakConns: peak[i]})
	}
	w.Load = loadAvg()
	return w, nil
}

// pollConnections counts each node's client connections every connPoll
// until the returned function is called, which stops the poller and
// returns each node's highest count.
func (r *engineRig) pollConnections(ctx context.Context) func() ([]int, error) {
	stop := make(chan struct{})
	done := make(chan struct{})
	peak := make([]int, len(r.nodes))
	var err error
	count := func() {
		for i, n := range r.nodes {
			c, e := n.connections(ctx)
			if e != nil {
				err = e
				return
			}
			peak[i] = max(peak[i], c)
		}
	}
	go func() {
		defer close(done)
		t := time.NewTicker(connPoll)
		defer t.Stop()
		for err == nil {
			count()
			select {
			case <-stop:
				return
			case <-ctx.Done():
				err = ctx.Err()
				return
			case <-t.C:
			}
		}
	}()
	return func() ([]int, error) {
		close(stop)
		<-done
		if err == nil {
			count() // the connections at the window's end, still open
		}
		return peak, err
	}
}

// nodeWindow is one node's share of a window.
type nodeWindow struct {
	Node string `json:"node"`
	// CPU is the node's server processes' user+system CPU in the window.
	CPU time.Duration `json:"cpu_ns"`
	// PeakConns is the most client connections to the benchmark's
	// database on the node seen during the window (polled every 250 ms),
	// the watcher's own not counted.
	PeakConns int `json:"peak_connections"`
}

// engineWindow is one measured round of one engine.
type engineWindow struct {
	Engine      string  `json:"engine"`
	Measurement string  `json:"measurement"`
	Round       int     `json:"round"`
	Units       int     `json:"units"` // claims, or keys reconciled
	Seconds     float64 `json:"seconds"`
	PerSec      float64 `json:"per_sec"`
	// P50ms and P99ms are a claim plus its completion (claims only).
	P50ms     float64       `json:"p50_ms,omitempty"`
	P99ms     float64       `json:"p99_ms,omitempty"`
	ClientCPU time.Duration `json:"client_cpu_ns"`
	// Statements are those the clients sent (a pgx tracer on their pools).
	Statements int64 `json:"statements"`
	// Citus holds the coordinator's counters over the window.
	Citus *citusCounters `json:"citus,omitempty"`
	Nodes []nodeWindow   `json:"nodes"`
	Load  string         `json:"load_after"`
}

func (w engineWindow) serverCPU() time.Duration {
	var t time.Duration
	for _, n := range w.Nodes {
		t += n.CPU
	}
	return t
}

func (w engineWindow) serverMsPer() float64 { return msPer(w.serverCPU(), w.Units) }
func (w engineWindow) clientMsPer() float64 { return msPer(w.ClientCPU, w.Units) }

func msPer(d time.Duration, units int) float64 {
	if units == 0 {
		return 0
	}
	return d.Seconds() * 1e3 / float64(units)
}

// nodeSummary is one node over all of an engine's rounds: CPU and
// transactions per unit (totals over totals), the highest connection
// count.
type nodeSummary struct {
	Node          string  `json:"node"`
	CPUMsPerUnit  float64 `json:"cpu_ms_per_unit"`
	PeakConns     int     `json:"peak_connections"`
	CPUMsPerRound float64 `json:"cpu_ms_per_round"`
}

// engineSummary is one engine and measurement over its rounds.
type engineSummary struct {
	Engine    string  `json:"engine"`
	Rounds    int     `json:"rounds"`
	PerSec    float64 `json:"per_sec_median"`
	PerSecMin float64 `json:"per_sec_min"`
	PerSecMax float64 `json:"per_sec_max"`
	P50ms     float64 `json:"p50_ms_median,omitempty"`
	P99ms     float64 `json:"p99_ms_median,omitempty"`
	// ServerMsPerUnit sums every node; ClientMsPerUnit is this process.
	ServerMsPerUnit float64 `json:"server_cpu_ms_per_unit"`
	ClientMsPerUnit float64 `json:"client_cpu_ms_per_unit"`
	// StatementsPerUnit are the clients' statements per claim or key.
	StatementsPerUnit float64       `json:"statements_per_unit"`
	Citus             *citusPerUnit `json:"citus,omitempty"`
	Nodes             []nodeSummary `json:"nodes"`
}

// citusPerUnit are the coordinator's counters per claim or key.
type citusPerUnit struct {
	SingleShard float64 `json:"single_shard"`
	MultiShard  float64 `json:"multi_shard"`
	Connected   float64 `json:"connections_opened"`
	Reused      float64 `json:"connections_reused"`
}

func summariseEngines(ws []engineWindow) []engineSummary {
	var out []engineSummary
	for _, name := range []string{"postgresql", "citus"} {
		s := engineSummary{Engine: name}
		var rates, p50, p99 []float64
		var units int
		var server, client time.Duration
		byNode := map[string]*nodeSummary{}
		var order []string
		cpu := map[string]time.Duration{}
		var statements int64
		var counters citusCounters
		for _, w := range ws {
			if w.Engine != name {
				continue
			}
			s.Rounds++
			rates, p50, p99 = append(rates, w.PerSec), append(p50, w.P50ms), append(p99, w.P99ms)
			units += w.Units
			server += w.serverCPU()
			client += w.ClientCPU
			statements += w.Statements
			if w.Citus != nil {
				counters.SingleShard += w.Citus.SingleShard
				counters.MultiShard += w.Citus.MultiShard
				counters.Connected += w.Citus.Connected
				counters.Reused += w.Citus.Reused
			}
			for _, n := range w.Nodes {
				ns, ok := byNode[n.Node]
				if !ok {
					ns = &nodeSummary{Node: n.Node}
					byNode[n.Node] = ns
					order = append(order, n.Node)
				}
				cpu[n.Node] += n.CPU
				ns.PeakConns = max(ns.PeakConns, n.PeakConns)
			}
		}
		if s.Rounds == 0 {
			continue
		}
		s.PerSec = median(rates)
		s.PerSecMin, s.PerSecMax = slices.Min(rates), slices.Max(rates)
		s.P50ms, s.P99ms = median(p50), median(p99)
		s.ServerMsPerUnit, s.ClientMsPerUnit = msPer(server, units), msPer(client, units)
		per := func(n int64) float64 { return float64(n) / float64(units) }
		s.StatementsPerUnit = per(statements)
		if name == "citus" {
			s.Citus = &citusPerUnit{SingleShard: per(counters.SingleShard), MultiShard: per(counters.MultiShard),
				Connected: per(counters.Connected), Reused: per(counters.Reused)}
		}
		for _, node := range order {
			ns := byNode[node]
			ns.CPUMsPerUnit = msPer(cpu[node], units)
			ns.CPUMsPerRound = cpu[node].Seconds() * 1e3 / float64(s.Rounds)
			s.Nodes = append(s.Nodes, *ns)
		}
		out = append(out, s)
	}
	return out
}

// engineRatios are Citus over PostgreSQL for one measurement.
type engineRatios struct {
	// PerSec is the ratio of the medians; Pairs each round's Citus figure
	// over the PostgreSQL one of the same round (run beside it).
	PerSec      float64   `json:"per_sec"`
	Pairs       []float64 `json:"per_sec_pairs"`
	ServerCPU   float64   `json:"server_cpu_per_unit"`
	ClientCPU   float64   `json:"client_cpu_per_unit"`
	TotalCPU    float64   `json:"total_cpu_per_unit"`
	Coordinator float64   `json:"coordinator_cpu_per_unit"`
}

func engineRatiosOf(ws []engineWindow, sum []engineSummary) engineRatios {
	var r engineRatios
	if len(sum) != 2 {
		return r
	}
	pg, ct := sum[0], sum[1]
	div := func(a, b float64) float64 {
		if b == 0 {
			return 0
		}
		return round2(a / b)
	}
	r.PerSec = div(ct.PerSec, pg.PerSec)
	r.ServerCPU = div(ct.ServerMsPerUnit, pg.ServerMsPerUnit)
	r.ClientCPU = div(ct.ClientMsPerUnit, pg.ClientMsPerUnit)
	r.TotalCPU = div(ct.ServerMsPerUnit+ct.ClientMsPerUnit, pg.ServerMsPerUnit+pg.ClientMsPerUnit)
	if len(ct.Nodes) > 0 {
		r.Coordinator = div(ct.Nodes[0].CPUMsPerUnit, pg.ServerMsPerUnit)
	}
	rounds := map[int]map[string]float64{}
	for _, w := range ws {
		if rounds[w.Round] == nil {
			rounds[w.Round] = map[string]float64{}
		}
		rounds[w.Round][w.Engine] = w.PerSec
	}
	for i := 1; i <= len(rounds); i++ {
		r.Pairs = append(r.Pairs, div(rounds[i]["citus"], rounds[i]["postgresql"]))
	}
	return r
}

type enginesReport struct {
	Clients           int     `json:"clients"`
	Duration          string  `json:"claims_round"`
	Rounds            int     `json:"rounds"`
	Backlog           int     `json:"backlog"`
	Concurrency       int     `json:"reconcile_concurrency"`
	LatencyMs         float64 `json:"downstream_latency_ms"`
	Workers           int     `json:"citus_workers"`
	Shards            int     `json:"citus_shards"`
	CitusVersion      string  `json:"citus_version"`
	PostgreSQLVersion string  `json:"postgresql_version"`

	Claims []engineWindow `json:"claims"`
	// RawClaims are hotpath's raw minimum (rawClaim, rawComplete: an
	// INSERT … ON CONFLICT DO NOTHING and an UPDATE), measured beside the
	// ledger's claim to tell its statement's shape from the engine.
	RawClaims       []engineWindow  `json:"claims_raw"`
	RawClaimSummary []engineSummary `json:"claims_raw_summary"`
	RawClaimRatios  engineRatios    `json:"claims_raw_citus_over_postgresql"`
	// OneStatementClaims are ledger.Claim in PostgreSQL's one-statement
	// shape on both engines: on Citus the shape claims had before the
	// upsert; on PostgreSQL the same work as Claims (its noise floor).
	OneStatementClaims  []engineWindow  `json:"claims_one_statement"`
	OneStatementSummary []engineSummary `json:"claims_one_statement_summary"`
	OneStatementRatios  engineRatios    `json:"claims_one_statement_citus_over_postgresql"`
	Reconcile           []engineWindow  `json:"reconcile"`
	ClaimSummary        []engineSummary `json:"claims_summary"`
	ReconcileSummary    []engineSummary `json:"reconcile_summary"`
	// Ratios are Citus over PostgreSQL.
	ClaimRatios     engineRatios `json:"claims_citus_over_postgresql"`
	ReconcileRatios engineRatios `json:"reconcile_citus_over_postgresql"`
	LoadBefore      string       `json:"load_before"`
	LoadAfter       string       `json:"load_after"`
}

func printEngines(w io.Writer, r enginesReport) {
	fmt.Fprintf(w, "PostgreSQL %s alone against Citus %s (a coordinator and %d workers, idempotency_keys in %d shards), one machine, rounds interleaved; load before %s, after %s\n",
		r.PostgreSQLVersion, r.CitusVersion, r.Workers, r.Shards, r.LoadBefore, r.LoadAfter)
	fmt.Fprintln(w, "every node with fsync, synchronous_commit and full_page_writes off (citustest's settings)")
	fmt.Fprintf(w, "claims: ledger.Claim then ledger.Complete of a fresh key, %d clients, %s per round, %d rounds per engine\n", r.Clients, r.Duration, r.Rounds)
	fmt.Fprintln(w, "claims, raw minimum: hotpath's two plain statements for the same work (INSERT … ON CONFLICT DO NOTHING RETURNING, UPDATE), beside each claims round")
	fmt.Fprintln(w, "claims, one-statement shape: ledger.Claim in PostgreSQL's shape on both engines (on Citus the shape before the upsert; on PostgreSQL the same as claims: its noise floor)")
	fmt.Fprintf(w, "reconcile: one pass over %d stuck keys, concurrency %d, %.0f ms downstream, self-check bracket on, %d rounds per engine\n\n",
		r.Backlog, r.Concurrency, r.LatencyMs, r.Rounds)
	for _, m := range []struct {
		title, unit string
		rounds      []engineWindow
		sum         []engineSummary
		ratios      engineRatios
	}{
		{"claims", "claim", r.Claims, r.ClaimSummary, r.ClaimRatios},
		{"claims, raw minimum", "claim", r.RawClaims, r.RawClaimSummary, r.RawClaimRatios},
		{"claims, one-statement shape", "claim", r.OneStatementClaims, r.OneStatementSummary, r.OneStatementRatios},
		{"reconcile", "key", r.Reconcile, r.ReconcileSummary, r.ReconcileRatios},
	} {
		fmt.Fprintf(w, "%s, round by round\n", m.title)
		tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
		fmt.Fprintf(tw, "round\tengine\t%ss\t%ss/s\tp50 ms\tp99 ms\tserver CPU ms/%s\tclient CPU ms/%s\tload after\t\n", m.unit, m.unit, m.unit, m.unit)
		for _, x := range m.rounds {
			fmt.Fprintf(tw, "%d\t%s\t%d\t%.0f\t%.2f\t%.2f\t%.3f\t%.3f\t%s\t\n", x.Round, x.Engine, x.Units, x.PerSec, x.P50ms, x.P99ms, x.serverMsPer(), x.clientMsPer(), x.Load)
		}
		tw.Flush()
		fmt.Fprintf(w, "\n%s by node (CPU: totals over the rounds per %s; connections: the most seen to the benchmark's database)\n", m.title, m.unit)
		tw = tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
		fmt.Fprintf(tw, "engine\t%ss/s (median, range)\tnode\tCPU ms/%s\tpeak connections\t\n", m.unit, m.unit)
		for _, s := range m.sum {
			rate := fmt.Sprintf("%.0f (%.0f–%.0f)", s.PerSec, s.PerSecMin, s.PerSecMax)
			for _, n := range s.Nodes {
				fmt.Fprintf(tw, "%s\t%s\t%s\t%.3f\t%d\t\n", s.Engine, rate, n.Node, n.CPUMsPerUnit, n.PeakConns)
				rate = ""
			}
			if len(s.Nodes) > 1 {
				fmt.Fprintf(tw, "%s\t\t%s\t%.3f\t\t\n", s.Engine, "all nodes", s.ServerMsPerUnit)
			}
			fmt.Fprintf(tw, "%s\t\t%s\t%.3f\t\t\n", s.Engine, "client (lkbench)", s.ClientMsPerUnit)
		}
		tw.Flush()
		for _, s := range m.sum {
			fmt.Fprintf(w, "%s: %.2f statements per %s from the client", s.Engine, s.StatementsPerUnit, m.unit)
			if c := s.Citus; c != nil {
				fmt.Fprintf(w, "; on the coordinator (citus_stat_counters) %.2f single-shard and %.3f multi-shard executions, %.3f connections opened to the workers and %.2f reused",
					c.SingleShard, c.MultiShard, c.Connected, c.Reused)
			}
			fmt.Fprintln(w)
		}
		x := m.ratios
		fmt.Fprintf(w, "\n%s, Citus / PostgreSQL: %ss/s %.2f (medians; round by round %s); CPU per %s: server %.2f (coordinator alone %.2f), client %.2f, server + client %.2f\n\n",
			m.title, m.unit, x.PerSec, joinRatios(x.Pairs), m.unit, x.ServerCPU, x.Coordinator, x.ClientCPU, x.TotalCPU)
	}
}

func joinRatios(v []float64) string {
	parts := make([]string, len(v))
	for i, f := range v {
		parts[i] = fmt.Sprintf("%.2f", f)
	}
	return strings.Join(parts, ", ")
}
