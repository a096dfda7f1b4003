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
	"strconv"
	"strings"
	"sync/atomic"
	"syscall"
	"text/tabwriter"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/ledgerkeeper/ledgerkeeper/migrations"
	"github.com/ledgerkeeper/ledgerkeeper/probes"
	"github.com/ledgerkeeper/ledgerkeeper/reconcile"
)

// runReconcile measures one reconcile pass over stuck keys against a 20 ms
// HTTP downstream on two clusters started side by side: one with fsync and
// synchronous_commit off (the test harness's, where reconcile/bench_test.go
// runs) and one durable (production's). Passes alternate between them, so
// both see the same machine at the same moment.
func runReconcile(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("reconcile", flag.ContinueOnError)
	fs.SetOutput(stderr)
	keys := fs.Int("keys", 10_000, "stuck keys per pass")
	concurrency := fs.Int("concurrency", 32, "reconcile.concurrency (the pool has concurrency+4 connections, the daemon's default)")
	latency := fs.Duration("latency", 20*time.Millisecond, "the downstream's answer time")
	passes := fs.Int("passes", 3, "measured passes per cluster (alternating), after one warm-up pass each")
	cpuProfile := fs.String("cpuprofile", "", "write a CPU profile of the measured passes (both clusters) to FILE")
	jsonOut := fs.String("json", "", "also write the results as JSON to FILE")
	planCache := fs.String("plan-cache-mode", "", "set plan_cache_mode for the benchmark database (auto, force_custom_plan, force_generic_plan; default: the server's)")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if *keys < 2 || *concurrency < 1 || *passes < 1 || *latency <= 0 {
		return fmt.Errorf("--keys must be at least 2, --concurrency and --passes at least 1, --latency positive")
	}
	logf := logger(stderr)

	if os.Getenv(downstreamEnv) != "" {
		return serveDownstream(*latency, stdout)
	}
	ds, err := startDownstream(*latency)
	if err != nil {
		return err
	}
	defer ds.stop()

	type cluster struct {
		name    string
		durable bool
		srv     *server
		pool    *pgxpool.Pool
		engine  *reconcile.Engine
		pg      *pgCPU
		runs    []passResult
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
		c.pool, err = newPool(ctx, url, int32(*concurrency+4), "ledgerkeeper")
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
		// Like the daemon: one idle connection per probe in flight, and
		// the engine's logs through a JSON handler at info (to /dev/null).
		tr := &http.Transport{MaxIdleConns: 2 * *concurrency, MaxIdleConnsPerHost: 2 * *concurrency, IdleConnTimeout: time.Minute}
		defer tr.CloseIdleConnections()
		hp, err := probes.NewHTTP(probes.HTTPConfig{
			URL:          ds.url + "/v1/tickets?idempotency_key={key}",
			Match:        "data",
			ResponseCode: 201,
			ResponseBody: map[string]string{"ticket_id": "id", "created_at": "created_at"},
			Timeout:      5 * time.Second,
			Client:       &http.Client{Transport: tr},
		})
		if err != nil {
			return err
		}
		defer hp.Close()
		c.engine = reconcile.New(reconcile.Config{
			Actor:       "lkbench",
			Concurrency: *concurrency,
			BackoffBase: time.Hour,
			Tools: map[string]reconcile.Policy{"create_ticket": {
				ProcessingWindow: time.Minute, Concurrency: *concurrency, Probe: hp, SelfCheckDisabled: true,
			}},
		}, c.pool, slog.New(slog.NewJSONHandler(devNull, nil)), nil)
	}

	pass := func(c *cluster, n int) (passResult, error) {
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
		rep, err := c.engine.Run(ctx, reconcile.Options{})
		el := time.Since(start)
		self := selfCPU() - self0
		cpu1, err2 := c.pg.sample()
		if err != nil {
			return passResult{}, err
		}
		if err2 != nil {
			return passResult{}, err2
		}
		done, retry := rep.Actions[reconcile.ActionCompleted], rep.Actions[reconcile.ActionMarkedRetryable]
		if rep.Decided != n || done != n/2 || retry != n-n/2 {
			return passResult{}, fmt.Errorf("%s: pass over %d keys decided %d (%d completed, %d marked retryable; actions %v)",
				c.name, n, rep.Decided, done, retry, rep.Actions)
		}
		dsCPU1, err := ds.cpu()
		if err != nil {
			return passResult{}, err
		}
		hits1, err := ds.hits(ctx)
		if err != nil {
			return passResult{}, err
		}
		if got := hits1 - hits0; got != int64(n) {
			return passResult{}, fmt.Errorf("%s: the downstream saw %d requests for %d keys", c.name, got, n)
		}
		stmts, err := topStatements(ctx, c.pool, 8)
		if err != nil {
			return passResult{}, err
		}
		return passResult{Keys: n, Seconds: el.Seconds(), KeysPerSec: float64(n) / el.Seconds(),
			GoCPU: self, PGCPU: cpu1 - cpu0, DownstreamCPU: dsCPU1 - dsCPU0, Statements: stmts}, nil
	}

	for _, c := range clusters {
		logf("%s: warm-up pass", c.name)
		if _, err := pass(c, 4**concurrency); err != nil {
			return err
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
			r, err := pass(c, *keys)
			if err != nil {
				return err
			}
			c.runs = append(c.runs, r)
			loads = append(loads, loadAvg())
			logf("%s: pass %d: %.0f keys/s, %.0f µs CPU/key (Go %.0f, PostgreSQL %.0f), load %s", c.name, i+1, r.KeysPerSec,
				(r.GoCPU+r.PGCPU).Seconds()*1e6/float64(r.Keys), r.GoCPU.Seconds()*1e6/float64(r.Keys), r.PGCPU.Seconds()*1e6/float64(r.Keys), loads[len(loads)-1])
		}
	}
	ideal := float64(*concurrency) / latency.Seconds()
	out := reconcileReport{Keys: *keys, Concurrency: *concurrency, LatencyMs: ms(*latency), Ideal: ideal,
		LoadBefore: load0, LoadDuring: loads}
	for _, c := range clusters {
		s := summarise(c.name, c.runs, ideal)
		out.Clusters = append(out.Clusters, s)
	}
	if len(out.Clusters) == 2 && out.Clusters[0].KeysPerSec > 0 {
		out.DurableRatio = round2(out.Clusters[1].KeysPerSec / out.Clusters[0].KeysPerSec)
	}
	fmt.Fprintf(stdout, "reconcile pass over %d stuck keys, concurrency %d, downstream %s: ideal %.0f keys/s; load before %s\n\n",
		*keys, *concurrency, latency, ideal, load0)
	tw := tabwriter.NewWriter(stdout, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "cluster\tpasses\tkeys/s (median)\tkeys/s (range)\tof ideal\tCPU µs/key\tengine µs/key\tPostgreSQL µs/key\tdownstream µs/key (apart)\t")
	for _, s := range out.Clusters {
		fmt.Fprintf(tw, "%s\t%d\t%.0f\t%.0f–%.0f\t%.2f\t%.0f\t%.0f\t%.0f\t%.0f\t\n", s.Name, len(s.Passes), s.KeysPerSec, s.MinKeysPerSec, s.MaxKeysPerSec,
			s.OfIdeal, s.CPUPerKeyUs, s.GoCPUPerKeyUs, s.PGCPUPerKeyUs, s.DownstreamUs)
	}
	tw.Flush()
	fmt.Fprintf(stdout, "\ndurable / non-durable keys/s: %.2f; load during: %s\n", out.DurableRatio, strings.Join(loads, " | "))
	for _, s := range out.Clusters {
		last := s.Passes[len(s.Passes)-1]
		fmt.Fprintf(stdout, "\n%s, last pass: PostgreSQL statements by execution time (pg_stat_statements)\n", s.Name)
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

type passResult struct {
	Keys       int           `json:"keys"`
	Seconds    float64       `json:"seconds"`
	KeysPerSec float64       `json:"keys_per_sec"`
	GoCPU      time.Duration `json:"go_cpu_ns"`
	PGCPU      time.Duration `json:"pg_cpu_ns"`
	// DownstreamCPU is the downstream's process, not counted in the
	// others: it is the benchmark's, not ledgerkeeper's.
	DownstreamCPU time.Duration `json:"downstream_cpu_ns"`
	Statements    []statement   `json:"statements"`
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
	Keys         int              `json:"keys"`
	Concurrency  int              `json:"concurrency"`
	LatencyMs    float64          `json:"latency_ms"`
	Ideal        float64          `json:"ideal_keys_per_sec"`
	Clusters     []clusterSummary `json:"clusters"`
	DurableRatio float64          `json:"durable_over_non_durable"`
	LoadBefore   string           `json:"load_before"`
	LoadDuring   []string         `json:"load_during"`
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
	sorted := append([]float64(nil), rates...)
	for i := range sorted { // a handful of passes
		for j := i + 1; j < len(sorted); j++ {
			if sorted[j] < sorted[i] {
				sorted[i], sorted[j] = sorted[j], sorted[i]
			}
		}
	}
	s.KeysPerSec = sorted[len(sorted)/2]
	s.MinKeysPerSec, s.MaxKeysPerSec = sorted[0], sorted[len(sorted)-1]
	s.OfIdeal = round2(s.KeysPerSec / ideal)
	s.GoCPUPerKeyUs = goCPU.Seconds() * 1e6 / float64(keys)
	s.PGCPUPerKeyUs = pgCPU.Seconds() * 1e6 / float64(keys)
	s.CPUPerKeyUs = s.GoCPUPerKeyUs + s.PGCPUPerKeyUs
	s.DownstreamUs = dsCPU.Seconds() * 1e6 / float64(keys)
	return s
}

// stuckKeys replaces the ledger with n keys of create_ticket, processing
// and claimed an hour ago; keys ending in an even digit exist downstream.
func stuckKeys(ctx context.Context, db *pgxpool.Pool, n int) error {
	for _, q := range []string{
		`TRUNCATE idempotency_keys, reconcile_state, reconcile_audit`,
		`INSERT INTO idempotency_keys (key, tool, request_hash, request_body, created_at, claimed_at, expires_at)
		SELECT 'rk-' || lpad(i::text, 7, '0'), 'create_ticket', md5(i::text),
		       jsonb_build_object('customer_id', 'cus_' || (i % 1000), 'summary', 'bench ticket ' || i),
		       now() - interval '1 hour' + i * interval '1 ms', now() - interval '1 hour' + i * interval '1 ms',
		       now() + interval '1 day'
		FROM generate_series(1, $1::int) AS i`,
		`VACUUM ANALYZE idempotency_keys, reconcile_state, reconcile_audit`,
		`CHECKPOINT`, // so no pass pays for another's dirty pages
	} {
		var err error
		if strings.Contains(q, "$1") {
			_, err = db.Exec(ctx, q, n)
		} else {
			_, err = db.Exec(ctx, q)
		}
		if err != nil {
			return fmt.Errorf("load stuck keys: %w", err)
		}
	}
	return nil
}

// downstreamEnv makes lkbench reconcile serve the downstream instead: the
// parent runs it as a child process, so that the engine's CPU (the lkbench
// process) is told from the downstream's.
const downstreamEnv = "LKBENCH_RECONCILE_DOWNSTREAM"

// downstreamProc is the child process serving slowDownstream.
type downstreamProc struct {
	url  string
	cmd  *exec.Cmd
	stop func()
}

func startDownstream(latency time.Duration) (*downstreamProc, error) {
	exe, err := os.Executable()
	if err != nil {
		return nil, err
	}
	cmd := exec.Command(exe, "reconcile", "--latency", latency.String())
	cmd.Env = append(os.Environ(), downstreamEnv+"=1")
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

// hits asks the downstream how many lookups it has answered.
func (d *downstreamProc) hits(ctx context.Context) (int64, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, d.url+"/hits", nil)
	if err != nil {
		return 0, err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return 0, err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		return 0, err
	}
	return strconv.ParseInt(strings.TrimSpace(string(b)), 10, 64)
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
	mux := http.NewServeMux()
	mux.Handle("/v1/", ds)
	mux.HandleFunc("/hits", func(w http.ResponseWriter, _ *http.Request) {
		fmt.Fprintln(w, ds.hits.Load())
	})
	srv := httptest.NewServer(mux)
	defer srv.Close()
	fmt.Fprintln(stdout, srv.URL)
	_, _ = io.Copy(io.Discard, os.Stdin)
	return nil
}

// slowDownstream answers every lookup after latency: found for keys
// ending in an even digit, not found for the others.
type slowDownstream struct {
	latency time.Duration
	hits    atomic.Int64
}

func (d *slowDownstream) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	d.hits.Add(1)
	key := r.URL.Query().Get("idempotency_key")
	t := time.NewTimer(d.latency)
	select {
	case <-t.C:
	case <-r.Context().Done():
		t.Stop()
		return
	}
	w.Header().Set("Content-Type", "application/json")
	if key != "" && strings.ContainsRune("02468", rune(key[len(key)-1])) {
		fmt.Fprintf(w, `{"data":[{"id":"T-%s","created_at":"2026-11-30T04:00:00Z"}]}`, key)
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

func newPGCPU(ctx context.Context, db *pgxpool.Pool) (*pgCPU, error) {
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
