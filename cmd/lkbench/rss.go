package main

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync/atomic"
	"syscall"
	"text/tabwriter"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/ledgerkeeper/ledgerkeeper/migrations"
)

// rssResult is one pass of the real ledgerkeeper binary over n stuck keys.
type rssResult struct {
	Keys    int64  `json:"keys"`
	Mode    string `json:"mode"`
	Decided int64  `json:"decided"`
	// Completed and Failed are the ledger's rows after the pass.
	Completed int64   `json:"completed"`
	Failed    int64   `json:"failed_retryable"`
	Left      int64   `json:"left_processing"`
	PassSec   float64 `json:"pass_seconds"`
	KeysPerS  float64 `json:"keys_per_second"`
	Requests  int64   `json:"downstream_requests"`
	// PeakRSSKiB is the largest VmRSS sampled; HWMKiB is the kernel's own
	// high-water mark (VmHWM) when the pass ended, which no sampling
	// interval can miss.
	PeakRSSKiB int64 `json:"peak_rss_kib"`
	HWMKiB     int64 `json:"vm_hwm_kib"`
	// RSSAfterKiB is VmRSS once the pass is over (serve: still running).
	RSSAfterKiB int64 `json:"rss_after_kib"`
	// From GODEBUG=gctrace=1: the largest live heap a GC left, the largest
	// heap a GC started at, and the number of GCs.
	MaxLiveHeapMB int64 `json:"max_live_heap_mb"`
	MaxHeapMB     int64 `json:"max_heap_at_gc_mb"`
	GCs           int   `json:"gcs"`
	// Samples are (seconds since start, VmRSS KiB, keys still processing).
	Samples []rssSample `json:"samples"`
}

type rssSample struct {
	T      float64 `json:"t"`
	RSSKiB int64   `json:"rss_kib"`
	Left   int64   `json:"left"`
}

func runRSS(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("lkbench rss", flag.ContinueOnError)
	fs.SetOutput(stderr)
	var (
		dbURL       = fs.String("database-url", "", "PostgreSQL server to use (the user must be able to create databases); default: an ephemeral durable cluster")
		bin         = fs.String("bin", "", "the ledgerkeeper binary to measure (default: go build ./cmd/ledgerkeeper into a temporary directory)")
		keyList     = fs.String("keys", "20000,200000", "backlog sizes to measure, in order: stuck processing keys of one tool")
		mode        = fs.String("mode", "serve", "serve (the daemon's first pass, run at start), reconcile (the one-pass command), or daemon (one serve through idle, a pass over --keys, a purge of --purge-rows)")
		purgeRows   = fs.Int64("purge-rows", 5_000_000, "daemon: expired rows the daemon's purge deletes")
		idle        = fs.Duration("idle", 10*time.Second, "daemon: the idle window sampled for the baseline")
		purgeDuty   = fs.Float64("purge-duty-cycle", 0, "daemon: retention.duty_cycle (0: the default)")
		purgeTarget = fs.Duration("purge-batch-target", 0, "daemon: retention.batch_target (0: the default)")
		concurrency = fs.Int("concurrency", 32, "reconcile.concurrency")
		interval    = fs.Duration("interval", 200*time.Millisecond, "how often VmRSS is sampled")
		foundEvery  = fs.Int("found-every", 2, "the downstream finds every Nth key (the pass completes it) and not the others (failed_retryable)")
		maxDuration = fs.Duration("max-duration", time.Hour, "reconcile.max_duration (0: leave it out, for a binary older than that setting)")
		jsonOut     = fs.String("json", "", "also write the results, RSS samples included, to this file as JSON")
	)
	if err := fs.Parse(args); err != nil {
		return err
	}
	if *mode != "serve" && *mode != "reconcile" && *mode != "daemon" {
		return fmt.Errorf("--mode must be serve, reconcile or daemon, not %q", *mode)
	}
	if *mode == "daemon" {
		set := map[string]bool{}
		fs.Visit(func(f *flag.Flag) { set[f.Name] = true })
		if !set["keys"] {
			*keyList = "200000"
		}
		if !set["interval"] {
			*interval = 100 * time.Millisecond
		}
		if *purgeRows <= 0 || *idle <= 0 || *purgeDuty < 0 || *purgeDuty > 1 || *purgeTarget < 0 {
			return errors.New("--purge-rows and --idle must be positive, --purge-duty-cycle in [0, 1], --purge-batch-target not negative")
		}
	}
	if *concurrency <= 0 || *interval <= 0 || *foundEvery <= 0 {
		return errors.New("--concurrency, --interval and --found-every must be positive")
	}
	var sizes []int64
	for _, s := range strings.Split(*keyList, ",") {
		n, err := strconv.ParseInt(strings.TrimSpace(strings.ReplaceAll(s, "_", "")), 10, 64)
		if err != nil || n <= 0 {
			return fmt.Errorf("--keys: %q is not a positive number", s)
		}
		sizes = append(sizes, n)
	}
	logf := logger(stderr)
	work, err := os.MkdirTemp("", "lkbench-rss-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(work)
	if *bin == "" {
		if *bin, err = buildLedgerkeeper(ctx, work, "rss", logf, stderr); err != nil {
			return err
		}
	}

	down := &downstream{foundEvery: int64(*foundEvery)}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return err
	}
	hs := &http.Server{Handler: down, ReadHeaderTimeout: 5 * time.Second}
	go func() { _ = hs.Serve(ln) }()
	defer hs.Close()

	srv, err := startServer(ctx, *dbURL, logf)
	if err != nil {
		return err
	}
	defer srv.stop()

	if *mode == "daemon" {
		if len(sizes) != 1 {
			return errors.New("--mode daemon takes one --keys size")
		}
		r, err := rssDaemon(ctx, srv, daemonSetup{bin: *bin, work: work, keys: sizes[0], purge: *purgeRows, concurrency: *concurrency,
			interval: *interval, idle: *idle, purgeDuty: *purgeDuty, purgeTarget: *purgeTarget,
			downstream: "http://" + ln.Addr().String(), found: down}, logf)
		if err != nil {
			return err
		}
		fmt.Fprintf(stdout, "ledgerkeeper serve, reconcile.concurrency %d, downstream on loopback answering at once (found every %d keys), VmRSS and /metrics every %s\n\n",
			*concurrency, *foundEvery, *interval)
		printDaemonResult(stdout, r)
		if *jsonOut != "" {
			b, _ := json.MarshalIndent(map[string]any{"mode": *mode, "concurrency": *concurrency, "found_every": *foundEvery,
				"interval": interval.String(), "result": r}, "", "  ")
			return os.WriteFile(*jsonOut, b, 0o644)
		}
		return nil
	}
	var results []rssResult
	for _, n := range sizes {
		if ctx.Err() != nil {
			return ctx.Err()
		}
		r, err := rssRun(ctx, srv, rssSetup{bin: *bin, work: work, mode: *mode, keys: n, concurrency: *concurrency,
			interval: *interval, maxDuration: *maxDuration, downstream: "http://" + ln.Addr().String(), found: down}, logf)
		if err != nil {
			return fmt.Errorf("%d keys: %w", n, err)
		}
		results = append(results, r)
	}
	fmt.Fprintf(stdout, "ledgerkeeper %s, reconcile.concurrency %d, downstream on loopback answering at once (found every %d keys), VmRSS every %s\n\n",
		*mode, *concurrency, *foundEvery, *interval)
	printRSSResults(stdout, results)
	if *jsonOut != "" {
		b, _ := json.MarshalIndent(map[string]any{"mode": *mode, "concurrency": *concurrency, "found_every": *foundEvery,
			"interval": interval.String(), "results": results}, "", "  ")
		if err := os.WriteFile(*jsonOut, b, 0o644); err != nil {
			return err
		}
	}
	return nil
}

