package main

import (
	"context"
	"fmt"
	"io"
	"io/fs"
	"math"
	neturl "net/url"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"golang.org/x/sys/unix"

	"github.com/ledgerkeeper/ledgerkeeper/ledger/ledgertest/pgembed"
)

// server is where a benchmark's databases live.
type server struct {
	adminURL string
	stop     func()
	// restart restarts an ephemeral cluster (pgembed.Server.Restart); nil
	// for a server given by URL, which a benchmark must not restart.
	restart func(ctx context.Context, whileDown func(dataDir string) error) error
}

// benchSettings make the ephemeral cluster a small but plausible server:
// fsync on (Durable), shared_buffers sized for a 2M-row ledger, WAL allowed
// to grow past one large DELETE so checkpoints do not land mid-measurement
// more for one variant than another.
var benchSettings = map[string]string{
	"shared_buffers":              "512MB",
	"max_wal_size":                "4GB",
	"checkpoint_timeout":          "15min",
	"log_min_messages":            "warning",
	"log_autovacuum_min_duration": "-1",
	// Per-statement WAL bytes, so a purge's WAL is told from the writer's.
	"shared_preload_libraries": "pg_stat_statements",
}

// startServer uses url, or starts an ephemeral durable cluster.
func startServer(ctx context.Context, url string, logf func(string, ...any)) (*server, error) {
	if url != "" {
		return &server{adminURL: url, stop: func() {}}, nil
	}
	return startEphemeral(ctx, true, logf)
}

// startEphemeral starts a cluster with benchSettings; durable false turns
// fsync, synchronous_commit and full_page_writes off (the test harness's
// cluster), to compare commit costs.
func startEphemeral(ctx context.Context, durable bool, logf func(string, ...any)) (*server, error) {
	if durable {
		logf("starting an ephemeral durable PostgreSQL cluster (fsync on)")
	} else {
		logf("starting an ephemeral PostgreSQL cluster with fsync and synchronous_commit off")
	}
	srv, err := pgembed.Start(ctx, pgembed.Options{Durable: durable, Settings: benchSettings, StartTimeout: 2 * time.Minute})
	if err != nil {
		return nil, err
	}
	return &server{adminURL: srv.URL, stop: srv.Stop, restart: srv.Restart}, nil
}

func (s *server) exec(ctx context.Context, sql string) error {
	conn, err := pgx.Connect(ctx, s.adminURL)
	if err != nil {
		return err
	}
	defer conn.Close(ctx)
	_, err = conn.Exec(ctx, sql)
	return err
}

// createDB creates name, from template when it is not "".
func (s *server) createDB(ctx context.Context, name, template string) (string, error) {
	_ = s.exec(ctx, "DROP DATABASE IF EXISTS "+pgx.Identifier{name}.Sanitize()+" WITH (FORCE)")
	q := "CREATE DATABASE " + pgx.Identifier{name}.Sanitize()
	if template != "" {
		// FILE_COPY: a file-level copy, not 1 GB of WAL (PostgreSQL 15+).
		q += " TEMPLATE " + pgx.Identifier{template}.Sanitize() + " STRATEGY FILE_COPY"
	}
	if err := s.exec(ctx, q); err != nil {
		return "", fmt.Errorf("create database %s: %w", name, err)
	}
	return pgembed.WithDatabase(s.adminURL, name), nil
}

func (s *server) dropDB(ctx context.Context, name string) {
	_ = s.exec(ctx, "DROP DATABASE IF EXISTS "+pgx.Identifier{name}.Sanitize()+" WITH (FORCE)")
}

// purgeRole is the role the purge variants connect as: pg_stat_statements
// counts WAL per role, which separates the purge's WAL from the writer's.
const purgeRole = "lkbench_purge"

// asRole returns u with its user replaced.
func asRole(u, role string) string {
	parsed, err := neturl.Parse(u)
	if err != nil {
		return u
	}
	parsed.User = neturl.User(role)
	return parsed.String()
}

// walMeter measures the WAL written by purgeRole's statements, when
// pg_stat_statements is loaded; ok is false otherwise.
type walMeter struct {
	db *pgxpool.Pool
	ok bool
}

