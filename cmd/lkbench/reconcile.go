package main

import (
	"bufio"
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"math"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"runtime/pprof"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"
	"syscall"
	"text/tabwriter"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/ledgerkeeper/ledgerkeeper/migrations"
	"github.com/ledgerkeeper/ledgerkeeper/probes"
	"github.com/ledgerkeeper/ledgerkeeper/reconcile"
	"github.com/ledgerkeeper/ledgerkeeper/store"
)

// runReconcile measures one reconcile pass over stuck keys against a 20 ms
// HTTP downstream on two clusters started side by side: one with fsync and
// synchronous_commit off (the test harness's, where reconcile/bench_test.go
// runs) and one durable (production's). Passes alternate between them, so
// both see the same machine at the same moment. With --bracket both (the
// default) every measured pass is run twice on the same cluster, back to
// back and in alternating order: once with the self-check bracket around
// every batch of verdicts (reconcile/bracket.go) and once without.
func runReconcile(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("reconcile", flag.ContinueOnError)
	fs.SetOutput(stderr)
	keys := fs.Int("keys", 10_000, "stuck keys per pass")
	concurrency := fs.Int("concurrency", 32, "reconcile.concurrency (the pool has concurrency+4 connections, the daemon's default)")
	latency := fs.Duration("latency", 20*time.Millisecond, "the downstream's answer time")
	passes := fs.Int("passes", 3, "measured passes per cluster and variant (alternating), after one warm-up pass each")
	bracket := fs.String("bracket", "both", "the self-check bracket around each batch of verdicts: on, off (Policy.SelfCheckDisabled), or both side by side")
	cpuProfile := fs.String("cpuprofile", "", "write a CPU profile of the measured passes (every cluster and variant) to FILE")
	jsonOut := fs.String("json", "", "also write the results as JSON to FILE")
	planCache := fs.String("plan-cache-mode", "", "set plan_cache_mode for the benchmark database (auto, force_custom_plan, force_generic_plan; default: the server's)")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if *keys < 2 || *concurrency < 1 || *passes < 1 || *latency <= 0 {
		return fmt.Errorf("--keys must be at least 2, --concurrency and --passes at least 1, --latency positive")
	}
	variants, err := bracketVariants(*bracket)
	if err != nil {
		return err
	}
	logf := logger(stderr)

	if os.Getenv(downstreamEnv) != "" {
		return serveDownstream(*latency, stdout)
	}
	ds, err := startDownstream(*latency, 0)
	if err != nil {
		return err
	}
	defer ds.stop()

	type cluster struct {
		name    string
		durable bool
		srv     *server
		pool    *pgxpool.Pool
		engines map[string]*reconcile.Engine // by variant
		pg      *pgCPU
		runs    map[string][]passResult // by variant
	}
	clusters := []*cluster{{name: "fsync off, synchronous_commit off", durable: false}, {name: "fsync on, synchronous_commit on", durable: true}}
	devNull, err := os.OpenFile(os.DevNull, os.O_WRONLY, 0)
	if err != nil {
		return err
	}
	defer devNull.Close()
	for _, c := range clusters {
		srv, err := startEphemeral(ctx, c.durable, logf)
		if err != nil {
			return err
		}
		c.srv = srv
		defer srv.stop()
		url, err := srv.createDB(ctx, "lkbench_reconcile", "")
		if err != nil {
			return err
		}
		if *planCache != "" {
			if err := srv.exec(ctx, "ALTER DATABASE lkbench_reconcile SET plan_cache_mode = "+pgx.Identifier{*planCache}.Sanitize()); err != nil {
				return fmt.Errorf("--plan-cache-mode: %w", err)
			}
		}
		c.pool, err = newPool(ctx, url, int32(*concurrency+4), "ledgerkeeper") //nolint:gosec // G115: a benchmark flag; a pool beyond int32 is not a benchmark anyone runs
		if err != nil {
			return err
		}
		defer c.pool.Close()
		if _, err := migrations.Up(ctx, c.pool, nil); err != nil {
			return err
		}
		if c.pg, err = newPGCPU(ctx, c.pool); err != nil {
			return err
		}
		if _, err := c.pool.Exec(ctx, `CREATE EXTENSION IF NOT EXISTS pg_stat_statements`); err != nil {
			return err
		}
		hp, closeProbe, err := ds.probe(*concurrency)
		if err != nil {
			return err
		}
		defer closeProbe()
		// One engine per variant on the same pool and probe: they differ
		// only in the tool's SelfCheckDisabled.
		c.engines, c.runs = map[string]*reconcile.Engine{}, map[string][]passResult{}
		for _, v := range variants {
			c.engines[v] = benchEngine("lkbench", *concurrency, hp, v, c.pool, devNull)
		}
	}

	pass := func(c *cluster, variant string, n int) (passResult, error) {
		name := c.name + ", bracket " + variant
		if err := stuckKeys(ctx, c.pool, n); err != nil {
			return passResult{}, err
		}
		if _, err := c.pool.Exec(ctx, `SELECT pg_stat_statements_reset()`); err != nil {
			return passResult{}, err
		}
		hits0, err := ds.hits(ctx)
		if err != nil {
			return passResult{}, err
		}
		dsCPU0, err := ds.cpu()
		if err != nil {
			return passResult{}, err
		}
		cpu0, err := c.pg.sample()
		if err != nil {
			return passResult{}, err
		}
		self0 := selfCPU()
		start := time.Now()
		rep, err := c.engines[variant].Run(ctx, reconcile.Options{})
		el := time.Since(start)
		self := selfCPU() - self0
		cpu1, err2 := c.pg.sample()
		if err != nil {
			return passResult{}, err
		}
		if err2 != nil {
			return passResult{}, err2
		}
		if err := checkPass(rep, n, variant); err != nil {
			return passResult{}, fmt.Errorf("%s: %w", name, err)
		}
		dsCPU1, err := ds.cpu()
		if err != nil {
			return passResult{}, err
		}
		hits1, err := ds.hits(ctx)
		if err != nil {
			return passResult{}, err
		}
		seen := hits1.minus(hits0)
		if err := checkDownstream(seen, n, variant); err != nil {
			return passResult{}, fmt.Errorf("%s: %w", name, err)
		}
		stmts, err := topStatements(ctx, c.pool, 8)
		if err != nil {
			return passResult{}, err
		}
		return passResult{Bracket: variant, Keys: n, Seconds: el.Seconds(), KeysPerSec: float64(n) / el.Seconds(),
			Checks: seen.MadeUp, WitnessProbes: seen.Witnesses,
			GoCPU: self, PGCPU: cpu1 - cpu0, DownstreamCPU: dsCPU1 - dsCPU0, Statements: stmts}, nil
	}

	for _, c := range clusters {
		for _, v := range variants {
			logf("%s, bracket %s: warm-up pass", c.name, v)
			if _, err := pass(c, v, 4**concurrency); err != nil {
				return err
			}
		}
	}
	stopProfile, err := startCPUProfile(*cpuProfile)
	if err != nil {
		return err
	}
	defer stopProfile()
	load0 := loadAvg()
	var loads []string
	for i := range *passes {
		for j := range clusters {
			c := clusters[(i+j)%len(clusters)] // alternate which goes first
			for k := range variants {
				v := variants[(i+k)%len(variants)] // and which variant goes first on it
				r, err := pass(c, v, *keys)
				if err != nil {
					return err
				}
				c.runs[v] = append(c.runs[v], r)
				loads = append(loads, loadAvg())
				logf("%s, bracket %s: pass %d: %.0f keys/s, %d self-checks, %.0f µs CPU/key (Go %.0f, PostgreSQL %.0f), load %s",
					c.name, v, i+1, r.KeysPerSec, r.Checks, (r.GoCPU+r.PGCPU).Seconds()*1e6/float64(r.Keys),
					r.GoCPU.Seconds()*1e6/float64(r.Keys), r.PGCPU.Seconds()*1e6/float64(r.Keys), loads[len(loads)-1])
			}
		}
	}
	load1 := loadAvg()
	ideal := float64(*concurrency) / latency.Seconds()
	out := reconcileReport{Keys: *keys, Concurrency: *concurrency, LatencyMs: ms(*latency), Ideal: ideal,
		LoadBefore: load0, LoadDuring: loads, LoadAfter: load1, DurableRatio: map[string]float64{}}
	bySlot := map[string]clusterSummary{}
	for _, c := range clusters {
		for _, v := range variants {
			s := summarise(c.name, c.runs[v], ideal)
			s.Bracket = v
			bySlot[c.name+"/"+v] = s
			out.Clusters = append(out.Clusters, s)
		}
		if len(variants) == 2 {
			out.BracketRatios = append(out.BracketRatios, bracketRatioOf(c.name, bySlot[c.name+"/"+bracketOn], bySlot[c.name+"/"+bracketOff]))
		}
	}
	for _, v := range variants {
		if non, dur := bySlot[clusters[0].name+"/"+v], bySlot[clusters[1].name+"/"+v]; non.KeysPerSec > 0 {
			out.DurableRatio[v] = round2(dur.KeysPerSec / non.KeysPerSec)
		}
	}
	fmt.Fprintf(stdout, "reconcile pass over %d stuck keys, concurrency %d, downstream %s: ideal %.0f keys/s; load before %s, after %s\n\n",
		*keys, *concurrency, latency, ideal, load0, load1)
	tw := tabwriter.NewWriter(stdout, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "cluster\tbracket\tpasses\tkeys/s (median)\tkeys/s (range)\tof ideal\tself-checks per pass\tCPU µs/key\tengine µs/key\tPostgreSQL µs/key\tdownstream µs/key (apart)\t")
	for _, s := range out.Clusters {
		fmt.Fprintf(tw, "%s\t%s\t%d\t%.0f\t%.0f–%.0f\t%.2f\t%s\t%.0f\t%.0f\t%.0f\t%.0f\t\n", s.Name, s.Bracket, len(s.Passes), s.KeysPerSec, s.MinKeysPerSec, s.MaxKeysPerSec,
			s.OfIdeal, checksText(s.Passes), s.CPUPerKeyUs, s.GoCPUPerKeyUs, s.PGCPUPerKeyUs, s.DownstreamUs)
	}
	tw.Flush()
	fmt.Fprintln(stdout)
	for _, r := range out.BracketRatios {
		fmt.Fprintf(stdout, "%s: bracket on / off keys/s: %.2f (medians); back-to-back pairs: median %.2f, range %.2f–%.2f\n",
			r.Cluster, r.OnOverOff, r.PairMedian, r.PairMin, r.PairMax)
	}
	for _, v := range variants {
		if d, ok := out.DurableRatio[v]; ok {
			fmt.Fprintf(stdout, "bracket %s: durable / non-durable keys/s: %.2f\n", v, d)
		}
	}
	fmt.Fprintf(stdout, "load during: %s\n", strings.Join(loads, " | "))
	for _, s := range out.Clusters {
		last := s.Passes[len(s.Passes)-1]
		fmt.Fprintf(stdout, "\n%s, bracket %s, last pass: PostgreSQL statements by execution time (pg_stat_statements)\n", s.Name, s.Bracket)
		tw := tabwriter.NewWriter(stdout, 0, 0, 2, ' ', 0)
		fmt.Fprintln(tw, "calls\tper key\ttotal ms\tmean ms\tstatement")
		for _, st := range last.Statements {
			fmt.Fprintf(tw, "%d\t%.3f\t%.0f\t%.3f\t%s\n", st.Calls, float64(st.Calls)/float64(last.Keys), st.TotalMs, st.MeanMs, st.Query)
		}
		tw.Flush()
	}
	if *jsonOut != "" {
		b, _ := json.MarshalIndent(out, "", "  ")
		return os.WriteFile(*jsonOut, b, 0o644)
	}
	return nil
}