// downstream is the tool's downstream as the probe sees it: it finds key
// rss-I when I is a multiple of foundEvery, and answers at once.
type downstream struct {
	foundEvery int64
	requests   atomic.Int64
}

func (d *downstream) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	d.requests.Add(1)
	key := r.URL.Query().Get("idempotency_key")
	w.Header().Set("Content-Type", "application/json")
	if i, err := strconv.ParseInt(strings.TrimPrefix(key, "rss-"), 10, 64); err == nil && strings.HasPrefix(key, "rss-") && i%d.foundEvery == 0 {
		fmt.Fprintf(w, `{"data":[{"id":"T-%d","created_at":"2026-01-01T00:00:00Z"}]}`, i)
		return
	}
	_, _ = io.WriteString(w, `{"data":[]}`)
}

type rssSetup struct {
	bin, work, mode string
	keys            int64
	concurrency     int
	interval        time.Duration
	maxDuration     time.Duration
	downstream      string
	found           *downstream
}

// rssConfig is the configuration the measured binary runs with: one tool
// with an http probe, every schedule an hour apart so serve runs exactly
// one pass of each job (at start), and (rssMaxDuration) a time budget no
// pass here reaches.
const rssConfig = `schedule:
  reconcile: "@every 1h"
  purge: "@every 1h"
  alerts: "@every 1h"
reconcile:
  concurrency: %d
%s` + rssTool

// rssTool is the measured tool, create_ticket, with an http probe of the
// downstream (its base URL in %s).
const rssTool = `defaults:
  processing_window: 1m
tools:
  create_ticket:
    processing_window: 1m
    probe:
      type: http
      url: "%s/v1/tickets?idempotency_key={key}"
      timeout: 5s
      match: "data"
      response_code: 201
      response_body: {ticket_id: "id", created_at: "created_at"}
`

func rssMaxDuration(d time.Duration) string {
	if d == 0 {
		return ""
	}
	return fmt.Sprintf("  max_duration: %s\n", d)
}

