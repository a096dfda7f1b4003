package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"hash/crc32"
	"io"
	"log/slog"
	"math/rand/v2"
	"os"
	"slices"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/ledgerkeeper/ledgerkeeper/expiry"
	"github.com/ledgerkeeper/ledgerkeeper/internal/daemon"
	"github.com/ledgerkeeper/ledgerkeeper/ledger"
	"github.com/ledgerkeeper/ledgerkeeper/migrations"
	"github.com/ledgerkeeper/ledgerkeeper/store"
)

// purgeVariants are the ways of deleting the expired half of the ledger that
// the benchmark compares. The first two are the shapes BENCHMARKS.md warns
// against, written here on purpose; ledgerkeeper's own is package expiry.
var purgeVariants = map[string]func(ctx context.Context, db *pgxpool.Pool, cfg expiry.Config) (int64, error){
	"none": nil,
	// One statement for everything.
	"delete": func(ctx context.Context, db *pgxpool.Pool, _ expiry.Config) (int64, error) {
		tag, err := db.Exec(ctx, `DELETE FROM idempotency_keys
			WHERE expires_at < now() AND status IN ('completed', 'failed_retryable')`)
		return tag.RowsAffected(), err
	},
	// River's JobCleaner as it runs (riverqueue/river: internal/maintenance
	// job_cleaner.go runOnce, with rivershared's riversharedmaintenance
	// BatchSizeDefault = 1_000, BatchBackoffMin = 50ms, BatchBackoffMax =
	// 1s): a key sub-select of 1,000 per DELETE, a random pause between 50
	// ms and 1 s after each full batch, done after a short one.
	"river": func(ctx context.Context, db *pgxpool.Pool, _ expiry.Config) (int64, error) {
		return batchLoop(ctx, db, riverBatch, func() time.Duration {
			return riverPauseMin + rand.N(riverPauseMax-riverPauseMin) //nolint:gosec // G404: a benchmark's pause, not a secret
		})
	},
	// River's batches without its pause: not how River runs; the pause's
	// share of River's gentleness.
	"river-nopause": func(ctx context.Context, db *pgxpool.Pool, _ expiry.Config) (int64, error) {
		return batchLoop(ctx, db, riverBatch, nil)
	},
	// The loop BENCHMARKS.md's older runs called "river": 5,000 per batch,
	// no pause. Kept to compare with them; River does not run this way.
	"loop5000": func(ctx context.Context, db *pgxpool.Pool, _ expiry.Config) (int64, error) {
		return batchLoop(ctx, db, 5000, nil)
	},
	"ledgerkeeper": func(ctx context.Context, db *pgxpool.Pool, cfg expiry.Config) (int64, error) {
		rep, err := expiry.New(cfg, db, slog.New(slog.DiscardHandler), nil).RunOnce(ctx)
		return rep.KeysDeleted, err
	},
}

// River's JobCleaner's batch and pause (see purgeVariants["river"]).
const (
	riverBatch    = 1000
	riverPauseMin = 50 * time.Millisecond
	riverPauseMax = time.Second
)

// batchLoop deletes expired, resolved keys batch rows at a time by a key
// sub-select until a batch comes back short, pausing pause() between full
// batches (nil: no pause).
func batchLoop(ctx context.Context, db *pgxpool.Pool, batch int, pause func() time.Duration) (int64, error) {
	var total int64
	for {
		tag, err := db.Exec(ctx, `DELETE FROM idempotency_keys WHERE key IN (
			SELECT key FROM idempotency_keys
			WHERE expires_at < now() AND status IN ('completed', 'failed_retryable') LIMIT $1)`, batch)
		if err != nil {
			return total, err
		}
		total += tag.RowsAffected()
		if tag.RowsAffected() < int64(batch) {
			return total, nil
		}
		if pause != nil {
			if err := sleepCtx(ctx, pause()); err != nil {
				return total, err
			}
		}
	}
}