// The variants of --bracket: the engine with the self-check bracket around
// every batch of verdicts, and without (Policy.SelfCheckDisabled: verdicts
// go straight to the writers, the cost of a pass when a stored check
// vouched for ten minutes).
const (
	bracketOn  = "on"
	bracketOff = "off"
)

func bracketVariants(flag string) ([]string, error) {
	switch flag {
	case "both":
		return []string{bracketOff, bracketOn}, nil
	case bracketOn, bracketOff:
		return []string{flag}, nil
	}
	return nil, fmt.Errorf("--bracket must be on, off or both, not %q", flag)
}

// checkPass verifies a pass's report: every stuck key decided (none
// withheld by the bracket), half completed, half marked retryable; with the
// bracket, its last check trusted and witnessed.
func checkPass(rep reconcile.Report, n int, variant string) error {
	var withheld []string
	for a, k := range rep.Actions {
		if strings.HasPrefix(a, "withheld_") && k > 0 {
			withheld = append(withheld, fmt.Sprintf("%s %d", a, k))
		}
	}
	if rep.Withheld != 0 || len(withheld) > 0 {
		return fmt.Errorf("%d keys withheld (%s): the bracket gave verdicts back; tool reports %+v", rep.Withheld, strings.Join(withheld, ", "), rep.Tools)
	}
	done, retry := rep.Actions[reconcile.ActionCompleted], rep.Actions[reconcile.ActionMarkedRetryable]
	if rep.Decided != n || done != n/2 || retry != n-n/2 {
		return fmt.Errorf("pass over %d keys decided %d (%d completed, %d marked retryable; actions %v)", n, rep.Decided, done, retry, rep.Actions)
	}
	if variant == bracketOn {
		if len(rep.Tools) != 1 || rep.Tools[0].SelfCheck == nil {
			return fmt.Errorf("no self-check in the pass's report: %+v", rep.Tools)
		}
		if sc := rep.Tools[0].SelfCheck; !sc.Trusted() || !sc.Witnessed() {
			return fmt.Errorf("last self-check not trusted and witnessed: %s", sc.Summary)
		}
	}
	return nil
}