func rssRun(ctx context.Context, srv *server, s rssSetup, logf func(string, ...any)) (rssResult, error) {
	res := rssResult{Keys: s.keys, Mode: s.mode}
	url, db, done, err := migratedDB(ctx, srv, fmt.Sprintf("lkbench_rss_%d", s.keys))
	if err != nil {
		return res, err
	}
	defer done()
	logf("%d keys: loading", s.keys)
	if err := loadStuckKeys(ctx, db, s.keys); err != nil {
		return res, err
	}
	if _, err := db.Exec(ctx, `VACUUM (ANALYZE) idempotency_keys`); err != nil {
		return res, err
	}

	cfgPath := filepath.Join(s.work, fmt.Sprintf("rss-%d.yaml", s.keys))
	if err := os.WriteFile(cfgPath, fmt.Appendf(nil, rssConfig, s.concurrency, rssMaxDuration(s.maxDuration), s.downstream), 0o600); err != nil {
		return res, err
	}
	logPath := filepath.Join(s.work, fmt.Sprintf("rss-%d.log", s.keys))
	logFile, err := os.Create(logPath)
	if err != nil {
		return res, err
	}
	defer logFile.Close()
	args := []string{"--config", cfgPath, "--database-url", url}
	if s.mode == "serve" {
		args = append(args, "serve", "--listen", "127.0.0.1:0")
	} else {
		args = append(args, "reconcile", "--json")
	}
	cmd := exec.Command(s.bin, args...)
	cmd.Env = append(os.Environ(), "GODEBUG=gctrace=1")
	// A killed lkbench takes its ledgerkeeper with it.
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGTERM}
	var out strings.Builder
	cmd.Stdout, cmd.Stderr = &out, logFile
	requests0 := s.found.requests.Load()
	logf("%d keys: %s", s.keys, strings.Join(append([]string{filepath.Base(s.bin)}, args[4:]...), " "))
	start := time.Now()
	if err := cmd.Start(); err != nil {
		return res, err
	}
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()
	stopChild := func() {
		_ = cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-exited: //nolint:errcheck // a child we stopped: its exit status is no result
		case <-time.After(30 * time.Second):
			_ = cmd.Process.Kill()
			<-exited //nolint:errcheck // killed: its exit status is no result
		}
	}

	pid := cmd.Process.Pid
	tick := time.NewTicker(s.interval)
	defer tick.Stop()
	var lastLeft time.Time
	left := s.keys
	var passEnd time.Time
	var passStart time.Time
	var childErr error
	childDone := false
sampling:
	for {
		select {
		case <-ctx.Done():
			stopChild()
			return res, ctx.Err()
		case childErr = <-exited:
			childDone = true
			break sampling
		case <-tick.C:
		}
		st, err := procStatus(pid)
		if err != nil {
			continue // exiting
		}
		if time.Since(lastLeft) >= time.Second {
			lastLeft = time.Now()
			_ = db.QueryRow(ctx, `SELECT count(*) FROM idempotency_keys WHERE status = 'processing'`).Scan(&left)
		}
		res.Samples = append(res.Samples, rssSample{T: ms(time.Since(start)) / 1000, RSSKiB: st["VmRSS"], Left: left})
		res.PeakRSSKiB = max(res.PeakRSSKiB, st["VmRSS"])
		res.HWMKiB = st["VmHWM"]
		if s.mode == "serve" {
			if passEnd.IsZero() {
				var started, finished time.Time
				var decided int64
				err := db.QueryRow(ctx, `SELECT started_at, finished_at, coalesce((stats->>'keys')::bigint, 0)
					FROM ledgerkeeper_runs WHERE kind = 'reconcile' ORDER BY id LIMIT 1`).Scan(&started, &finished, &decided)
				if err == nil {
					passStart, passEnd, res.Decided = started, finished, decided
					logf("%d keys: pass over after %.1fs; RSS two seconds more", s.keys, finished.Sub(started).Seconds())
				}
			} else if time.Since(passEnd) > 2*time.Second {
				res.RSSAfterKiB = st["VmRSS"]
				res.HWMKiB = st["VmHWM"]
				stopChild()
				break sampling
			}
		}
	}
	if s.mode == "reconcile" {
		if !childDone {
			return res, errors.New("reconcile did not exit")
		}
		if childErr != nil {
			return res, fmt.Errorf("ledgerkeeper reconcile: %w (log: %s)", childErr, tail(logPath))
		}
		// The kernel's high-water mark of an exited child: its rusage.
		if ru, ok := cmd.ProcessState.SysUsage().(*syscall.Rusage); ok {
			res.HWMKiB = ru.Maxrss
		}
		var rep struct {
			Decided  int64 `json:"decided"`
			Duration int64 `json:"duration_ns"`
		}
		if err := json.Unmarshal([]byte(out.String()), &rep); err != nil {
			return res, fmt.Errorf("read reconcile --json: %w", err)
		}
		res.Decided = rep.Decided
		res.PassSec = float64(rep.Duration) / 1e9
	} else {
		if childDone {
			return res, fmt.Errorf("serve exited before its pass ended: %v (log: %s)", childErr, tail(logPath)) //nolint:errorlint // childErr is nil when serve exited 0: %w would print %!w(<nil>)
		}
		res.PassSec = passEnd.Sub(passStart).Seconds()
	}
	if res.PassSec > 0 {
		res.KeysPerS = float64(res.Decided) / res.PassSec
	}
	res.Requests = s.found.requests.Load() - requests0
	if err := db.QueryRow(ctx, `SELECT count(*) FILTER (WHERE status = 'completed'), count(*) FILTER (WHERE status = 'failed_retryable'),
		count(*) FILTER (WHERE status = 'processing') FROM idempotency_keys`).Scan(&res.Completed, &res.Failed, &res.Left); err != nil {
		return res, err
	}
	gcs, err := readGCTrace(logPath)
	if err != nil {
		return res, err
	}
	for _, g := range gcs {
		res.GCs++
		res.MaxHeapMB = max(res.MaxHeapMB, g.atStartMB, g.peakMB)
		res.MaxLiveHeapMB = max(res.MaxLiveHeapMB, g.liveMB)
	}
	logf("%d keys: %.1fs, %.0f keys/s, peak VmRSS %d MiB (VmHWM %d MiB), max live heap %d MB over %d GCs",
		s.keys, res.PassSec, res.KeysPerS, res.PeakRSSKiB/1024, res.HWMKiB/1024, res.MaxLiveHeapMB, res.GCs)
	return res, nil
}