func newWALMeter(ctx context.Context, admin *pgxpool.Pool, logf func(string, ...any)) walMeter {
	_, err := admin.Exec(ctx, `CREATE EXTENSION IF NOT EXISTS pg_stat_statements`)
	if err == nil {
		_, err = admin.Exec(ctx, `SELECT pg_stat_statements_reset()`)
	}
	if err == nil {
		_, err = admin.Exec(ctx, `DO $$ BEGIN
			IF NOT EXISTS (SELECT FROM pg_roles WHERE rolname = '`+purgeRole+`') THEN
				CREATE ROLE `+purgeRole+` LOGIN SUPERUSER;
			END IF; END $$`)
	}
	if err != nil {
		logf("no per-statement WAL (%v): estimating the purge's WAL by subtracting the writer's", err)
	}
	return walMeter{db: admin, ok: err == nil}
}

func (m walMeter) reset(ctx context.Context) error {
	if !m.ok {
		return nil
	}
	_, err := m.db.Exec(ctx, `SELECT pg_stat_statements_reset()`)
	return err
}

// bytes is the WAL the purge role's statements wrote since reset, and how
// many full-page images were among it (pg_stat_statements' wal_fpi: a
// page's first change after a checkpoint logs the whole 8 kB page, the
// bound a delete's WAL per row approaches when its rows are on different
// pages).
func (m walMeter) bytes(ctx context.Context) (walBytes, fpi int64, err error) {
	err = m.db.QueryRow(ctx, `SELECT coalesce(sum(wal_bytes), 0)::bigint, coalesce(sum(wal_fpi), 0)::bigint FROM pg_stat_statements
		WHERE userid = (SELECT oid FROM pg_roles WHERE rolname = $1)
		  AND dbid = (SELECT oid FROM pg_database WHERE datname = current_database())`, purgeRole).Scan(&walBytes, &fpi)
	return walBytes, fpi, err
}

func newPool(ctx context.Context, url string, maxConns int32, app string) (*pgxpool.Pool, error) {
	pc, err := pgxpool.ParseConfig(url)
	if err != nil {
		return nil, err
	}
	pc.MaxConns = maxConns
	pc.MinConns = maxConns
	pc.ConnConfig.RuntimeParams["application_name"] = app
	return pgxpool.NewWithConfig(ctx, pc)
}

func walLSN(ctx context.Context, db *pgxpool.Pool) (int64, error) {
	var n int64
	err := db.QueryRow(ctx, `SELECT pg_wal_lsn_diff(pg_current_wal_lsn(), '0/0')::bigint`).Scan(&n)
	return n, err
}

// sample is one request of an open-loop load: when it was scheduled and how
// long after that it finished (queueing included).
type sample struct {
	sched time.Time
	lat   time.Duration
	err   bool
}

// openLoop runs op at a fixed arrival rate, whatever the latency: request i
// is due at start + i/rate, and its latency counts from then, so a stall
// shows in every request it delays (no coordinated omission).
type openLoop struct {
	rate    float64
	workers int
	op      func(ctx context.Context, i int64) error

	mu      sync.Mutex
	samples []sample
}

// run generates load until ctx is done, then waits for the requests already
// due to finish.
func (l *openLoop) run(ctx context.Context) {
	due := make(chan struct {
		i     int64
		sched time.Time
	}, 1<<20)
	var wg sync.WaitGroup
	opCtx := context.WithoutCancel(ctx)
	for range l.workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for r := range due {
				err := l.op(opCtx, r.i)
				lat := time.Since(r.sched)
				l.mu.Lock()
				l.samples = append(l.samples, sample{sched: r.sched, lat: lat, err: err != nil})
				l.mu.Unlock()
			}
		}()
	}
	interval := time.Duration(float64(time.Second) / l.rate)
	start := time.Now()
	for i := int64(0); ; i++ {
		sched := start.Add(time.Duration(i) * interval)
		if d := time.Until(sched); d > 0 {
			t := time.NewTimer(d)
			select {
			case <-ctx.Done():
				t.Stop()
				close(due)
				wg.Wait()
				return
			case <-t.C:
			}
		} else if ctx.Err() != nil {
			close(due)
			wg.Wait()
			return
		}
		due <- struct {
			i     int64
			sched time.Time
		}{i, sched}
	}
}

// latency summarises the requests scheduled in [from, to).
type latency struct {
	N      int     `json:"n"`
	Errors int     `json:"errors"`
	P50ms  float64 `json:"p50_ms"`
	P99ms  float64 `json:"p99_ms"`
	MaxMs  float64 `json:"max_ms"`
}