// checkDownstream verifies what the downstream saw during a pass: one
// lookup per stuck key; with the bracket, at least the opener and one
// closer (B+1 checks for B batches), each a made-up key and every witness.
func checkDownstream(seen downstreamHits, n int, variant string) error {
	if seen.Keys != int64(n) {
		return fmt.Errorf("the downstream saw %d lookups of stuck keys for %d keys", seen.Keys, n)
	}
	switch {
	case variant == bracketOff && (seen.MadeUp != 0 || seen.Witnesses != 0):
		return fmt.Errorf("without the bracket the downstream saw %d made-up keys and %d witness lookups", seen.MadeUp, seen.Witnesses)
	case variant == bracketOn && seen.MadeUp < 2:
		return fmt.Errorf("with the bracket the downstream saw %d self-checks (made-up keys), want at least 2 (opener and closer)", seen.MadeUp)
	case variant == bracketOn && seen.Witnesses != witnessKeys*seen.MadeUp:
		return fmt.Errorf("with the bracket the downstream saw %d witness lookups for %d self-checks, want %d each", seen.Witnesses, seen.MadeUp, witnessKeys)
	}
	return nil
}

// checksText lists the self-checks of each pass ("-" without the bracket).
func checksText(runs []passResult) string {
	var parts []string
	for _, r := range runs {
		if r.Bracket != bracketOn {
			return "-"
		}
		parts = append(parts, strconv.FormatInt(r.Checks, 10))
	}
	return strings.Join(parts, ", ")
}