type purgeResult struct {
	Variant        string  `json:"variant"`
	Round          int     `json:"round"`
	Rows           int64   `json:"rows_purged"`
	Seconds        float64 `json:"purge_seconds"`
	RowsPerSecond  float64 `json:"rows_per_second"`
	WALBytesPerRow float64 `json:"wal_bytes_per_row"`
	// WALExact: measured per statement (pg_stat_statements), not estimated.
	WALExact bool `json:"wal_exact"`
	// FPIPerRow is the full-page images per row purged (exact runs only):
	// 1.0 means every row cost a whole 8 kB page in the WAL, the bound of
	// a checkpoint just before the purge and one row per page.
	FPIPerRow float64 `json:"wal_fpi_per_row,omitempty"`
	// Before is the writer's warm-up window, immediately before the purge
	// (or the no-purge window), After the window right after it.
	Before latency `json:"writer_before"`
	During latency `json:"writer_during"`
	After  latency `json:"writer_after"`
	// ExcessMs is the writer's extra waiting over the purge and the window
	// after it, the same measure for every variant whatever its length:
	// the sum over those requests of their latency less the mean latency
	// of the window before (ms). ExcessMsPer1kRows divides it by the rows
	// purged; ExcessMsPerSec by the seconds it covers (for the no-purge
	// variant, the noise floor: what the same span costs with no purge).
	ExcessMs          float64 `json:"excess_writer_ms"`
	ExcessSeconds     float64 `json:"excess_window_seconds"`
	ExcessMsPer1kRows float64 `json:"excess_writer_ms_per_1000_rows,omitempty"`
	ExcessMsPerSec    float64 `json:"excess_writer_ms_per_second"`
	// Autovacuums of idempotency_keys and checkpoints that began while the
	// purge ran (or during the no-purge window): vacuum follows a purge.
	Autovacuums int64 `json:"autovacuums_during"`
	Checkpoints int64 `json:"checkpoints_during"`
	// IndexSeconds and IndexBytes: the extra index's build time and size
	// (":index=..."), beside the expires_at index's size.
	IndexSeconds      float64 `json:"index_build_seconds,omitempty"`
	IndexBytes        int64   `json:"index_bytes,omitempty"`
	ExpiresIndexBytes int64   `json:"expires_at_index_bytes,omitempty"`
	// Timeline is the writer's latency second by second, warm-up included.
	Timeline []second `json:"timeline"`
}