// migratedDB creates the database name with the schema, and returns its URL,
// a small pool on it, and done, which closes the pool and drops it.
func migratedDB(ctx context.Context, srv *server, name string) (string, *pgxpool.Pool, func(), error) {
	url, err := srv.createDB(ctx, name, "")
	if err != nil {
		return "", nil, nil, err
	}
	drop := func() { srv.dropDB(context.WithoutCancel(ctx), name) }
	db, err := newPool(ctx, url, 2, "lkbench-rss")
	if err != nil {
		drop()
		return "", nil, nil, err
	}
	done := func() { db.Close(); drop() }
	if _, err := migrations.Up(ctx, db, nil); err != nil {
		done()
		return "", nil, nil, err
	}
	return url, db, done, nil
}

// loadStuckKeys inserts n stuck keys rss-1..n of create_ticket: claimed an
// hour ago, past the one-minute window, never heartbeated; a request body
// of a real call's shape.
func loadStuckKeys(ctx context.Context, db *pgxpool.Pool, n int64) error {
	_, err := db.Exec(ctx, `INSERT INTO idempotency_keys (key, tool, request_hash, request_body, status,
		created_at, claimed_at, updated_at, expires_at)
	SELECT 'rss-' || i, 'create_ticket', md5(i::text) || md5((-i)::text),
	       jsonb_build_object('customer_id', 'cus_' || (i % 100000), 'amount_cents', i % 100000, 'summary', 'bench ticket ' || i),
	       'processing', now() - interval '1 hour', now() - interval '1 hour', now() - interval '1 hour', now() + interval '7 days'
	FROM generate_series(1, $1::bigint) i`, n)
	if err != nil {
		return fmt.Errorf("load stuck keys: %w", err)
	}
	return nil
}

// procStatus reads the kB fields of /proc/PID/status (VmRSS, VmHWM, ...).
func procStatus(pid int) (map[string]int64, error) {
	f, err := os.Open(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return nil, err
	}
	defer f.Close()
	out := map[string]int64{}
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		name, rest, ok := strings.Cut(sc.Text(), ":")
		fields := strings.Fields(rest)
		if !ok || len(fields) != 2 || fields[1] != "kB" {
			continue
		}
		if v, err := strconv.ParseInt(fields[0], 10, 64); err == nil {
			out[name] = v
		}
	}
	return out, sc.Err()
}

// gcLine matches a gctrace line: when (seconds since the process started)
// and its heap figures, "gc 12 @3.456s 2%: ..., 4->5->2 MB, 8 MB goal, ...".
var gcLine = regexp.MustCompile(`^gc \d+ @([0-9.]+)s .*?, (\d+)->(\d+)->(\d+) MB, `)

// gcEvent is one GC of a gctrace: when (seconds since the process
// started), the heap at its start and its peak, and the live heap it left.
type gcEvent struct {
	t                 float64
	atStartMB, peakMB int64
	liveMB            int64
}

// readGCTrace reads every GC of a child's log.
func readGCTrace(path string) ([]gcEvent, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	var out []gcEvent
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		m := gcLine.FindStringSubmatch(sc.Text())
		if m == nil {
			continue
		}
		var g gcEvent
		g.t, _ = strconv.ParseFloat(m[1], 64)
		g.atStartMB, _ = strconv.ParseInt(m[2], 10, 64)
		g.peakMB, _ = strconv.ParseInt(m[3], 10, 64)
		g.liveMB, _ = strconv.ParseInt(m[4], 10, 64)
		out = append(out, g)
	}
	return out, sc.Err()
}

// tail is the end of a child's log, for an error message.
func tail(path string) string {
	b, _ := os.ReadFile(path)
	var lines []string
	for _, l := range strings.Split(strings.TrimSpace(string(b)), "\n") {
		if !strings.HasPrefix(l, "gc ") {
			lines = append(lines, l)
		}
	}
	return strings.Join(lines[max(0, len(lines)-5):], " | ")
}