// bracketRatio is one cluster's throughput with the bracket over without.
type bracketRatio struct {
	Cluster string `json:"cluster"`
	// OnOverOff is the ratio of the variants' medians.
	OnOverOff float64 `json:"on_over_off"`
	// Pair*: the ratio of each measured pass with the bracket over the one
	// without run beside it on the same cluster.
	PairRatios []float64 `json:"pair_ratios"`
	PairMedian float64   `json:"pair_median"`
	PairMin    float64   `json:"pair_min"`
	PairMax    float64   `json:"pair_max"`
}

func bracketRatioOf(cluster string, on, off clusterSummary) bracketRatio {
	r := bracketRatio{Cluster: cluster}
	if off.KeysPerSec > 0 {
		r.OnOverOff = round2(on.KeysPerSec / off.KeysPerSec)
	}
	for i := range min(len(on.Passes), len(off.Passes)) {
		r.PairRatios = append(r.PairRatios, round2(on.Passes[i].KeysPerSec/off.Passes[i].KeysPerSec))
	}
	if len(r.PairRatios) > 0 {
		sorted := slices.Sorted(slices.Values(r.PairRatios))
		r.PairMedian, r.PairMin, r.PairMax = sorted[len(sorted)/2], sorted[0], sorted[len(sorted)-1]
	}
	return r
}

type passResult struct {
	// Bracket is the variant: on (the self-check bracket) or off.
	Bracket    string        `json:"bracket"`
	Keys       int           `json:"keys"`
	Seconds    float64       `json:"seconds"`
	KeysPerSec float64       `json:"keys_per_sec"`
	GoCPU      time.Duration `json:"go_cpu_ns"`
	PGCPU      time.Duration `json:"pg_cpu_ns"`
	// DownstreamCPU is the downstream's process, not counted in the
	// others: it is the benchmark's, not ledgerkeeper's.
	DownstreamCPU time.Duration `json:"downstream_cpu_ns"`
	// Checks counts the self-checks the downstream saw (one made-up key
	// each); WitnessProbes the lookups of witness keys they made.
	Checks        int64       `json:"self_checks"`
	WitnessProbes int64       `json:"witness_probes"`
	Statements    []statement `json:"statements"`
}

