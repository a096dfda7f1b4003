package main

import (
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
	"slices"
	"strconv"
	"strings"
	"sync"
	"text/tabwriter"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/ledgerkeeper/ledgerkeeper/expiry"
	"github.com/ledgerkeeper/ledgerkeeper/internal/daemon"
	"github.com/ledgerkeeper/ledgerkeeper/migrations"
	"github.com/ledgerkeeper/ledgerkeeper/store"
)

// bigTools is the ledger's spread of tools: name and share in percent.
var bigTools = []struct {
	name  string
	share int
}{
	{"create_ticket", 30}, {"charge_card", 20}, {"send_email", 25},
	{"update_crm", 15}, {"search_docs", 8}, {"refund_payment", 2},
}

// The operator population, rebuilt before each size is measured (the
// reconcile pass and the purge change it): keys op-1 … op-N.
const (
	bigDue       = 1000 // create_ticket, stuck and due: the reconcile pass's work
	bigBackedOff = 500  // 100 per other tool, stuck, backed off an hour
	bigHeld      = 40   // stuck and on hold, mixed tools
	bigInFlight  = 300  // claimed now, inside the window
	bigOpKeys    = bigDue + bigBackedOff + bigHeld + bigInFlight
)

// bigWindow is every tool's processing_window in the benchmark's
// configuration; the grace is the default 10s.
const bigWindow = 30 * time.Minute

// bigMeasure is one measurement at one size.
type bigMeasure struct {
	Name string `json:"name"`
	// Seconds are the repetitions' durations; Median, Min and Max theirs.
	Seconds []float64 `json:"seconds"`
	Median  float64   `json:"median_seconds"`
	Min     float64   `json:"min_seconds"`
	Max     float64   `json:"max_seconds"`
	// Every repetition runs right after a CHECKPOINT (every page's first
	// change logs a full-page image), so a write's cost does not depend on
	// how long ago the last one ran. WALBytes and FPI are the WAL written
	// and the full-page images logged during each (nothing else writes
	// meanwhile; FPI -1: no pg_stat_statements).
	AfterCheckpoint bool    `json:"after_checkpoint"`
	WALBytes        []int64 `json:"wal_bytes,omitempty"`
	FPI             []int64 `json:"wal_fpi,omitempty"`
	// Rows and Pages: the rows a purge batch deleted and the heap pages
	// they were on (read before it ran), per repetition: a batch logs at
	// most one full-page image per page.
	Rows  []int64 `json:"rows,omitempty"`
	Pages []int64 `json:"heap_pages,omitempty"`
	// Cold: each repetition ran on a server just restarted (empty shared
	// buffers) with the database's files evicted from the operating
	// system's cache (posix_fadvise DONTNEED); otherwise warm, the ledger
	// just built and vacuumed, in memory.
	Cold bool `json:"cold,omitempty"`
}

// purgeBatchStep is the bigledger step measured after a checkpoint.
const purgeBatchStep = "purge batch (1000 rows)"

// walStats reads the WAL inserted so far (the cluster's insert position)
// and the full-page images of the statements since the last
// pg_stat_statements_reset (-1 without pg_stat_statements). pg_stat_wal is
// not read: a backend reports to it only now and then.
func walStats(ctx context.Context, db *pgxpool.Pool) (walBytes, fpi int64, err error) {
	if err := db.QueryRow(ctx, `SELECT pg_wal_lsn_diff(pg_current_wal_insert_lsn(), '0/0')::bigint`).Scan(&walBytes); err != nil {
		return 0, 0, err
	}
	if err := db.QueryRow(ctx, `SELECT coalesce(sum(wal_fpi), 0)::bigint FROM pg_stat_statements`).Scan(&fpi); err != nil {
		return walBytes, -1, nil //nolint:nilerr // without pg_stat_statements the count is unknown, the bytes are not
	}
	return walBytes, fpi, nil
}

// bigSize is everything measured at one ledger size.
type bigSize struct {
	Keys int64 `json:"keys"`
	// Build: seconds to insert the added rows, rebuild the indexes, and
	// VACUUM (ANALYZE).
	InsertSeconds float64      `json:"insert_seconds"`
	IndexSeconds  float64      `json:"index_seconds"`
	VacuumSeconds float64      `json:"vacuum_analyze_seconds"`
	Measures      []bigMeasure `json:"measures"`
	// Layout: where the rows lie on the table's pages (--layout).
	Layout string `json:"layout"`
	// Bytes: table (heap + TOAST), all indexes, and each index.
	TableBytes   int64            `json:"table_bytes"`
	IndexesBytes int64            `json:"indexes_bytes"`
	TotalBytes   int64            `json:"total_bytes"`
	IndexBytes   map[string]int64 `json:"index_bytes"`
	LoadBefore   string           `json:"load_before"`
	LoadAfter    string           `json:"load_after"`
	// StatusSample is the first lines of `status`'s text at this size.
	StatusSample string `json:"status_sample"`
	// Console is the web console's pages (bigconsole.go).
	Console []bigConsolePage `json:"console,omitempty"`
}