func runPurge(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("lkbench purge", flag.ContinueOnError)
	fs.SetOutput(stderr)
	var (
		dbURL     = fs.String("database-url", "", "PostgreSQL server to use (the user must be able to create databases); default: an ephemeral durable cluster")
		scale     = fs.Float64("scale", 1, "fraction of the full size: 2,000,000 keys, half expired (0.05 for a smoke run)")
		rate      = fs.Float64("rate", 1000, "writer arrival rate, claim+complete requests per second")
		workers   = fs.Int("workers", 32, "writer connections (requests beyond them queue, and their wait counts)")
		warmup    = fs.Duration("warmup", 5*time.Second, "writer warm-up before each measurement (also measures the writer's own WAL rate)")
		baseline  = fs.Duration("baseline", 30*time.Second, "measurement window of the no-purge variant")
		after     = fs.Duration("after", 15*time.Second, "measurement window after each purge ends")
		variants  = fs.String("variants", "none,delete,river,ledgerkeeper", "variants to run, in order")
		rounds    = fs.Int("rounds", 1, "run the variants this many times, every other round in reverse order (ABBA), for medians, spreads and the none-vs-none noise floor")
		jsonOut   = fs.String("json", "", "also write the results to this file as JSON")
		batchSize = fs.Int("batch-size", 0, "ledgerkeeper: retention.batch_size (0: the default)")
		duty      = fs.Float64("duty-cycle", 0, "ledgerkeeper: retention.duty_cycle (0: the default)")
		target    = fs.Duration("batch-target", 0, "ledgerkeeper: retention.batch_target (0: the default)")
		pause     = fs.Duration("batch-pause", 0, "ledgerkeeper: retention.batch_pause (0: the default)")
	)
	if err := fs.Parse(args); err != nil {
		return err
	}
	if *scale <= 0 || *scale > 1 || *rate <= 0 || *workers <= 0 {
		return fmt.Errorf("--scale must be in (0, 1], --rate and --workers positive")
	}
	logf := logger(stderr)
	lkCfg := expiry.Config{
		Alerts:      daemon.PurgeAlerts{},
		MinAge:      expiry.DefaultConfig().MinAge,
		BatchSize:   cmpOr(*batchSize, expiry.DefaultConfig().BatchSize),
		BatchPause:  cmpOr(*pause, expiry.DefaultConfig().BatchPause),
		DutyCycle:   cmpOr(*duty, expiry.DefaultConfig().DutyCycle),
		BatchTarget: cmpOr(*target, expiry.DefaultConfig().BatchTarget),
		MaxDuration: time.Hour, // the benchmark measures a whole purge
		Actor:       "lkbench",
	}
	names := strings.Split(*variants, ",")
	for _, n := range names {
		base, _, _ := strings.Cut(n, ":")
		if _, ok := purgeVariants[base]; !ok {
			return fmt.Errorf("unknown variant %q (want none, delete, river, river-nopause, loop5000, ledgerkeeper[:batch=N][:duty=F][:target=D][:pause=D][:shape=ctid|key|range], any of them [:index=expires_key])", n)
		}
		if _, _, err := variantConfig(n, lkCfg); err != nil {
			return err
		}
	}

	srv, err := startServer(ctx, *dbURL, logf)
	if err != nil {
		return err
	}
	defer srv.stop()

	keys := int64(2_000_000 * *scale)
	const base = "lkbench_purge_base"
	if err := buildBase(ctx, srv, base, keys, logf); err != nil {
		return err
	}
	defer srv.dropDB(context.WithoutCancel(ctx), base)

	if *rounds < 1 {
		return fmt.Errorf("--rounds must be at least 1")
	}
	var results []purgeResult
	for round := range *rounds {
		order := slices.Clone(names)
		if round%2 == 1 {
			slices.Reverse(order) // ABBA: neither variant always runs on a warmer machine
		}
		for _, name := range order {
			if ctx.Err() != nil {
				return ctx.Err()
			}
			r, err := runVariant(ctx, srv, base, name, lkCfg, *rate, *workers, *warmup, *baseline, *after, logf)
			if err != nil {
				return fmt.Errorf("variant %s: %w", name, err)
			}
			r.Round = round + 1
			results = append(results, r)
		}
	}

	fmt.Fprintf(stdout, "keys %d (%d expired), writer %.0f claim+complete/s, %d workers; ledgerkeeper: batch_size %d, duty_cycle %.2f, batch_target %s, batch_pause %s\n\n",
		keys, keys/2, *rate, *workers, lkCfg.BatchSize, lkCfg.DutyCycle, lkCfg.BatchTarget, lkCfg.BatchPause)
	printPurgeResults(stdout, results)
	if *rounds > 1 {
		fmt.Fprintln(stdout)
		printPurgeSpread(stdout, names, results)
	}
	if *jsonOut != "" {
		b, _ := json.MarshalIndent(map[string]any{
			"keys": keys, "rate": *rate, "workers": *workers, "scale": *scale,
			"ledgerkeeper": map[string]any{"batch_size": lkCfg.BatchSize, "duty_cycle": lkCfg.DutyCycle,
				"batch_target": lkCfg.BatchTarget.String(), "batch_pause": lkCfg.BatchPause.String()},
			"results": results,
		}, "", "  ")
		if err := os.WriteFile(*jsonOut, b, 0o644); err != nil {
			return err
		}
	}
	return nil
}