// statement is one line of pg_stat_statements over a pass.
type statement struct {
	Query   string  `json:"query"`
	Calls   int64   `json:"calls"`
	TotalMs float64 `json:"total_ms"`
	MeanMs  float64 `json:"mean_ms"`
}

// topStatements is what pg_stat_statements recorded since its reset, the
// n statements with the most execution time first.
func topStatements(ctx context.Context, db *pgxpool.Pool, n int) ([]statement, error) {
	rows, err := db.Query(ctx, `SELECT regexp_replace(left(query, 70), '\s+', ' ', 'g'), calls, total_exec_time, mean_exec_time
		FROM pg_stat_statements WHERE dbid = (SELECT oid FROM pg_database WHERE datname = current_database())
		  AND query NOT LIKE '%pg_stat_statements%'
		ORDER BY total_exec_time DESC LIMIT $1`, n)
	if err != nil {
		return nil, err
	}
	var out []statement
	for rows.Next() {
		var s statement
		if err := rows.Scan(&s.Query, &s.Calls, &s.TotalMs, &s.MeanMs); err != nil {
			return nil, err
		}
		s.TotalMs, s.MeanMs = round2(s.TotalMs), math.Round(s.MeanMs*1000)/1000
		out = append(out, s)
	}
	return out, rows.Err()
}

type clusterSummary struct {
	Name          string       `json:"name"`
	Bracket       string       `json:"bracket"`
	Passes        []passResult `json:"passes"`
	KeysPerSec    float64      `json:"keys_per_sec_median"`
	MinKeysPerSec float64      `json:"keys_per_sec_min"`
	MaxKeysPerSec float64      `json:"keys_per_sec_max"`
	OfIdeal       float64      `json:"of_ideal"`
	CPUPerKeyUs   float64      `json:"cpu_us_per_key"`
	GoCPUPerKeyUs float64      `json:"go_cpu_us_per_key"`
	PGCPUPerKeyUs float64      `json:"pg_cpu_us_per_key"`
	DownstreamUs  float64      `json:"downstream_cpu_us_per_key"`
}

type reconcileReport struct {
	Keys        int     `json:"keys"`
	Concurrency int     `json:"concurrency"`
	LatencyMs   float64 `json:"latency_ms"`
	Ideal       float64 `json:"ideal_keys_per_sec"`
	// Clusters has one summary per cluster and variant.
	Clusters      []clusterSummary `json:"clusters"`
	BracketRatios []bracketRatio   `json:"bracket_on_over_off,omitempty"`
	// DurableRatio is durable over non-durable keys/s, by variant.
	DurableRatio map[string]float64 `json:"durable_over_non_durable"`
	LoadBefore   string             `json:"load_before"`
	LoadDuring   []string           `json:"load_during"`
	LoadAfter    string             `json:"load_after"`
}

func summarise(name string, runs []passResult, ideal float64) clusterSummary {
	s := clusterSummary{Name: name, Passes: runs}
	var rates []float64
	var keys int
	var goCPU, pgCPU, dsCPU time.Duration
	for _, r := range runs {
		dsCPU += r.DownstreamCPU
		rates = append(rates, r.KeysPerSec)
		keys += r.Keys
		goCPU += r.GoCPU
		pgCPU += r.PGCPU
	}
	sorted := slices.Sorted(slices.Values(rates))
	s.KeysPerSec = median(rates) // of an even number of passes: the mean of the middle two
	s.MinKeysPerSec, s.MaxKeysPerSec = sorted[0], sorted[len(sorted)-1]
	s.OfIdeal = round2(s.KeysPerSec / ideal)
	s.GoCPUPerKeyUs = goCPU.Seconds() * 1e6 / float64(keys)
	s.PGCPUPerKeyUs = pgCPU.Seconds() * 1e6 / float64(keys)
	s.CPUPerKeyUs = s.GoCPUPerKeyUs + s.PGCPUPerKeyUs
	s.DownstreamUs = dsCPU.Seconds() * 1e6 / float64(keys)
	return s
}

// benchEngine is the engine a reconcile benchmark measures: one tool,
// create_ticket, probed by probe at concurrency, its self-check bracket on
// or off (bracket), logging through a JSON handler at info to logs (as the
// daemon does; /dev/null here). pool is a *pgxpool.Pool or a ledger in a
// schema (ledger.InSchema).
func benchEngine(actor string, concurrency int, probe probes.Probe, bracket string, pool store.Pool, logs io.Writer) *reconcile.Engine {
	return reconcile.New(reconcile.Config{
		Actor:       actor,
		Concurrency: concurrency,
		BackoffBase: time.Hour,
		Tools: map[string]reconcile.Policy{"create_ticket": {
			ProcessingWindow: time.Minute, Concurrency: concurrency, Probe: probe, SelfCheckDisabled: bracket == bracketOff,
		}},
	}, pool, slog.New(slog.NewJSONHandler(logs, nil)), nil)
}

