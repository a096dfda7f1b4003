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
		mode        = fs.String("mode", "serve", "serve (the daemon's first pass, run at start) or reconcile (the one-pass command)")
		concurrency = fs.Int("concurrency", 32, "reconcile.concurrency")
		interval    = fs.Duration("interval", 200*time.Millisecond, "how often VmRSS is sampled")
		foundEvery  = fs.Int("found-every", 2, "the downstream finds every Nth key (the pass completes it) and not the others (failed_retryable)")
		maxDuration = fs.Duration("max-duration", time.Hour, "reconcile.max_duration (0: leave it out, for a binary older than that setting)")
		jsonOut     = fs.String("json", "", "also write the results, RSS samples included, to this file as JSON")
	)
	if err := fs.Parse(args); err != nil {
		return err
	}
	if *mode != "serve" && *mode != "reconcile" {
		return fmt.Errorf("--mode must be serve or reconcile, not %q", *mode)
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
		*bin = filepath.Join(work, "ledgerkeeper")
		logf("building %s", *bin)
		build := exec.CommandContext(ctx, "go", "build", "-o", *bin, "./cmd/ledgerkeeper")
		build.Stdout, build.Stderr = stderr, stderr
		if err := build.Run(); err != nil {
			return fmt.Errorf("go build ./cmd/ledgerkeeper (run lkbench rss from the repository root, or pass --bin): %w", err)
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
%sdefaults:
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
	dbName := fmt.Sprintf("lkbench_rss_%d", s.keys)
	url, err := srv.createDB(ctx, dbName, "")
	if err != nil {
		return res, err
	}
	defer srv.dropDB(context.WithoutCancel(ctx), dbName)
	db, err := newPool(ctx, url, 2, "lkbench-rss")
	if err != nil {
		return res, err
	}
	defer db.Close()
	if _, err := migrations.Up(ctx, db, nil); err != nil {
		return res, err
	}
	logf("%d keys: loading", s.keys)
	// Stuck keys: claimed an hour ago, past the one-minute window, never
	// heartbeated; a request body of a real call's shape.
	if _, err := db.Exec(ctx, `INSERT INTO idempotency_keys (key, tool, request_hash, request_body, status,
		created_at, claimed_at, updated_at, expires_at)
	SELECT 'rss-' || i, 'create_ticket', md5(i::text) || md5((-i)::text),
	       jsonb_build_object('customer_id', 'cus_' || (i % 100000), 'amount_cents', i % 100000, 'summary', 'bench ticket ' || i),
	       'processing', now() - interval '1 hour', now() - interval '1 hour', now() - interval '1 hour', now() + interval '7 days'
	FROM generate_series(1, $1::bigint) i`, s.keys); err != nil {
		return res, fmt.Errorf("load: %w", err)
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
		case <-exited:
		case <-time.After(30 * time.Second):
			_ = cmd.Process.Kill()
			<-exited
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
			return res, fmt.Errorf("serve exited before its pass ended: %v (log: %s)", childErr, tail(logPath))
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
	if err := readGCTrace(logPath, &res); err != nil {
		return res, err
	}
	logf("%d keys: %.1fs, %.0f keys/s, peak VmRSS %d MiB (VmHWM %d MiB), max live heap %d MB over %d GCs",
		s.keys, res.PassSec, res.KeysPerS, res.PeakRSSKiB/1024, res.HWMKiB/1024, res.MaxLiveHeapMB, res.GCs)
	return res, nil
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

// gcLine matches the heap figures of a gctrace line:
// "gc 12 @3.456s 2%: ..., 4->5->2 MB, 8 MB goal, ...".
var gcLine = regexp.MustCompile(`^gc \d+ @.*?, (\d+)->(\d+)->(\d+) MB, `)

func readGCTrace(path string, res *rssResult) error {
	f, err := os.Open(path)
	if err != nil {
		return err
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		m := gcLine.FindStringSubmatch(sc.Text())
		if m == nil {
			continue
		}
		res.GCs++
		atStart, _ := strconv.ParseInt(m[1], 10, 64)
		peak, _ := strconv.ParseInt(m[2], 10, 64)
		live, _ := strconv.ParseInt(m[3], 10, 64)
		res.MaxHeapMB = max(res.MaxHeapMB, atStart, peak)
		res.MaxLiveHeapMB = max(res.MaxLiveHeapMB, live)
	}
	return sc.Err()
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