// extraIndexes are the indexes a variant can add to its copy of the ledger
// before the writer starts (":index=NAME"), so that both the purge that uses
// it and the writer that maintains it are measured with it.
var extraIndexes = map[string]string{
	// The keyset order itself: the purge's candidates come out of it in
	// (expires_at, key) order, with no sort of ties on expires_at.
	"expires_key": `CREATE INDEX idempotency_keys_expires_at_key_idx ON idempotency_keys (expires_at, key)`,
}

// variantConfig applies a variant's overrides ("ledgerkeeper:duty=0.15:batch=500",
// "ledgerkeeper:shape=key", "none:index=expires_key") to the purger's
// configuration, and returns the extra index it asks for ("" for none).
func variantConfig(name string, cfg expiry.Config) (expiry.Config, string, error) {
	parts := strings.Split(name, ":")
	index := ""
	for _, kv := range parts[1:] {
		k, v, _ := strings.Cut(kv, "=")
		var err error
		switch k {
		case "shape":
			cfg.BatchShape = store.PurgeShape(v)
			if !cfg.BatchShape.Known() {
				err = fmt.Errorf("unknown shape (want %s, %s or %s)", store.PurgeByCTID, store.PurgeByKey, store.PurgeByRange)
			}
		case "index":
			index = v
			if _, ok := extraIndexes[v]; !ok {
				err = errors.New("unknown index (want expires_key)")
			}
		case "batch":
			_, err = fmt.Sscan(v, &cfg.BatchSize)
		case "duty":
			_, err = fmt.Sscan(v, &cfg.DutyCycle)
		case "target":
			cfg.BatchTarget, err = time.ParseDuration(v)
		case "pause":
			cfg.BatchPause, err = time.ParseDuration(v)
		default:
			err = fmt.Errorf("unknown setting %q", k)
		}
		if err != nil {
			return cfg, "", fmt.Errorf("variant %q: %s: %w", name, kv, err)
		}
	}
	return cfg, index, nil
}

func cmpOr[T comparable](v, def T) T {
	var zero T
	if v == zero {
		return def
	}
	return v
}

// buildBase creates the template every variant copies: the schema and
// `keys` keys, created uniformly over the last 40 days with a 20-day TTL,
// so the older half is expired (and far past the 24h floor). The newer half
// expires a day later than that, so nothing crosses over during the run.
// Rows are inserted oldest first, as a real ledger fills.
func buildBase(ctx context.Context, srv *server, name string, keys int64, logf func(string, ...any)) error {
	url, err := srv.createDB(ctx, name, "")
	if err != nil {
		return err
	}
	db, err := newPool(ctx, url, 2, "lkbench")
	if err != nil {
		return err
	}
	defer db.Close()
	if _, err := migrations.Up(ctx, db, nil); err != nil {
		return err
	}
	logf("loading %d keys", keys)
	t0 := time.Now()
	_, err = db.Exec(ctx, `INSERT INTO idempotency_keys (key, tool, request_hash, request_body, status,
		response_code, response_body, created_at, claimed_at, updated_at, expires_at)
	SELECT 'wf-' || i || ':step-' || (i % 7) || ':' || t.tool, t.tool,
	       md5(i::text) || md5((-i)::text),
	       jsonb_build_object('customer_id', 'cus_' || (i % 100000), 'amount_cents', i % 100000, 'summary', 'bench ticket ' || i),
	       CASE WHEN i % 200000 = 1 THEN 'processing' WHEN i % 97 = 0 THEN 'failed_retryable' ELSE 'completed' END,
	       CASE WHEN i % 97 = 0 OR i % 200000 = 1 THEN NULL ELSE 201 END,
	       CASE WHEN i % 97 = 0 OR i % 200000 = 1 THEN NULL
	            ELSE jsonb_build_object('ticket_id', 'T-' || i, 'url', 'https://tickets.example/T-' || i) END,
	       t.c, t.c, t.c + interval '2 seconds',
	       t.c + interval '20 days' + CASE WHEN i > $1 / 2 THEN interval '1 day' ELSE interval '0' END
	FROM generate_series(1, $1::bigint) i,
	     LATERAL (SELECT (ARRAY['create_ticket', 'charge_card', 'send_email', 'update_crm'])[1 + i % 4] AS tool,
	                     now() - interval '40 days' + (i - 0.5) * (interval '40 days' / $1::bigint) AS c) t`, keys)
	if err != nil {
		return fmt.Errorf("load: %w", err)
	}
	logf("loaded in %s; vacuum, analyze", time.Since(t0).Round(time.Second))
	// Settled pages (hint bits, visibility map), as an old ledger's are.
	if _, err := db.Exec(ctx, `VACUUM (ANALYZE) idempotency_keys`); err != nil {
		return err
	}
	return nil
}