func printRSSResults(w io.Writer, results []rssResult) {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "keys\tdecided\tcompleted\tfailed_retryable\tleft\tpass s\tkeys/s\tpeak VmRSS MiB\tVmHWM MiB\tratio\tafter MiB\tmax live heap MB\tmax heap MB\tGCs\t")
	var base float64
	for i, r := range results {
		if i == 0 {
			base = float64(r.HWMKiB) // ratios are to the first size
		}
		after := "–" // reconcile: the process has exited
		if r.RSSAfterKiB > 0 {
			after = fmt.Sprintf("%.1f", float64(r.RSSAfterKiB)/1024)
		}
		fmt.Fprintf(tw, "%d\t%d\t%d\t%d\t%d\t%.1f\t%.0f\t%.1f\t%.1f\t%.2fx\t%s\t%d\t%d\t%d\t\n",
			r.Keys, r.Decided, r.Completed, r.Failed, r.Left, r.PassSec, r.KeysPerS,
			float64(r.PeakRSSKiB)/1024, float64(r.HWMKiB)/1024, float64(r.HWMKiB)/base,
			after, r.MaxLiveHeapMB, r.MaxHeapMB, r.GCs)
	}
	tw.Flush()
}

// The daemon mode: one `serve` process through three phases on one
// database, sampled throughout: idle (the baseline), a pass over --keys
// stuck keys, then a purge of --purge-rows expired rows.

// phaseResult is the memory of serve through one phase.
type phaseResult struct {
	Phase string `json:"phase"`
	// Rows is what the phase worked through: keys decided, or rows purged.
	Rows     int64   `json:"rows"`
	Seconds  float64 `json:"seconds"`
	RowsPerS float64 `json:"rows_per_second"`
	// StartRSSKiB is VmRSS just before the phase's work began; PeakRSSKiB
	// the largest VmRSS sampled during it; EndRSSKiB the last sample of it.
	StartRSSKiB int64 `json:"start_rss_kib"`
	PeakRSSKiB  int64 `json:"peak_rss_kib"`
	EndRSSKiB   int64 `json:"end_rss_kib"`
	// MeanRSSKiB is the mean of the phase's samples (the idle phase's is
	// the baseline the others are compared with).
	MeanRSSKiB int64 `json:"mean_rss_kib"`
	// HWMKiB is the kernel's high-water mark VmHWM at the phase's end.
	HWMKiB int64 `json:"vm_hwm_kib"`
	// Go heap from /metrics (go_memstats_heap_inuse_bytes), in bytes.
	StartHeapInuse int64 `json:"start_heap_inuse_bytes"`
	PeakHeapInuse  int64 `json:"peak_heap_inuse_bytes"`
	EndHeapInuse   int64 `json:"end_heap_inuse_bytes"`
	// From GODEBUG=gctrace=1: the largest live heap a GC of the phase left.
	MaxLiveHeapMB int64 `json:"max_live_heap_mb"`
	GCs           int   `json:"gcs"`
	// Samples counts the samples taken in the phase.
	Samples int `json:"samples"`
}

// daemonSample is one sample of serve: VmRSS and VmHWM (KiB), the Go heap
// in use and the goroutines (from /metrics, -1 if the scrape failed).
type daemonSample struct {
	T          float64 `json:"t"`
	Phase      string  `json:"phase"`
	RSSKiB     int64   `json:"rss_kib"`
	HWMKiB     int64   `json:"hwm_kib"`
	HeapInuse  int64   `json:"heap_inuse_bytes"`
	HeapAlloc  int64   `json:"heap_alloc_bytes"`
	Goroutines int64   `json:"goroutines"`
}

// rssDaemonConfig: reconcile and purge every 10 s (a pass starts soon after
// its rows appear; SkipIfStillRunning keeps a long pass from overlapping
// itself), budgets no phase here reaches.
const rssDaemonConfig = `schedule:
  reconcile: "@every 10s"
  purge: "@every 10s"
  alerts: "@every 1h"
reconcile:
  concurrency: %d
  max_duration: 1h
retention:
  max_duration: 1h
%s` + rssTool

type daemonSetup struct {
	bin, work   string
	keys, purge int64
	concurrency int
	interval    time.Duration
	idle        time.Duration
	// purgeDuty and purgeTarget, when set, are retention.duty_cycle and
	// retention.batch_target: a purge of millions of rows at the defaults
	// takes an hour on a busy machine, and its memory does not depend on
	// its pace.
	purgeDuty   float64
	purgeTarget time.Duration
	downstream  string
	found       *downstream
}

type daemonResult struct {
	Keys      int64          `json:"keys"`
	PurgeRows int64          `json:"purge_rows"`
	Completed int64          `json:"completed"`
	Failed    int64          `json:"failed_retryable"`
	Left      int64          `json:"left_processing"`
	Remaining int64          `json:"expired_rows_left"`
	Requests  int64          `json:"downstream_requests"`
	Phases    []phaseResult  `json:"phases"`
	Samples   []daemonSample `json:"samples"`
}