// execer runs a statement: a *pgxpool.Pool, or a ledger in a schema
// (ledger.InSchema), which qualifies the ledger's tables in it.
type execer interface {
	Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error)
}

// stuckKeys replaces the ledger with n keys of create_ticket, processing
// and claimed an hour ago (keys ending in an even digit exist downstream),
// and the witnesses, then checkpoints (so no pass pays for another's dirty
// pages).
func stuckKeys(ctx context.Context, db execer, n int) error {
	if err := loadStuck(ctx, db, n); err != nil {
		return err
	}
	if _, err := db.Exec(ctx, `CHECKPOINT`); err != nil {
		return fmt.Errorf("load stuck keys: %w", err)
	}
	return nil
}

// loadStuck is stuckKeys without the checkpoint: for loading many ledgers
// of one server, then checkpointing once.
func loadStuck(ctx context.Context, db execer, n int) error {
	for _, st := range []struct {
		q    string
		args []any
	}{
		{q: `TRUNCATE idempotency_keys, reconcile_state, reconcile_audit, probe_self_checks`},
		{q: `INSERT INTO idempotency_keys (key, tool, request_hash, request_body, created_at, claimed_at, expires_at)
		SELECT 'rk-' || lpad(i::text, 7, '0'), 'create_ticket', md5(i::text),
		       jsonb_build_object('customer_id', 'cus_' || (i % 1000), 'summary', 'bench ticket ' || i),
		       now() - interval '1 hour' + i * interval '1 ms', now() - interval '1 hour' + i * interval '1 ms',
		       now() + interval '1 day'
		FROM generate_series(1, $1::int) AS i`, args: []any{n}},
		// The self-check's present side: keys completed by their tool
		// server a minute ago (no reconciler audit row), the newest of the
		// tool, stored with the response_body the probe maps from the
		// downstream's ticket. Inserted for both variants, so that they
		// run on the same data; only the bracket's checks read them.
		{q: `INSERT INTO idempotency_keys (key, tool, request_hash, request_body, status, response_code, response_body,
		       created_at, claimed_at, updated_at, expires_at)
		SELECT k, 'create_ticket', md5(k), jsonb_build_object('customer_id', 'cus_witness', 'summary', 'witness ticket ' || i),
		       'completed', 201, jsonb_build_object('ticket_id', 'T-' || k, 'created_at', $2::text),
		       now() - interval '1 minute', now() - interval '1 minute', now() - interval '1 minute', now() + interval '1 day'
		FROM generate_series(1, $1::int) AS i, LATERAL (SELECT $3::text || (2 * i)::text AS k) w`,
			args: []any{witnessKeys, ticketCreatedAt, witnessPrefix}},
		{q: `VACUUM ANALYZE idempotency_keys, reconcile_state, reconcile_audit`},
	} {
		if _, err := db.Exec(ctx, st.q, st.args...); err != nil {
			return fmt.Errorf("load stuck keys: %w", err)
		}
	}
	return nil
}

// Witnesses: keys completed by their tool server whose tickets exist
// downstream (their names end in an even digit), as many as the engine's
// default self-check samples, so that every check probes each of them.
var witnessKeys = int64(reconcile.DefaultConfig().SelfCheck.Samples)

const (
	witnessPrefix = "lkbench-witness-"
	// ticketCreatedAt is every downstream ticket's created_at, stored
	// alike in the witnesses' response_body.
	ticketCreatedAt = "2026-11-30T04:00:00Z"
)

// downstreamEnv makes lkbench reconcile serve the downstream instead: the
// parent runs it as a child process, so that the engine's CPU (the lkbench
// process) is told from the downstream's. downstreamCapacityEnv, when set,
// is how many lookups it serves at once (see slowDownstream).
const (
	downstreamEnv         = "LKBENCH_RECONCILE_DOWNSTREAM"
	downstreamCapacityEnv = "LKBENCH_RECONCILE_DOWNSTREAM_CAPACITY"
)

// downstreamProc is the child process serving slowDownstream.
type downstreamProc struct {
	url  string
	cmd  *exec.Cmd
	stop func()
}