func runVariant(ctx context.Context, srv *server, base, name string, lkCfg expiry.Config, rate float64, workers int,
	warmup, baseline, after time.Duration, logf func(string, ...any)) (purgeResult, error) {
	res := purgeResult{Variant: name}
	dbName := fmt.Sprintf("lkbench_purge_%d", time.Now().UnixNano())
	url, err := srv.createDB(ctx, dbName, base)
	if err != nil {
		return res, err
	}
	defer srv.dropDB(context.WithoutCancel(ctx), dbName)
	writerPool, err := newPool(ctx, url, int32(workers), "lkbench-writer") //nolint:gosec // G115: a benchmark flag; a pool beyond int32 is not a benchmark anyone runs
	if err != nil {
		return res, err
	}
	defer writerPool.Close()
	adminPool, err := newPool(ctx, url, 2, "lkbench-admin")
	if err != nil {
		return res, err
	}
	defer adminPool.Close()
	meter := newWALMeter(ctx, adminPool, logf)
	purgeURL := url
	if meter.ok {
		purgeURL = asRole(url, purgeRole)
	}
	purgePool, err := newPool(ctx, purgeURL, 4, "lkbench-purge")
	if err == nil && purgePool.Ping(ctx) != nil && purgeURL != url {
		// The role cannot log in here (password auth): estimate instead.
		logf("cannot connect as %s: estimating the purge's WAL by subtracting the writer's", purgeRole)
		purgePool.Close()
		meter.ok = false
		purgePool, err = newPool(ctx, url, 4, "lkbench-purge")
	}
	if err != nil {
		return res, err
	}
	defer purgePool.Close()
	kind, _, _ := strings.Cut(name, ":")
	purge := purgeVariants[kind]
	lkCfg, index, err := variantConfig(name, lkCfg)
	if err != nil {
		return res, err
	}
	if index != "" {
		t := time.Now()
		if _, err := adminPool.Exec(ctx, extraIndexes[index]); err != nil {
			return res, fmt.Errorf("index %s: %w", index, err)
		}
		if _, err := adminPool.Exec(ctx, `ANALYZE idempotency_keys`); err != nil {
			return res, err
		}
		res.IndexSeconds = round2(time.Since(t).Seconds())
		if err := adminPool.QueryRow(ctx, `SELECT pg_relation_size('idempotency_keys_expires_at_key_idx'),
			pg_relation_size('idempotency_keys_expires_at_idx')`).Scan(&res.IndexBytes, &res.ExpiresIndexBytes); err != nil {
			return res, err
		}
		logf("%s: built index %s in %.1fs (%d MiB; the expires_at index: %d MiB)", name, index, res.IndexSeconds, res.IndexBytes>>20, res.ExpiresIndexBytes>>20)
	}
	// Same starting point for every variant: the table read once (OS
	// cache), and a checkpoint (full-page images start afresh).
	if _, err := purgePool.Exec(ctx, `SELECT count(*) FROM idempotency_keys`); err != nil {
		return res, err
	}
	if _, err := purgePool.Exec(ctx, `CHECKPOINT`); err != nil {
		return res, err
	}

	hash := strings.Repeat("ab", 32)
	body := json.RawMessage(`{"customer_id":"cus_1","amount_cents":1200,"summary":"bench"}`)
	loop := &openLoop{rate: rate, workers: workers, op: func(ctx context.Context, i int64) error {
		// The same length for every variant: a fixed-width tag of its name.
		// (Each variant runs on its own copy of the ledger: no key collides.)
		key := fmt.Sprintf("bench-%08x-%012d", crc32.ChecksumIEEE([]byte(name)), i)
		r, err := ledger.Claim(ctx, writerPool, ledger.ClaimParams{Key: key, Tool: "bench_writer", RequestHash: hash, RequestBody: body})
		if err != nil {
			return err
		}
		return ledger.Complete(ctx, writerPool, key, r.Row.ClaimedAt, 201, json.RawMessage(fmt.Sprintf(`{"ticket_id":"T-%d"}`, i)))
	}}
	loopCtx, stopLoop := context.WithCancel(ctx)
	loopDone := make(chan struct{})
	go func() { loop.run(loopCtx); close(loopDone) }()
	defer func() { stopLoop(); <-loopDone }()

	logf("%s: writer warming up", name)
	lsnW0, err := walLSN(ctx, purgePool)
	if err != nil {
		return res, err
	}
	if err := sleepCtx(ctx, warmup); err != nil {
		return res, err
	}
	lsnW1, err := walLSN(ctx, purgePool)
	if err != nil {
		return res, err
	}
	writerWALPerSec := float64(lsnW1-lsnW0) / warmup.Seconds()

	vac0, err := maintenance(ctx, adminPool)
	if err != nil {
		return res, err
	}
	t0 := time.Now()
	if purge == nil {
		logf("%s: measuring the writer alone for %s", name, baseline)
		if err := sleepCtx(ctx, baseline); err != nil {
			return res, err
		}
	} else {
		logf("%s: purging", name)
		lsn0, err := walLSN(ctx, purgePool)
		if err != nil {
			return res, err
		}
		if err := meter.reset(ctx); err != nil {
			return res, err
		}
		res.Rows, err = purge(ctx, purgePool, lkCfg)
		if err != nil {
			return res, err
		}
		lsn1, err := walLSN(ctx, purgePool)
		if err != nil {
			return res, err
		}
		d := time.Since(t0)
		res.Seconds = round2(d.Seconds())
		if res.Rows > 0 {
			res.RowsPerSecond = float64(int64(float64(res.Rows) / d.Seconds()))
			purgeWAL := float64(lsn1-lsn0) - writerWALPerSec*d.Seconds() // estimate: minus the writer at its warm-up rate
			if meter.ok {
				b, fpi, err := meter.bytes(ctx) // exact: the purge role's statements
				if err != nil {
					return res, err
				}
				purgeWAL = float64(b)
				res.WALExact = true
				res.FPIPerRow = round2(float64(fpi) / float64(res.Rows))
			}
			res.WALBytesPerRow = float64(int64(purgeWAL / float64(res.Rows)))
		}
		logf("%s: purged %d rows in %s", name, res.Rows, d.Round(time.Millisecond))
	}
	t1 := time.Now()
	vac1, err := maintenance(ctx, adminPool)
	if err != nil {
		return res, err
	}
	res.Autovacuums, res.Checkpoints = vac1.autovacuums-vac0.autovacuums, vac1.checkpoints-vac0.checkpoints
	logf("%s: measuring the %s after", name, after)
	if err := sleepCtx(ctx, after); err != nil {
		return res, err
	}
	t2 := time.Now()
	stopLoop()
	<-loopDone
	res.Before = loop.window(t0.Add(-warmup), t0)
	res.During = loop.window(t0, t1)
	res.After = loop.window(t1, t2)
	res.ExcessMs, _ = loop.excess(t0, t2, loop.mean(t0.Add(-warmup), t0))
	res.ExcessMs = round2(res.ExcessMs)
	res.ExcessSeconds = round2(t2.Sub(t0).Seconds())
	res.ExcessMsPerSec = round2(res.ExcessMs / t2.Sub(t0).Seconds())
	if res.Rows > 0 {
		res.ExcessMsPer1kRows = round2(res.ExcessMs / float64(res.Rows) * 1000)
	}
	res.Timeline = loop.timeline(t0.Add(-warmup), t2)
	logf("%s: writer during p50 %.2fms p99 %.2fms max %.2fms; after p50 %.2fms p99 %.2fms max %.2fms",
		name, res.During.P50ms, res.During.P99ms, res.During.MaxMs, res.After.P50ms, res.After.P99ms, res.After.MaxMs)
	return res, nil
}