func rssDaemon(ctx context.Context, srv *server, s daemonSetup, logf func(string, ...any)) (daemonResult, error) {
	res := daemonResult{Keys: s.keys, PurgeRows: s.purge}
	url, db, done, err := migratedDB(ctx, srv, "lkbench_rss_daemon")
	if err != nil {
		return res, err
	}
	defer done()
	cfgPath := filepath.Join(s.work, "rss-daemon.yaml")
	var pacing string
	if s.purgeDuty > 0 {
		pacing += fmt.Sprintf("  duty_cycle: %v\n", s.purgeDuty)
	}
	if s.purgeTarget > 0 {
		pacing += fmt.Sprintf("  batch_target: %s\n", s.purgeTarget)
	}
	if err := os.WriteFile(cfgPath, fmt.Appendf(nil, rssDaemonConfig, s.concurrency, pacing, s.downstream), 0o600); err != nil {
		return res, err
	}
	logPath := filepath.Join(s.work, "rss-daemon.log")
	logFile, err := os.Create(logPath)
	if err != nil {
		return res, err
	}
	defer logFile.Close()
	port, err := freePort()
	if err != nil {
		return res, err
	}
	metricsURL := fmt.Sprintf("http://127.0.0.1:%d/metrics", port)
	cmd := exec.Command(s.bin, "--config", cfgPath, "--database-url", url, "serve", "--listen", fmt.Sprintf("127.0.0.1:%d", port))
	cmd.Env = append(os.Environ(), "GODEBUG=gctrace=1")
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGTERM}
	cmd.Stdout, cmd.Stderr = logFile, logFile
	start := time.Now()
	if err := cmd.Start(); err != nil {
		return res, err
	}
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()
	defer func() {
		_ = cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-exited: //nolint:errcheck // a child we stopped: its exit status is no result
		case <-time.After(30 * time.Second):
			_ = cmd.Process.Kill()
			<-exited //nolint:errcheck // killed: its exit status is no result
		}
	}()

	// The sampler runs until the end; phase names the samples it takes.
	var phase atomic.Value
	phase.Store("start")
	samples := make(chan daemonSample, 1<<16)
	sampleCtx, stopSampling := context.WithCancel(ctx)
	defer stopSampling()
	samplerDone := make(chan struct{})
	go func() {
		defer close(samplerDone)
		defer close(samples)
		client := &http.Client{Timeout: max(5*s.interval, time.Second)}
		tick := time.NewTicker(s.interval)
		defer tick.Stop()
		for {
			select {
			case <-sampleCtx.Done():
				return
			case <-tick.C:
			}
			st, err := procStatus(cmd.Process.Pid)
			if err != nil {
				continue
			}
			m := scrapeGo(client, metricsURL)
			samples <- daemonSample{T: ms(time.Since(start)) / 1000, Phase: phase.Load().(string), RSSKiB: st["VmRSS"], HWMKiB: st["VmHWM"],
				HeapInuse: m["go_memstats_heap_inuse_bytes"], HeapAlloc: m["go_memstats_heap_alloc_bytes"], Goroutines: m["go_goroutines"]}
		}
	}()
	var collected []daemonSample
	collect := func() {
		for {
			select {
			case smp, ok := <-samples:
				if !ok {
					return
				}
				collected = append(collected, smp)
			default:
				return
			}
		}
	}
	// waitFor polls cond every 200 ms (collecting samples) until it holds,
	// serve exits, or limit passes.
	waitFor := func(what string, limit time.Duration, cond func() (bool, error)) error {
		deadline := time.Now().Add(limit)
		for {
			collect()
			ok, err := cond()
			if err != nil {
				return err
			}
			if ok {
				return nil
			}
			if time.Now().After(deadline) {
				return fmt.Errorf("%s: not within %s (log: %s)", what, limit, tail(logPath))
			}
			select {
			case err := <-exited:
				exited <- err
				return fmt.Errorf("serve exited while waiting for %s: %v (log: %s)", what, err, tail(logPath)) //nolint:errorlint // err is nil when serve exited 0: %w would print %!w(<nil>)
			case <-ctx.Done():
				return ctx.Err()
			case <-time.After(200 * time.Millisecond):
			}
		}
	}
	runCount := func(kind, field string) func() (bool, error) {
		return func() (bool, error) {
			var n int64
			err := db.QueryRow(ctx, `SELECT count(*) FROM ledgerkeeper_runs WHERE kind = $1
				AND coalesce((stats->>$2)::bigint, 0) > 0`, kind, field).Scan(&n)
			return n > 0, err
		}
	}
	marks := map[string][2]float64{} // phase -> [start, end] seconds since start
	mark := func() float64 { return ms(time.Since(start)) / 1000 }

	// Start-up: serve runs every job once at start, over an empty ledger.
	if err := waitFor("serve's start-up passes", 2*time.Minute, func() (bool, error) {
		var n int64
		err := db.QueryRow(ctx, `SELECT count(DISTINCT kind) FROM ledgerkeeper_runs WHERE kind IN ('reconcile', 'purge')`).Scan(&n)
		return n == 2 && len(collected) > 0 && collected[len(collected)-1].HeapInuse > 0, err
	}); err != nil {
		return res, err
	}
	logf("daemon: serve up (pid %d); idle baseline for %s", cmd.Process.Pid, s.idle)
	phase.Store("idle")
	t := mark()
	if err := sleepCtx(ctx, s.idle); err != nil {
		return res, err
	}
	marks["idle"] = [2]float64{t, mark()}

	// The pass: stuck keys appear at once; the next reconcile pass takes them.
	phase.Store("pass")
	t = mark()
	logf("daemon: inserting %d stuck keys", s.keys)
	if err := loadStuckKeys(ctx, db, s.keys); err != nil {
		return res, err
	}
	requests0 := s.found.requests.Load()
	if err := waitFor("the pass over the stuck keys", time.Hour, runCount("reconcile", "keys")); err != nil {
		return res, err
	}
	marks["pass"] = [2]float64{t, mark()}
	res.Requests = s.found.requests.Load() - requests0
	var passRows int64
	var passSec float64
	if err := db.QueryRow(ctx, `SELECT (stats->>'keys')::bigint, extract(epoch FROM finished_at - started_at)::float8
		FROM ledgerkeeper_runs WHERE kind = 'reconcile' AND coalesce((stats->>'keys')::bigint, 0) > 0 ORDER BY id LIMIT 1`).Scan(&passRows, &passSec); err != nil {
		return res, err
	}
	logf("daemon: pass decided %d keys in %.1fs", passRows, passSec)

	// Between: load the expired rows (serve idles; its passes find nothing
	// to do until the load commits).
	phase.Store("load")
	t = mark()
	logf("daemon: loading %d expired rows", s.purge)
	t0 := time.Now()
	if _, err := db.Exec(ctx, `INSERT INTO idempotency_keys (key, tool, request_hash, request_body, status,
		response_code, response_body, created_at, claimed_at, updated_at, expires_at)
	SELECT 'old-' || i || ':' || t.tool, t.tool, md5(i::text) || md5((-i)::text),
	       jsonb_build_object('customer_id', 'cus_' || (i % 100000), 'amount_cents', i % 100000, 'summary', 'bench ticket ' || i),
	       CASE WHEN i % 97 = 0 THEN 'failed_retryable' ELSE 'completed' END,
	       CASE WHEN i % 97 = 0 THEN NULL ELSE 201 END,
	       CASE WHEN i % 97 = 0 THEN NULL ELSE jsonb_build_object('ticket_id', 'T-' || i) END,
	       t.c, t.c, t.c + interval '2 seconds', t.c + interval '20 days'
	FROM generate_series(1, $1::bigint) i,
	     LATERAL (SELECT (ARRAY['create_ticket', 'charge_card', 'send_email', 'update_crm'])[1 + i % 4] AS tool,
	                     now() - interval '40 days' + i * (interval '10 days' / $1::bigint) AS c) t`, s.purge); err != nil {
		return res, fmt.Errorf("load expired rows: %w", err)
	}
	// Settled pages and fresh statistics, as an old ledger's are.
	if _, err := db.Exec(ctx, `VACUUM (ANALYZE) idempotency_keys`); err != nil {
		return res, err
	}
	logf("daemon: loaded and vacuumed in %s", time.Since(t0).Round(time.Second))
	marks["load"] = [2]float64{t, mark()}

	phase.Store("purge")
	t = mark()
	if err := waitFor("the purge of the expired rows", 2*time.Hour, runCount("purge", "keys_deleted")); err != nil {
		return res, err
	}
	var purgeRows int64
	var purgeSec float64
	if err := db.QueryRow(ctx, `SELECT (stats->>'keys_deleted')::bigint, extract(epoch FROM finished_at - started_at)::float8
		FROM ledgerkeeper_runs WHERE kind = 'purge' AND coalesce((stats->>'keys_deleted')::bigint, 0) > 0 ORDER BY id LIMIT 1`).Scan(&purgeRows, &purgeSec); err != nil {
		return res, err
	}
	logf("daemon: purge deleted %d rows in %.1fs", purgeRows, purgeSec)
	marks["purge"] = [2]float64{t, mark()}
	phase.Store("after")
	if err := sleepCtx(ctx, 2*time.Second); err != nil {
		return res, err
	}
	stopSampling()
	<-samplerDone
	collect()
	for smp := range samples {
		collected = append(collected, smp)
	}
	res.Samples = collected

	if err := db.QueryRow(ctx, `SELECT count(*) FILTER (WHERE status = 'completed' AND key LIKE 'rss-%'),
		count(*) FILTER (WHERE status = 'failed_retryable' AND key LIKE 'rss-%'),
		count(*) FILTER (WHERE status = 'processing'), count(*) FILTER (WHERE key LIKE 'old-%') FROM idempotency_keys`).Scan(
		&res.Completed, &res.Failed, &res.Left, &res.Remaining); err != nil {
		return res, err
	}
	gcs, err := readGCTrace(logPath)
	if err != nil {
		return res, err
	}
	for _, p := range []struct {
		name string
		rows int64
		sec  float64
	}{{"idle", 0, 0}, {"pass", passRows, passSec}, {"load", 0, 0}, {"purge", purgeRows, purgeSec}} {
		res.Phases = append(res.Phases, summarisePhase(p.name, p.rows, p.sec, marks[p.name], collected, gcs))
	}
	return res, nil
}