// startDownstream starts the downstream process: every lookup answered
// after latency, at most capacity of them at once (0: no bound).
func startDownstream(latency time.Duration, capacity int) (*downstreamProc, error) {
	exe, err := os.Executable()
	if err != nil {
		return nil, err
	}
	cmd := exec.Command(exe, "reconcile", "--latency", latency.String())
	cmd.Env = append(os.Environ(), downstreamEnv+"=1", downstreamCapacityEnv+"="+strconv.Itoa(capacity))
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	stdin, err := cmd.StdinPipe()
	if err != nil {
		return nil, err
	}
	out, err := cmd.StdoutPipe()
	if err != nil {
		return nil, err
	}
	cmd.Stderr = os.Stderr
	if err := cmd.Start(); err != nil {
		return nil, err
	}
	d := &downstreamProc{cmd: cmd, stop: func() { stdin.Close(); _ = cmd.Wait() }}
	line, err := bufio.NewReader(out).ReadString('\n')
	if err != nil {
		d.stop()
		return nil, fmt.Errorf("downstream process: %w", err)
	}
	d.url = strings.TrimSpace(line)
	return d, nil
}

// probe is an HTTP probe of the downstream's tickets, as a tool's probe
// is configured: concurrency probes in flight keep one idle connection
// each. close closes it and its connections.
func (d *downstreamProc) probe(concurrency int) (probe *probes.HTTPProbe, closeProbe func(), err error) {
	tr := &http.Transport{MaxIdleConns: 2 * concurrency, MaxIdleConnsPerHost: 2 * concurrency, IdleConnTimeout: time.Minute}
	hp, err := probes.NewHTTP(probes.HTTPConfig{
		URL:          d.url + "/v1/tickets?idempotency_key={key}",
		Match:        "data",
		ResponseCode: 201,
		ResponseBody: map[string]string{"ticket_id": "id", "created_at": "created_at"},
		Timeout:      5 * time.Second,
		Client:       &http.Client{Transport: tr},
	})
	if err != nil {
		tr.CloseIdleConnections()
		return nil, nil, err
	}
	return hp, func() { hp.Close(); tr.CloseIdleConnections() }, nil
}

// downstreamHits counts the lookups the downstream answered, by kind of
// key.
type downstreamHits struct {
	// Keys: the stuck keys (and anything else).
	Keys int64 `json:"keys"`
	// MadeUp: self-checks' made-up keys (reconcile.SelfCheckKeyPrefix),
	// one per check.
	MadeUp int64 `json:"made_up"`
	// Witnesses: the witness keys (witnessPrefix).
	Witnesses int64 `json:"witnesses"`
}

func (h downstreamHits) minus(o downstreamHits) downstreamHits {
	return downstreamHits{Keys: h.Keys - o.Keys, MadeUp: h.MadeUp - o.MadeUp, Witnesses: h.Witnesses - o.Witnesses}
}

// hits asks the downstream how many lookups it has answered.
func (d *downstreamProc) hits(ctx context.Context) (downstreamHits, error) {
	var h downstreamHits
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, d.url+"/hits", nil)
	if err != nil {
		return h, err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return h, err
	}
	defer resp.Body.Close()
	if err := json.NewDecoder(resp.Body).Decode(&h); err != nil {
		return h, fmt.Errorf("downstream /hits: %w", err)
	}
	return h, nil
}

// cpu is the downstream process's user+system CPU so far.
func (d *downstreamProc) cpu() (time.Duration, error) {
	f, err := procStat(d.cmd.Process.Pid)
	if err != nil {
		return 0, err
	}
	return ticks(f, 11, 12), nil
}

// serveDownstream is the child: it prints its URL and serves until its
// stdin closes.
func serveDownstream(latency time.Duration, stdout io.Writer) error {
	ds := &slowDownstream{latency: latency}
	if c, _ := strconv.Atoi(os.Getenv(downstreamCapacityEnv)); c > 0 {
		ds.slots = make(chan struct{}, c)
	}
	mux := http.NewServeMux()
	mux.Handle("/v1/", ds)
	mux.HandleFunc("/hits", func(w http.ResponseWriter, _ *http.Request) {
		_ = json.NewEncoder(w).Encode(downstreamHits{Keys: ds.keys.Load(), MadeUp: ds.madeUp.Load(), Witnesses: ds.witnesses.Load()})
	})
	srv := httptest.NewServer(mux)
	defer srv.Close()
	fmt.Fprintln(stdout, srv.URL)
	_, _ = io.Copy(io.Discard, os.Stdin)
	return nil
}