func (l *openLoop) window(from, to time.Time) latency {
	l.mu.Lock()
	defer l.mu.Unlock()
	var lats []time.Duration
	var out latency
	for _, s := range l.samples {
		if s.sched.Before(from) || !s.sched.Before(to) {
			continue
		}
		if s.err {
			out.Errors++
		}
		lats = append(lats, s.lat)
	}
	out.N = len(lats)
	if out.N == 0 {
		return out
	}
	slices.Sort(lats)
	q := func(p float64) float64 {
		i := int(math.Ceil(p*float64(len(lats)))) - 1
		return ms(lats[max(0, min(i, len(lats)-1))])
	}
	out.P50ms, out.P99ms, out.MaxMs = q(0.50), q(0.99), ms(lats[len(lats)-1])
	return out
}

// excess sums, over the requests scheduled in [from, to), how much longer
// each took than base: the writer's extra waiting in milliseconds (a
// request faster than base counts negative, so noise sums towards zero),
// and how many requests that was.
func (l *openLoop) excess(from, to time.Time, base time.Duration) (ms float64, n int) {
	l.mu.Lock()
	defer l.mu.Unlock()
	var sum time.Duration
	for _, s := range l.samples {
		if s.sched.Before(from) || !s.sched.Before(to) {
			continue
		}
		sum += s.lat - base
		n++
	}
	return float64(sum) / 1e6, n
}

// mean is the mean latency of the requests scheduled in [from, to).
func (l *openLoop) mean(from, to time.Time) time.Duration {
	l.mu.Lock()
	defer l.mu.Unlock()
	var sum time.Duration
	n := 0
	for _, s := range l.samples {
		if s.sched.Before(from) || !s.sched.Before(to) {
			continue
		}
		sum += s.lat
		n++
	}
	if n == 0 {
		return 0
	}
	return sum / time.Duration(n)
}

func ms(d time.Duration) float64 { return math.Round(float64(d)/1e4) / 100 }

func logger(w io.Writer) func(string, ...any) {
	start := time.Now()
	return func(format string, args ...any) {
		fmt.Fprintf(w, "[%6.1fs] %s\n", time.Since(start).Seconds(), fmt.Sprintf(format, args...))
	}
}

// second is the writer's latency over one second of the run.
type second struct {
	T     int     `json:"t"` // seconds since the start of the timeline
	N     int     `json:"n"`
	P50ms float64 `json:"p50_ms"`
	MaxMs float64 `json:"max_ms"`
}

// timeline summarises [from, to) second by second, to see when a stall
// happened (a purge batch, a vacuum, a checkpoint, a neighbour's build).
func (l *openLoop) timeline(from, to time.Time) []second {
	var out []second
	for t := from; t.Before(to); t = t.Add(time.Second) {
		w := l.window(t, t.Add(time.Second))
		out = append(out, second{T: int(t.Sub(from) / time.Second), N: w.N, P50ms: w.P50ms, MaxMs: w.MaxMs})
	}
	return out
}

// buildLedgerkeeper builds the ledgerkeeper binary into dir for the
// subcommand sub (which runs the real serve), from the repository root.
func buildLedgerkeeper(ctx context.Context, dir, sub string, logf func(string, ...any), stderr io.Writer) (string, error) {
	bin := filepath.Join(dir, "ledgerkeeper")
	logf("building %s", bin)
	build := exec.CommandContext(ctx, "go", "build", "-o", bin, "./cmd/ledgerkeeper")
	build.Stdout, build.Stderr = stderr, stderr
	if err := build.Run(); err != nil {
		return "", fmt.Errorf("go build ./cmd/ledgerkeeper (run lkbench %s from the repository root, or pass --bin): %w", sub, err)
	}
	return bin, nil
}

// evictOSCache drops the operating system's cached pages of every file of
// every database under dataDir (posix_fadvise DONTNEED; the files must be
// clean, as after a shutdown), so that the next reads come from the disk:
// the cold case when the cache itself cannot be dropped (no root in
// /proc/sys/vm/drop_caches). The files must be readable by this process
// (root, or the cluster's owner).
func evictOSCache(dataDir string) error {
	root, err := os.OpenRoot(filepath.Join(dataDir, "base"))
	if err != nil {
		return fmt.Errorf("evict from the OS cache: %w", err)
	}
	defer root.Close()
	return fs.WalkDir(root.FS(), ".", func(path string, d fs.DirEntry, err error) error {
		if err != nil || !d.Type().IsRegular() {
			return err
		}
		f, err := root.Open(path)
		if err != nil {
			return fmt.Errorf("evict from the OS cache: %w", err)
		}
		defer f.Close()
		if err := unix.Fadvise(int(f.Fd()), 0, 0, unix.FADV_DONTNEED); err != nil {
			return fmt.Errorf("evict %s from the OS cache: %w", path, err)
		}
		return nil
	})
}