// summarisePhase sums up the samples of one phase, window [from, to]
// seconds since serve started, and the GCs that ran in it.
func summarisePhase(name string, rows int64, sec float64, window [2]float64, samples []daemonSample, gcs []gcEvent) phaseResult {
	pr := phaseResult{Phase: name, Rows: rows, Seconds: round2(sec)}
	var sum int64
	if sec > 0 {
		pr.RowsPerS = float64(int64(float64(rows) / sec))
	}
	for _, smp := range samples {
		if smp.T < window[0] || smp.T > window[1] {
			continue
		}
		if pr.Samples == 0 {
			pr.StartRSSKiB = smp.RSSKiB
		}
		pr.Samples++
		sum += smp.RSSKiB
		pr.PeakRSSKiB = max(pr.PeakRSSKiB, smp.RSSKiB)
		pr.EndRSSKiB, pr.HWMKiB = smp.RSSKiB, smp.HWMKiB
		if smp.HeapInuse >= 0 { // -1: that scrape failed
			if pr.StartHeapInuse == 0 {
				pr.StartHeapInuse = smp.HeapInuse
			}
			pr.PeakHeapInuse = max(pr.PeakHeapInuse, smp.HeapInuse)
			pr.EndHeapInuse = smp.HeapInuse
		}
	}
	if pr.Samples > 0 {
		pr.MeanRSSKiB = sum / int64(pr.Samples)
	}
	for _, g := range gcs {
		if g.t >= window[0] && g.t <= window[1] {
			pr.GCs++
			pr.MaxLiveHeapMB = max(pr.MaxLiveHeapMB, g.liveMB)
		}
	}
	return pr
}