func printPurgeResults(w io.Writer, results []purgeResult) {
	// The ratios' base: the median of every no-purge window of the run
	// (not whichever came last).
	var base *latency
	if b, ok := noneBaseline(results); ok {
		base = &b
	}
	ratio := func(v, b float64) string {
		if base == nil || b == 0 {
			return ""
		}
		return fmt.Sprintf(" (%.2fx)", v/b)
	}
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "variant\trows\tseconds\trows/s\tWAL B/row\twriter before: p50\tp99\tduring: p50\tp99\tmax\tafter: p50\tp99\tmax\texcess ms (over s)\tper 1,000 rows\tautovacuums\tcheckpoints")
	for _, r := range results {
		var b50, b99 float64
		if base != nil {
			b50, b99 = base.P50ms, base.P99ms
		}
		wal := fmt.Sprintf("%.0f", r.WALBytesPerRow)
		if !r.WALExact && r.Rows > 0 {
			wal = "~" + wal
		}
		if r.FPIPerRow > 0 {
			wal += fmt.Sprintf(" (%.2f FPI)", r.FPIPerRow)
		}
		per1k := "–"
		if r.Rows > 0 {
			per1k = fmt.Sprintf("%.1f", r.ExcessMsPer1kRows)
		}
		fmt.Fprintf(tw, "%s\t%d\t%.1f\t%.0f\t%s\t%.2f ms\t%.2f ms\t%.2f ms%s\t%.2f ms%s\t%.1f ms\t%.2f ms%s\t%.2f ms%s\t%.1f ms\t%.0f (%.0f s)\t%s\t%d\t%d\n",
			r.Variant, r.Rows, r.Seconds, r.RowsPerSecond, wal,
			r.Before.P50ms, r.Before.P99ms,
			r.During.P50ms, ratio(r.During.P50ms, b50), r.During.P99ms, ratio(r.During.P99ms, b99), r.During.MaxMs,
			r.After.P50ms, ratio(r.After.P50ms, b50), r.After.P99ms, ratio(r.After.P99ms, b99), r.After.MaxMs,
			r.ExcessMs, r.ExcessSeconds, per1k, r.Autovacuums, r.Checkpoints)
	}
	tw.Flush()
	for _, r := range results {
		if r.IndexBytes > 0 {
			fmt.Fprintf(w, "%s: extra index built in %.1f s, %.1f MiB (the expires_at index: %.1f MiB)\n",
				r.Variant, r.IndexSeconds, float64(r.IndexBytes)/(1<<20), float64(r.ExpiresIndexBytes)/(1<<20))
		}
		if r.During.Errors+r.After.Errors > 0 {
			fmt.Fprintf(w, "%s: %d writer requests failed\n", r.Variant, r.During.Errors+r.After.Errors)
		}
	}
}