// slowDownstream answers every lookup after latency: found for keys
// ending in an even digit (the witnesses among them), not found for the
// others and for a self-check's made-up key, whatever its last character
// (a JSON absence: 200 with no ticket). It counts each kind apart. With
// slots, it serves at most cap(slots) lookups at once and the others wait
// their turn (a downstream of fixed capacity: its latency counts from the
// turn).
type slowDownstream struct {
	latency                 time.Duration
	slots                   chan struct{}
	keys, madeUp, witnesses atomic.Int64
}

func (d *slowDownstream) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	key := r.URL.Query().Get("idempotency_key")
	madeUp := strings.HasPrefix(key, reconcile.SelfCheckKeyPrefix)
	switch {
	case madeUp:
		d.madeUp.Add(1)
	case strings.HasPrefix(key, witnessPrefix):
		d.witnesses.Add(1)
	default:
		d.keys.Add(1)
	}
	if d.slots != nil {
		select {
		case d.slots <- struct{}{}:
			defer func() { <-d.slots }()
		case <-r.Context().Done():
			return
		}
	}
	t := time.NewTimer(d.latency)
	select {
	case <-t.C:
	case <-r.Context().Done():
		t.Stop()
		return
	}
	w.Header().Set("Content-Type", "application/json")
	if !madeUp && key != "" && strings.ContainsRune("02468", rune(key[len(key)-1])) {
		fmt.Fprintf(w, `{"data":[{"id":"T-%s","created_at":%q}]}`, key, ticketCreatedAt)
		return
	}
	_, _ = io.WriteString(w, `{"data":[]}`)
}

// selfCPU is this process's user+system CPU so far.
func selfCPU() time.Duration {
	var ru syscall.Rusage
	_ = syscall.Getrusage(syscall.RUSAGE_SELF, &ru)
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// pgCPU sums the CPU of one cluster's processes: the postmaster and every
// live child from /proc/PID/stat (utime+stime), plus the children it has
// reaped (cutime+cstime), so a backend that exits mid-pass still counts.
type pgCPU struct{ postmaster int }

// newPGCPU finds the postmaster of db's server: the parent of db's
// backend. db is a pool or a connection on that server.
func newPGCPU(ctx context.Context, db interface {
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
}) (*pgCPU, error) {
	var backend int
	if err := db.QueryRow(ctx, `SELECT pg_backend_pid()`).Scan(&backend); err != nil {
		return nil, err
	}
	f, err := procStat(backend)
	if err != nil {
		return nil, err
	}
	ppid, _ := strconv.Atoi(f[1])
	return &pgCPU{postmaster: ppid}, nil
}

// procStat returns the fields of /proc/pid/stat after the command (field 3,
// the state, is f[0]).
func procStat(pid int) ([]string, error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return nil, err
	}
	s := string(b)
	i := strings.LastIndexByte(s, ')')
	if i < 0 {
		return nil, fmt.Errorf("/proc/%d/stat: unexpected format", pid)
	}
	return strings.Fields(s[i+1:]), nil
}

// clockTick is USER_HZ, 100 on every Linux architecture Go supports.
const clockTick = 10 * time.Millisecond

func ticks(f []string, fields ...int) time.Duration {
	var n int64
	for _, i := range fields {
		v, _ := strconv.ParseInt(f[i], 10, 64)
		n += v
	}
	return time.Duration(n) * clockTick
}

func (c *pgCPU) sample() (time.Duration, error) {
	// utime, stime, cutime, cstime are fields 14-17 of stat, f[11]..f[14].
	f, err := procStat(c.postmaster)
	if err != nil {
		return 0, err
	}
	total := ticks(f, 11, 12, 13, 14)
	ents, err := os.ReadDir("/proc")
	if err != nil {
		return 0, err
	}
	want := strconv.Itoa(c.postmaster)
	for _, e := range ents {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		f, err := procStat(pid)
		if err != nil || len(f) < 15 || f[1] != want {
			continue
		}
		total += ticks(f, 11, 12)
	}
	return total, nil
}

// startCPUProfile starts a CPU profile to path ("" profiles nothing); the
// returned function stops it and closes the file.
func startCPUProfile(path string) (func(), error) {
	if path == "" {
		return func() {}, nil
	}
	f, err := os.Create(path)
	if err != nil {
		return nil, err
	}
	if err := pprof.StartCPUProfile(f); err != nil {
		f.Close()
		return nil, err
	}
	return func() { pprof.StopCPUProfile(); f.Close() }, nil
}