// scrapeGo reads the Go runtime's gauges from a /metrics page; a failed
// scrape gives -1 for each.
func scrapeGo(client *http.Client, url string) map[string]int64 {
	out := map[string]int64{"go_memstats_heap_inuse_bytes": -1, "go_memstats_heap_alloc_bytes": -1, "go_goroutines": -1}
	resp, err := client.Get(url) //nolint:noctx // bounded by the client's Timeout
	if err != nil {
		return out
	}
	defer resp.Body.Close()
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		name, val, ok := strings.Cut(sc.Text(), " ")
		if _, want := out[name]; !ok || !want {
			continue
		}
		if f, err := strconv.ParseFloat(strings.TrimSpace(val), 64); err == nil {
			out[name] = int64(f)
		}
	}
	return out
}

// freePort asks the kernel for a loopback port that is free now.
func freePort() (int, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	defer ln.Close()
	return ln.Addr().(*net.TCPAddr).Port, nil
}

func printDaemonResult(w io.Writer, r daemonResult) {
	var base float64
	for _, p := range r.Phases {
		if p.Phase == "idle" && p.Samples > 0 {
			base = float64(p.MeanRSSKiB)
		}
	}
	mib := func(kib int64) string { return fmt.Sprintf("%.1f", float64(kib)/1024) }
	mb := func(b int64) string { return fmt.Sprintf("%.1f", float64(b)/1e6) }
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "phase\trows\tseconds\trows/s\tstart VmRSS MiB\tmean MiB\tpeak MiB\tend MiB\tpeak/baseline\tVmHWM MiB\theap inuse start MB\tpeak MB\tend MB\tmax live heap MB\tGCs\tsamples\t")
	for _, p := range r.Phases {
		ratio := "–"
		if base > 0 {
			ratio = fmt.Sprintf("%.2fx", float64(p.PeakRSSKiB)/base)
		}
		fmt.Fprintf(tw, "%s\t%d\t%.1f\t%.0f\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%d\t%d\t%d\t\n", p.Phase, p.Rows, p.Seconds, p.RowsPerS,
			mib(p.StartRSSKiB), mib(p.MeanRSSKiB), mib(p.PeakRSSKiB), mib(p.EndRSSKiB), ratio, mib(p.HWMKiB),
			mb(p.StartHeapInuse), mb(p.PeakHeapInuse), mb(p.EndHeapInuse), p.MaxLiveHeapMB, p.GCs, p.Samples)
	}
	tw.Flush()
	fmt.Fprintf(w, "\nbaseline: the idle phase's mean VmRSS, %.1f MiB\n", base/1024)
	fmt.Fprintf(w, "stuck keys %d: %d completed, %d failed_retryable, %d left processing, %d downstream requests; expired rows %d: %d left\n",
		r.Keys, r.Completed, r.Failed, r.Left, r.Requests, r.PurgeRows, r.Remaining)
}