func runBigLedger(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("lkbench bigledger", flag.ContinueOnError)
	fs.SetOutput(stderr)
	var (
		dbURL   = fs.String("database-url", "", "PostgreSQL server to use (the user must be able to create databases); default: an ephemeral durable cluster")
		bin     = fs.String("bin", "", "the ledgerkeeper binary to run status, inspect and reconcile with (default: go build ./cmd/ledgerkeeper into a temporary directory)")
		sizeArg = fs.String("sizes", "1,5,20", "ledger sizes to measure, ascending, in units of --scale keys (the ledger grows from one to the next)")
		scale   = fs.Int64("scale", 1_000_000, "keys per unit of --sizes (e.g. 10000 for a smoke run in seconds)")
		reps    = fs.Int("reps", 5, "repetitions of each measurement (the reconcile pass runs once per size)")
		cold    = fs.Int("cold-reps", 3, "repetitions of each measurement cold: the server restarted and the database's files evicted from the OS cache before each (0: none; not with --database-url)")
		jsonOut = fs.String("json", "", "also write the results to this file as JSON")
		layout  = fs.String("layout", layoutSpread, "where the rows lie on the table's pages: spread (each insert chunk spans the whole period, its rows scattered over its pages: each of the oldest keys, and of the last hour's, on a page of its own, the worst case for the purge batch and the p99 sample) or time (the ledger rebuilt at each size in creation order, as tool servers write it)")
		keep    = fs.Bool("keep", false, "keep database lkbench_bigledger afterwards (with --database-url), to look at it")
	)
	if err := fs.Parse(args); err != nil {
		return err
	}
	if *scale <= 0 || *reps <= 0 || *cold < 0 {
		return errors.New("--scale and --reps must be positive, --cold-reps not negative")
	}
	if *layout != layoutSpread && *layout != layoutTime {
		return fmt.Errorf("--layout must be %s or %s, not %q", layoutSpread, layoutTime, *layout)
	}
	var sizes []int64
	for _, s := range strings.Split(*sizeArg, ",") {
		f, err := strconv.ParseFloat(strings.TrimSpace(s), 64)
		n := int64(f * float64(*scale))
		if err != nil || n <= 0 || (len(sizes) > 0 && n <= sizes[len(sizes)-1]) {
			return fmt.Errorf("--sizes: %q is not a positive size above the one before it", s)
		}
		sizes = append(sizes, n)
	}
	logf := logger(stderr)
	work, err := os.MkdirTemp("", "lkbench-bigledger-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(work)
	if *bin == "" {
		if *bin, err = buildLedgerkeeper(ctx, work, "bigledger", logf, stderr); err != nil {
			return err
		}
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return err
	}
	hs := &http.Server{Handler: http.HandlerFunc(bigDownstream), ReadHeaderTimeout: 5 * time.Second}
	go func() { _ = hs.Serve(ln) }()
	defer hs.Close()

	srv, err := startServer(ctx, *dbURL, logf)
	if err != nil {
		return err
	}
	defer srv.stop()
	const dbName = "lkbench_bigledger"
	url, err := srv.createDB(ctx, dbName, "")
	if err != nil {
		return err
	}
	if !*keep {
		defer srv.dropDB(context.WithoutCancel(ctx), dbName)
	}
	db, err := bigPool(ctx, url, true)
	if err != nil {
		return err
	}
	defer db.Close()
	old, err := bigPool(ctx, url, false)
	if err != nil {
		return err
	}
	defer old.Close()
	if _, err := migrations.Up(ctx, db, nil); err != nil {
		return err
	}
	cfgPath := filepath.Join(work, "bigledger.yaml")
	if err := os.WriteFile(cfgPath, bigConfig("http://"+ln.Addr().String()), 0o600); err != nil {
		return err
	}
	b := &bigBench{db: db, old: old, url: url, bin: *bin, cfg: cfgPath, reps: *reps, logf: logf, restart: srv.restart, coldReps: *cold, layout: *layout}
	if b.restart == nil && b.coldReps > 0 {
		logf("not measuring cold: a server given by --database-url is not restarted")
		b.coldReps = 0
	}
	if b.indexDefs, err = b.readIndexDefs(ctx); err != nil {
		return err
	}
	var results []bigSize
	var have int64
	for _, n := range sizes {
		if ctx.Err() != nil {
			return ctx.Err()
		}
		r, err := b.size(ctx, have, n)
		if err != nil {
			return fmt.Errorf("%d keys: %w", n, err)
		}
		have = n
		results = append(results, r)
		printBigResults(stdout, results) // after each size: a long run's first sizes survive its end
		if *jsonOut != "" {
			out, _ := json.MarshalIndent(map[string]any{"scale": *scale, "reps": *reps, "sizes": results}, "", "  ")
			if err := os.WriteFile(*jsonOut, out, 0o644); err != nil {
				return err
			}
		}
	}
	return nil
}

type bigBench struct {
	// db is connected as ledgerkeeper connects (jit off); old with the
	// server's defaults, as ledgerkeeper did before issue 11.
	db, old   *pgxpool.Pool
	url, bin  string
	cfg       string
	reps      int
	logf      func(string, ...any)
	indexDefs []bigIndex
	// restart and coldReps: the cold measurements (nil, 0: none).
	restart  func(ctx context.Context, whileDown func(dataDir string) error) error
	coldReps int
	layout   string // layoutSpread or layoutTime
}

// The ledger's layouts (--layout).
const (
	layoutSpread = "spread"
	layoutTime   = "time"
)

// bigIndex is one index of idempotency_keys as the migrations created it.
type bigIndex struct {
	name, def  string
	constraint bool // the primary key
}

func (b *bigBench) readIndexDefs(ctx context.Context) ([]bigIndex, error) {
	rows, err := b.db.Query(ctx, `SELECT i.relname, pg_get_indexdef(x.indexrelid), x.indisprimary
		FROM pg_index x JOIN pg_class i ON i.oid = x.indexrelid
		WHERE x.indrelid = 'idempotency_keys'::regclass ORDER BY i.relname`)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	var out []bigIndex
	for rows.Next() {
		var ix bigIndex
		if err := rows.Scan(&ix.name, &ix.def, &ix.constraint); err != nil {
			return nil, err
		}
		out = append(out, ix)
	}
	return out, rows.Err()
}

// size grows the ledger from have to n keys and measures it.
func (b *bigBench) size(ctx context.Context, have, n int64) (bigSize, error) {
	res := bigSize{Keys: n}
	if b.layout == layoutTime {
		// Creation order over the whole ledger: built again from nothing.
		if _, err := b.db.Exec(ctx, `TRUNCATE idempotency_keys, reconcile_state, key_holds, reconcile_audit`); err != nil {
			return res, err
		}
		have = 0
	}
	res.Layout = b.layout
	b.logf("%d keys: dropping the indexes, inserting %d rows (layout %s)", n, n-have, b.layout)
	for _, ix := range b.indexDefs {
		q := "DROP INDEX " + ix.name
		if ix.constraint {
			q = "ALTER TABLE idempotency_keys DROP CONSTRAINT " + ix.name
		}
		if _, err := b.db.Exec(ctx, q); err != nil {
			return res, err
		}
	}
	t0 := time.Now()
	if err := b.insert(ctx, have, n); err != nil {
		return res, err
	}
	res.InsertSeconds = time.Since(t0).Seconds()
	b.logf("%d keys: inserted in %.0fs; building the indexes", n, res.InsertSeconds)
	t0 = time.Now()
	g := newBigGroup(ctx, 2)
	for _, ix := range b.indexDefs {
		g.Go(func(gctx context.Context) error {
			conn, err := b.db.Acquire(gctx)
			if err != nil {
				return err
			}
			defer conn.Release()
			if _, err := conn.Exec(gctx, `SET maintenance_work_mem = '512MB'`); err != nil {
				return err
			}
			q := ix.def
			if ix.constraint {
				q = "ALTER TABLE idempotency_keys ADD CONSTRAINT " + ix.name + " PRIMARY KEY (key)"
			}
			_, err = conn.Exec(gctx, q)
			return err
		})
	}
	if err := g.Wait(); err != nil {
		return res, fmt.Errorf("rebuild indexes: %w", err)
	}
	res.IndexSeconds = time.Since(t0).Seconds()
	b.logf("%d keys: indexes in %.0fs; VACUUM (ANALYZE)", n, res.IndexSeconds)
	t0 = time.Now()
	// Settled pages and fresh statistics, as autovacuum leaves an old
	// ledger (its analyze threshold is 2% of the rows).
	if _, err := b.db.Exec(ctx, `VACUUM (ANALYZE) idempotency_keys`); err != nil {
		return res, err
	}
	res.VacuumSeconds = time.Since(t0).Seconds()
	var oldest, newest time.Time
	var expired int64
	if err := b.db.QueryRow(ctx, `SELECT min(created_at), max(created_at), count(*) FILTER (WHERE expires_at < now())
		FROM idempotency_keys`).Scan(&oldest, &newest, &expired); err != nil {
		return res, err
	}
	b.logf("%d keys: created from %s to %s ago, %d expired", n, time.Since(oldest).Round(time.Minute), time.Since(newest).Round(time.Second), expired)
	if err := b.resetOperatorKeys(ctx); err != nil {
		return res, fmt.Errorf("operator keys: %w", err)
	}
	if _, err := b.db.Exec(ctx, `VACUUM (ANALYZE) reconcile_state, key_holds`); err != nil {
		return res, err
	}
	res.LoadBefore = loadAvg()
	b.logf("%d keys: built (insert %.0fs, indexes %.0fs, vacuum %.0fs); measuring, load %s", n, res.InsertSeconds, res.IndexSeconds, res.VacuumSeconds, res.LoadBefore)
	if err := b.measure(ctx, &res); err != nil {
		return res, err
	}
	res.LoadAfter = loadAvg()
	if err := b.sizes(ctx, &res); err != nil {
		return res, err
	}
	return res, nil
}

// insert adds keys have+1 … n in chunks, on two connections: completed
// keys (1 in 2,000 failed_retryable) of six tools, created evenly over the
// last 7 days 6 hours with a 7-day retention, so the oldest 6 hours are
// expired (the purge's backlog). Each chunk spans the whole period, so the
// ledger's rows stay spread in time however it grows.
func (b *bigBench) insert(ctx context.Context, have, n int64) error {
	const chunk = 500_000
	g := newBigGroup(ctx, 2)
	var toolCase strings.Builder
	cum := 0
	toolCase.WriteString("CASE")
	for _, t := range bigTools {
		cum += t.share
		fmt.Fprintf(&toolCase, " WHEN i %% 100 < %d THEN '%s'", cum, t.name)
	}
	toolCase.WriteString(" END")
	// created is a row's creation time: spread, each chunk spans the whole
	// period with its rows in a scattered order; time, row i of n at its
	// place in the period, so rows lie on the pages in creation order.
	created := `now() - interval '7 days 6 hours' + ((i * 7919) % ($2 - $1 + 1) + 0.5) * (interval '7 days 6 hours' / ($2 - $1 + 1))`
	var extra []any
	if b.layout == layoutTime {
		created = `now() - interval '7 days 6 hours' + (i - 0.5) * (interval '7 days 6 hours' / $3::bigint)`
		extra = []any{n}
	}
	var done sync.Mutex
	var inserted int64
	for lo := have + 1; lo <= n; lo += chunk {
		hi := min(lo+chunk-1, n)
		g.Go(func(gctx context.Context) error {
			_, err := b.db.Exec(gctx, `INSERT INTO idempotency_keys (key, tool, request_hash, request_body, status,
				response_code, response_body, created_at, claimed_at, updated_at, expires_at)
			SELECT 'bl-' || i || ':' || t.tool, t.tool, md5(i::text) || md5((-i)::text),
			       jsonb_build_object('customer_id', 'cus_' || (i % 100000), 'amount_cents', i % 100000, 'summary', 'bench ticket ' || i),
			       CASE WHEN i % 2000 = 7 THEN 'failed_retryable' ELSE 'completed' END,
			       CASE WHEN i % 2000 = 7 THEN NULL ELSE 201 END,
			       CASE WHEN i % 2000 = 7 THEN NULL
			            ELSE jsonb_build_object('ticket_id', 'T-' || i, 'url', 'https://tickets.example/T-' || i) END,
			       t.c, t.c, t.c + t.took, t.c + interval '7 days'
			FROM generate_series($1::bigint, $2::bigint) i,
			     LATERAL (SELECT `+toolCase.String()+` AS tool,
			                     `+created+` AS c,
			                     CASE WHEN i % 100 = 3 THEN interval '8 seconds' ELSE interval '1 millisecond' * (20 + (i * 37) % 1500) END AS took) t`,
				append([]any{lo, hi}, extra...)...)
			if err != nil {
				return fmt.Errorf("insert keys %d-%d: %w", lo, hi, err)
			}
			done.Lock()
			inserted += hi - lo + 1
			b.logf("  %d of %d rows inserted", inserted, n-have)
			done.Unlock()
			return nil
		})
	}
	return g.Wait()
}

// resetOperatorKeys replaces the keys an operator acts on (see bigDue and
// the others) by a fresh set: what the reconcile pass or the purge changed
// at the last size is undone. reconcile_state rows say how far each stuck
// key got; key_holds holds bigHeld of them.
func (b *bigBench) resetOperatorKeys(ctx context.Context) error {
	keys := `(SELECT 'op-' || g FROM generate_series(1, ` + strconv.Itoa(bigOpKeys) + `) g)`
	for _, q := range []string{
		`DELETE FROM key_holds WHERE key IN ` + keys,
		`DELETE FROM reconcile_state WHERE key IN ` + keys,
		`DELETE FROM idempotency_keys WHERE key IN ` + keys,
	} {
		if _, err := b.db.Exec(ctx, q); err != nil {
			return err
		}
	}
	others := make([]string, 0, len(bigTools)-1)
	for _, t := range bigTools[1:] {
		others = append(others, t.name)
	}
	_, err := b.db.Exec(ctx, `INSERT INTO idempotency_keys (key, tool, request_hash, request_body, status, created_at, claimed_at, updated_at, expires_at)
		SELECT 'op-' || g, o.tool, md5(g::text) || md5((-g)::text),
		       jsonb_build_object('customer_id', 'cus_' || g, 'amount_cents', g, 'summary', 'stuck ' || g),
		       'processing', o.c, o.c, o.c, o.c + interval '7 days'
		FROM generate_series(1, $1::int) g,
		     LATERAL (SELECT CASE WHEN g <= $2::int THEN 'create_ticket'
		                          WHEN g <= $2::int + $3::int + $4::int THEN ($5::text[])[1 + g % cardinality($5::text[])]
		                          ELSE ($6::text[])[1 + g % cardinality($6::text[])] END AS tool,
		                     CASE WHEN g <= $2::int THEN now() - interval '1 hour' - g * interval '15 seconds'
		                          WHEN g <= $2::int + $3::int + $4::int THEN now() - interval '2 hours'
		                          ELSE now() END AS c) o`,
		bigOpKeys, bigDue, bigBackedOff, bigHeld, others, append([]string{"create_ticket"}, others...))
	if err != nil {
		return err
	}
	// Half the due keys were probed once (unknown) and are due again; the
	// backed-off ones were probed three times and wait an hour.
	if _, err := b.db.Exec(ctx, `INSERT INTO reconcile_state (key, tool, claimed_at, attempts, next_probe_at, last_verdict, last_error, last_probe_at)
		SELECT k.key, k.tool, k.claimed_at,
		       CASE WHEN g <= $1::int THEN 1 ELSE 3 END,
		       CASE WHEN g <= $1::int THEN now() - interval '1 minute' ELSE now() + interval '1 hour' END,
		       'unknown', 'GET: 503 Service Unavailable', now() - interval '5 minutes'
		FROM generate_series(1, $1::int + $2::int) g JOIN idempotency_keys k ON k.key = 'op-' || g
		WHERE g > $1::int OR g % 2 = 0`, bigDue, bigBackedOff); err != nil {
		return err
	}
	_, err = b.db.Exec(ctx, `INSERT INTO key_holds (key, reason, actor)
		SELECT 'op-' || g, 'lkbench: looking at it', 'operator:lkbench' FROM generate_series($1::int + 1, $1::int + $2::int) g`,
		bigDue+bigBackedOff, bigHeld)
	return err
}

// oldStatusQueries are what `status` sent before issue 11 that read the
// whole table: the per-(tool, status) count and the p99 over every key
// completed within the hour. Kept here, verbatim, for the before/after,
// and sent as it sent them, with the server's jit setting.
var oldStatusQueries = []string{
	`SELECT tool, status, count(*) FROM idempotency_keys GROUP BY tool, status`,
	`SELECT k.tool, count(*)::int,
			percentile_cont(0.99) WITHIN GROUP (ORDER BY extract(epoch FROM k.updated_at - k.claimed_at))::float8
		FROM idempotency_keys k
		WHERE k.status = 'completed' AND k.updated_at >= now() - interval '1 hour'
		  AND NOT EXISTS (SELECT 1 FROM reconcile_state s WHERE s.key = k.key AND s.claimed_at = k.claimed_at)
		GROUP BY k.tool ORDER BY k.tool`,
}

func (b *bigBench) measure(ctx context.Context, res *bigSize) error {
	var purged int64 // rows the last purge batch deleted
	coldPhase := false
	run := func(name string, reps int, cold bool, f func(i int) error) error {
		m := bigMeasure{Name: name, AfterCheckpoint: true, Cold: cold}
		isPurge := name == purgeBatchStep
		for i := range reps {
			if cold {
				if err := b.coldStart(ctx); err != nil {
					return fmt.Errorf("%s: %w", name, err)
				}
			} else if _, err := b.db.Exec(ctx, `CHECKPOINT`); err != nil {
				return fmt.Errorf("%s: checkpoint: %w", name, err)
			}
			var pages int64
			if isPurge {
				if err := b.db.QueryRow(ctx, purgePagesSQL, time.Now().Add(-expiry.DefaultConfig().MinAge), expiry.DefaultConfig().BatchSize).Scan(&pages); err != nil {
					return fmt.Errorf("%s: pages of the batch: %w", name, err)
				}
			}
			_, _ = b.db.Exec(ctx, `CREATE EXTENSION IF NOT EXISTS pg_stat_statements`)
			_, _ = b.db.Exec(ctx, `SELECT pg_stat_statements_reset()`)
			w0, p0, err := walStats(ctx, b.db)
			if err != nil {
				return fmt.Errorf("%s: %w", name, err)
			}
			purged = 0
			t0 := time.Now()
			if err := f(i); err != nil {
				return fmt.Errorf("%s: %w", name, err)
			}
			m.Seconds = append(m.Seconds, round4(time.Since(t0).Seconds()))
			w1, p1, err := walStats(ctx, b.db)
			if err != nil {
				return fmt.Errorf("%s: %w", name, err)
			}
			fpi := p1 - p0
			if p0 < 0 || p1 < 0 {
				fpi = -1
			}
			m.WALBytes, m.FPI = append(m.WALBytes, w1-w0), append(m.FPI, fpi)
			if isPurge {
				m.Rows, m.Pages = append(m.Rows, purged), append(m.Pages, pages)
			}
		}
		s := slices.Clone(m.Seconds)
		slices.Sort(s)
		m.Median, m.Min, m.Max = s[len(s)/2], s[0], s[len(s)-1]
		res.Measures = append(res.Measures, m)
		temp := "warm"
		if cold {
			temp = "cold"
		}
		b.logf("%d keys: %-34s %s median %7.3fs  %v; WAL bytes %v, full-page images %v", res.Keys, name, temp, m.Median, m.Seconds, m.WALBytes, m.FPI)
		return nil
	}
	cli := func(args ...string) (string, error) {
		cmd := exec.CommandContext(ctx, b.bin, append(args, "--config", b.cfg, "--database-url", b.url)...)
		var out, errOut strings.Builder
		cmd.Stdout, cmd.Stderr = &out, &errOut
		if err := cmd.Run(); err != nil {
			return out.String(), fmt.Errorf("ledgerkeeper %s: %w: %s", strings.Join(args, " "), err, errOut.String())
		}
		return out.String(), nil
	}
	window := bigWindow + 10*time.Second
	windows := func(string) (time.Duration, time.Duration) { return window, window }
	steps := []struct {
		name string
		reps int
		f    func(i int) error
	}{
		{"status (text)", b.reps, func(i int) error {
			out, err := cli("status")
			if i == 0 {
				res.StatusSample = firstLines(out, 10)
			}
			return err
		}},
		{"status --json", b.reps, func(int) error { _, err := cli("status", "--json"); return err }},
		{"status --exact (every row counted)", b.reps, func(int) error { _, err := cli("status", "--exact"); return err }},
		{"before: status's old full scans", b.reps, func(int) error {
			for _, q := range oldStatusQueries {
				rows, err := b.old.Query(ctx, q)
				if err != nil {
					return err
				}
				rows.Close()
				if rows.Err() != nil {
					return rows.Err()
				}
			}
			return nil
		}},
		{"inspect KEY", b.reps, func(int) error { _, err := cli("inspect", "op-2"); return err }},
		{"metrics refresh (with p99)", b.reps, func(int) error {
			return daemon.NewLedgerMetrics(prometheus.NewRegistry()).Update(ctx, b.db, windows, bigToolNames())
		}},
		{"LeaseDue, batch of 100", b.reps, func(i int) error {
			owner := fmt.Sprintf("lkbench-%d-%d", res.Keys, i)
			got, err := store.LeaseDue(ctx, b.db, store.LeaseParams{Tool: "create_ticket", Window: window, HeartbeatTimeout: window,
				Owner: owner, Lease: time.Minute, Limit: 100})
			if err != nil {
				return err
			}
			if len(got) != 100 {
				return fmt.Errorf("leased %d keys, want 100", len(got))
			}
			keys := make([]string, len(got))
			for j, k := range got {
				keys[j] = k.Key.Key
			}
			return store.ReleaseLeases(ctx, b.db, keys, owner)
		}},
		{purgeBatchStep, b.reps, func(i int) error {
			r, err := store.PurgeExpiredBatch(ctx, b.db, store.PurgePolicy{MinAge: expiry.DefaultConfig().MinAge}, store.PurgeCursor{}, expiry.DefaultConfig().BatchSize)
			if err == nil && r.Keys == 0 && i == 0 && !coldPhase {
				// The warm batches may have left none for the cold ones
				// on a small ledger; the first one must find some.
				err = errors.New("nothing purged: no expired keys left")
			}
			purged = r.Keys
			return err
		}},
		{"reconcile pass, 1000 stuck keys", 1, func(int) error {
			out, err := cli("reconcile", "--json", "--no-alerts", "--tool", "create_ticket")
			if err != nil {
				return err
			}
			var rep struct {
				Decided int64 `json:"decided"`
			}
			if err := json.Unmarshal([]byte(out), &rep); err != nil {
				return fmt.Errorf("read reconcile --json: %w", err)
			}
			if rep.Decided != bigDue {
				b.logf("WARNING: the reconcile pass decided %d keys, not %d: %s", rep.Decided, bigDue, firstLines(out, 20))
			}
			return nil
		}},
	}
	for _, s := range steps {
		if strings.HasPrefix(s.name, "reconcile pass") {
			// The console is looked at while the stuck keys are there to
			// see (the pass decides them).
			if err := b.measureConsole(ctx, res); err != nil {
				return err
			}
		}
		if err := run(s.name, s.reps, false, s.f); err != nil {
			return err
		}
	}
	if b.coldReps == 0 {
		return nil
	}
	// Cold: the same steps again, each repetition on a restarted server
	// whose files were evicted from the OS cache; the stuck keys the pass
	// decided are put back first.
	coldPhase = true
	if err := b.resetOperatorKeys(ctx); err != nil {
		return fmt.Errorf("operator keys, for the cold measurements: %w", err)
	}
	if _, err := b.db.Exec(ctx, `VACUUM (ANALYZE) reconcile_state, key_holds`); err != nil {
		return err
	}
	for _, s := range steps {
		if err := run(s.name, min(s.reps, b.coldReps), true, s.f); err != nil {
			return err
		}
	}
	return nil
}

// purgePagesSQL counts the heap pages of the rows the next purge batch
// deletes (purgeableUnheld in store/purge.go, from the start of the
// keyset; no key is held in the bulk): the bound on its full-page images.
const purgePagesSQL = `SELECT count(DISTINCT (ctid::text::point)[0])::bigint FROM (
	SELECT ctid FROM idempotency_keys
	WHERE expires_at < now() AND status IN ('completed', 'failed_retryable') AND created_at < $1
	ORDER BY expires_at, key LIMIT $2) c`

// coldStart restarts the server with the database's files evicted from
// the operating system's cache while it is down: the next statement reads
// from the disk what it needs (the shutdown is itself a checkpoint). The
// pools' connections died with the server and are dropped.
func (b *bigBench) coldStart(ctx context.Context) error {
	if err := b.restart(ctx, evictOSCache); err != nil {
		return err
	}
	b.db.Reset()
	b.old.Reset()
	return nil
}

func (b *bigBench) sizes(ctx context.Context, res *bigSize) error {
	if err := b.db.QueryRow(ctx, `SELECT pg_table_size('idempotency_keys'), pg_indexes_size('idempotency_keys'),
		pg_total_relation_size('idempotency_keys')`).Scan(&res.TableBytes, &res.IndexesBytes, &res.TotalBytes); err != nil {
		return err
	}
	res.IndexBytes = map[string]int64{}
	for _, ix := range b.indexDefs {
		var n int64
		if err := b.db.QueryRow(ctx, `SELECT pg_relation_size($1::regclass)`, ix.name).Scan(&n); err != nil {
			return err
		}
		res.IndexBytes[ix.name] = n
	}
	return nil
}

// bigPool connects like ledgerkeeper does (cmd/ledgerkeeper's connect:
// jit off) when asLedgerkeeper, else with the server's defaults.
func bigPool(ctx context.Context, url string, asLedgerkeeper bool) (*pgxpool.Pool, error) {
	pc, err := pgxpool.ParseConfig(url)
	if err != nil {
		return nil, err
	}
	pc.MaxConns = 4
	pc.ConnConfig.RuntimeParams["application_name"] = "lkbench-bigledger"
	if asLedgerkeeper {
		pc.ConnConfig.RuntimeParams["jit"] = "off"
	}
	return pgxpool.NewWithConfig(ctx, pc)
}

func bigToolNames() []string {
	out := make([]string, len(bigTools))
	for i, t := range bigTools {
		out[i] = t.name
	}
	return out
}

// bigDownstream answers the probes: a bulk key bl-I:tool is found (id T-I,
// as its stored outcome says, so the self-check passes), an op-G key is
// found when G is even and not found (404) when odd, anything else (the
// self-check's made-up key) not found.
func bigDownstream(w http.ResponseWriter, r *http.Request) {
	key := r.URL.Query().Get("idempotency_key")
	w.Header().Set("Content-Type", "application/json")
	if rest, ok := strings.CutPrefix(key, "bl-"); ok {
		if i, _, ok := strings.Cut(rest, ":"); ok {
			fmt.Fprintf(w, `{"data":[{"id":"T-%s"}]}`, i)
			return
		}
	}
	if g, err := strconv.Atoi(strings.TrimPrefix(key, "op-")); err == nil && strings.HasPrefix(key, "op-") && g%2 == 0 {
		fmt.Fprintf(w, `{"data":[{"id":"T-%s"}]}`, key)
		return
	}
	w.WriteHeader(http.StatusNotFound)
	fmt.Fprint(w, `{"error":"not found"}`)
}

func bigConfig(downstream string) []byte {
	var sb strings.Builder
	fmt.Fprintf(&sb, "reconcile:\n  concurrency: 32\ndefaults:\n  processing_window: %s\ntools:\n", bigWindow)
	for _, t := range bigTools {
		fmt.Fprintf(&sb, `  %s:
    processing_window: %s
    probe:
      type: http
      url: "%s/v1/tickets?idempotency_key={key}"
      timeout: 5s
      match: "data"
      response_code: 201
      response_body: {ticket_id: "id"}
`, t.name, bigWindow, downstream)
	}
	return []byte(sb.String())
}

func printBigResults(w io.Writer, results []bigSize) {
	if len(results) == 0 {
		return
	}
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintf(tw, "measurement (seconds: median [min, max]; layout %s)\t", results[0].Layout)
	for _, r := range results {
		fmt.Fprintf(tw, "%s keys\t", humanKeys(r.Keys))
	}
	last := len(results) - 1
	if last > 0 {
		fmt.Fprintf(tw, "%s/%s: medians [range]\t", humanKeys(results[last].Keys), humanKeys(results[0].Keys))
	}
	fmt.Fprintln(tw)
	for i, m := range results[0].Measures {
		name := m.Name
		if m.Cold {
			name += ", cold"
		}
		fmt.Fprintf(tw, "%s\t", name)
		for _, r := range results {
			x := r.Measures[i]
			fmt.Fprintf(tw, "%.3f [%.3f, %.3f]\t", x.Median, x.Min, x.Max)
		}
		if last > 0 {
			// The range: the largest size's fastest over the smallest's
			// slowest, and the other way round.
			a, z := results[0].Measures[i], results[last].Measures[i]
			fmt.Fprintf(tw, "%.2f [%.2f, %.2f]\t", z.Median/a.Median, z.Min/a.Max, z.Max/a.Min)
		}
		fmt.Fprintln(tw)
	}
	for i, m := range results[0].Measures {
		if m.Name != purgeBatchStep {
			continue
		}
		name := "  its WAL per row, B; full-page images and heap pages per row"
		if m.Cold {
			name += ", cold"
		}
		fmt.Fprintf(tw, "%s\t", name)
		for _, r := range results {
			fmt.Fprintf(tw, "%s\t", purgeWALPerRow(r.Measures[i]))
		}
		fmt.Fprintln(tw)
	}
	row := func(name string, f func(r bigSize) string) {
		fmt.Fprintf(tw, "%s\t", name)
		for _, r := range results {
			fmt.Fprintf(tw, "%s\t", f(r))
		}
		fmt.Fprintln(tw)
	}
	row("build: insert (s)", func(r bigSize) string { return fmt.Sprintf("%.0f", r.InsertSeconds) })
	row("build: indexes (s)", func(r bigSize) string { return fmt.Sprintf("%.0f", r.IndexSeconds) })
	row("build: vacuum analyze (s)", func(r bigSize) string { return fmt.Sprintf("%.0f", r.VacuumSeconds) })
	perM := func(n, keys int64) string { return fmt.Sprintf("%.1f", float64(n)/(1<<20)/(float64(keys)/1e6)) }
	row("table MiB per 1M keys", func(r bigSize) string { return perM(r.TableBytes, r.Keys) })
	row("all indexes MiB per 1M keys", func(r bigSize) string { return perM(r.IndexesBytes, r.Keys) })
	names := make([]string, 0, len(results[0].IndexBytes))
	for n := range results[0].IndexBytes {
		names = append(names, n)
	}
	slices.Sort(names)
	for _, n := range names {
		row("  "+n+" MiB per 1M keys", func(r bigSize) string { return perM(r.IndexBytes[n], r.Keys) })
	}
	row("total MiB per 1M keys", func(r bigSize) string { return perM(r.TotalBytes, r.Keys) })
	row("load average before", func(r bigSize) string { return r.LoadBefore })
	row("load average after", func(r bigSize) string { return r.LoadAfter })
	tw.Flush()
	printBigConsole(w, results)
	fmt.Fprintf(w, "\nstatus at %s keys:\n%s\n", humanKeys(results[last].Keys), results[last].StatusSample)
}

// purgeWALPerRow is a purge batch's WAL bytes, full-page images and heap
// pages per row deleted, medians over its repetitions.
func purgeWALPerRow(m bigMeasure) string {
	var wal, fpi, pages []float64
	for j, rows := range m.Rows {
		if rows <= 0 || j >= len(m.WALBytes) || j >= len(m.Pages) {
			continue
		}
		wal = append(wal, float64(m.WALBytes[j])/float64(rows))
		fpi = append(fpi, float64(m.FPI[j])/float64(rows))
		pages = append(pages, float64(m.Pages[j])/float64(rows))
	}
	if len(wal) == 0 {
		return "-"
	}
	med := func(v []float64) float64 { slices.Sort(v); return v[len(v)/2] }
	return fmt.Sprintf("%.0f; %.2f, %.2f", med(wal), med(fpi), med(pages))
}

func humanKeys(n int64) string {
	switch {
	case n >= 1_000_000 && n%100_000 == 0:
		return strconv.FormatFloat(float64(n)/1e6, 'f', -1, 64) + "M"
	case n >= 1000 && n%100 == 0:
		return strconv.FormatFloat(float64(n)/1e3, 'f', -1, 64) + "k"
	}
	return strconv.FormatInt(n, 10)
}

func firstLines(s string, n int) string {
	lines := strings.SplitN(s, "\n", n+1)
	return strings.Join(lines[:min(n, len(lines))], "\n")
}

func round4(f float64) float64 { return float64(int64(f*1e4+0.5)) / 1e4 }

// bigGroup runs functions on at most n goroutines at once; the first error
// cancels the others' context and is what Wait returns.
type bigGroup struct {
	ctx    context.Context
	cancel context.CancelFunc
	sem    chan struct{}
	wg     sync.WaitGroup
	once   sync.Once
	err    error
}

func newBigGroup(ctx context.Context, n int) *bigGroup {
	ctx, cancel := context.WithCancel(ctx)
	return &bigGroup{ctx: ctx, cancel: cancel, sem: make(chan struct{}, n)}
}

// Go waits for a free slot, then runs f on its own goroutine.
func (g *bigGroup) Go(f func(ctx context.Context) error) {
	g.sem <- struct{}{}
	g.wg.Add(1)
	go func() {
		defer func() { <-g.sem; g.wg.Done() }()
		if err := f(g.ctx); err != nil {
			g.once.Do(func() { g.err = err; g.cancel() })
		}
	}()
}

// Wait waits for every function and returns the first error.
func (g *bigGroup) Wait() error {
	g.wg.Wait()
	g.cancel()
	return g.err
}

// loadAvg is /proc/loadavg's three averages.
func loadAvg() string {
	b, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return "?"
	}
	f := strings.Fields(string(b))
	if len(f) < 3 {
		return "?"
	}
	return strings.Join(f[:3], " ")
}