// noneBaseline is the median p50 and p99 of the run's no-purge windows.
func noneBaseline(results []purgeResult) (latency, bool) {
	var p50, p99 []float64
	for _, r := range results {
		if r.Variant == "none" {
			p50, p99 = append(p50, r.During.P50ms), append(p99, r.During.P99ms)
		}
	}
	if len(p50) == 0 {
		return latency{}, false
	}
	return latency{P50ms: median(p50), P99ms: median(p99)}, true
}

func median(v []float64) float64 {
	s := slices.Clone(v)
	slices.Sort(s)
	n := len(s)
	if n%2 == 1 {
		return s[n/2]
	}
	return (s[n/2-1] + s[n/2]) / 2
}

// printPurgeSpread summarises rounds: per variant, the median and the
// range over rounds of its writer's p50 and p99 during the purge as a
// ratio to the median no-purge window, and the noise floor beside them:
// the same ratios of the no-purge windows themselves. A claim holds only
// where a variant's whole range clears the noise floor's.
func printPurgeSpread(w io.Writer, names []string, results []purgeResult) {
	base, ok := noneBaseline(results)
	if !ok || base.P50ms == 0 || base.P99ms == 0 {
		fmt.Fprintln(w, "no 'none' variant: no ratios, no noise floor (add none to --variants)")
		return
	}
	// The excess's noise floor: the no-purge windows' extra waiting per
	// second, over as many seconds as the variant's purge and after
	// window took per 1,000 rows.
	var noneRate []float64
	for _, r := range results {
		if r.Variant == "none" {
			noneRate = append(noneRate, r.ExcessMsPerSec)
		}
	}
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "variant\trounds\tduring p50 / none: median\t[min, max]\tp99 / none: median\t[min, max]\trows/s median\texcess writer ms per 1,000 rows: median\t[min, max]\tnone's over the same span: [min, max]")
	for _, name := range names {
		var r50, r99, rps, ex, span []float64
		for _, r := range results {
			if r.Variant == name {
				r50 = append(r50, r.During.P50ms/base.P50ms)
				r99 = append(r99, r.During.P99ms/base.P99ms)
				rps = append(rps, r.RowsPerSecond)
				if r.Rows > 0 {
					ex = append(ex, r.ExcessMsPer1kRows)
					span = append(span, r.ExcessSeconds/float64(r.Rows)*1000)
				}
			}
		}
		if len(r50) == 0 {
			continue
		}
		label := name
		if name == "none" {
			label = "none (noise floor)"
		}
		excess := "–\t–\t–"
		if len(ex) > 0 {
			floor := "–"
			if len(noneRate) > 0 {
				sp := median(span)
				floor = fmt.Sprintf("[%.1f, %.1f]", slices.Min(noneRate)*sp, slices.Max(noneRate)*sp)
			}
			excess = fmt.Sprintf("%.1f\t[%.1f, %.1f]\t%s", median(ex), slices.Min(ex), slices.Max(ex), floor)
		}
		fmt.Fprintf(tw, "%s\t%d\t%.2fx\t[%.2f, %.2f]\t%.2fx\t[%.2f, %.2f]\t%.0f\t%s\n", label, len(r50),
			median(r50), slices.Min(r50), slices.Max(r50), median(r99), slices.Min(r99), slices.Max(r99), median(rps), excess)
	}
	tw.Flush()
}

type maint struct{ autovacuums, checkpoints int64 }

// maintenance reads the autovacuum count of idempotency_keys and the
// checkpoint count, so a result can say what maintenance overlapped it.
func maintenance(ctx context.Context, db *pgxpool.Pool) (maint, error) {
	var m maint
	err := db.QueryRow(ctx, `SELECT
		(SELECT autovacuum_count FROM pg_stat_user_tables WHERE relname = 'idempotency_keys'),
		(SELECT checkpoints_timed + checkpoints_req FROM pg_stat_bgwriter)`).Scan(&m.autovacuums, &m.checkpoints)
	return m, err
}

func round2(f float64) float64 { return float64(int64(f*100)) / 100 }

func sleepCtx(ctx context.Context, d time.Duration) error {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-t.C:
		return nil
	}
}
