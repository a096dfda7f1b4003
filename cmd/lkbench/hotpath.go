package main

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"flag"
	"fmt"
	"hash/crc32"
	"io"
	"maps"
	"net/http"
	"net/http/httptest"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"text/tabwriter"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/ledgerkeeper/ledgerkeeper/ledger"
	"github.com/ledgerkeeper/ledgerkeeper/migrations"
)

// The raw minimum: the two statements ledger.Claim and ledger.Complete
// issue for a new key, copied from ledger/tool.go (the claim as it was
// before it became one statement for every outcome) and sent by plain pgx.
const (
	rawClaim = `INSERT INTO idempotency_keys (key, tool, request_hash, request_body, expires_at)
		VALUES ($1, $2, $3, $4, now() + $5::interval)
		ON CONFLICT (key) DO NOTHING
		RETURNING claimed_at`
	rawComplete = `UPDATE idempotency_keys
		SET status = 'completed', response_code = $3, response_body = $4, updated_at = now()
		WHERE key = $1 AND claimed_at = $2 AND status IN ('processing', 'failed_retryable')`
)

// hotVariants are the handlers measured side by side on one HTTP server.
// "middleware+follow" is "middleware" on a pool of the same size that
// follows the primary across failovers (ledger.FollowPrimary: one atomic
// load per acquire and release, a tracer on every statement): its cost.
var hotVariants = []string{"raw", "middleware", "middleware+follow", "middleware+heartbeat"}

// runHotPath measures the tool side: ledger.Middleware around a trivial
// handler against the raw minimum (the same two statements by plain pgx)
// on the same HTTP server and database, at fixed open-loop arrival rates.
func runHotPath(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("hotpath", flag.ContinueOnError)
	fs.SetOutput(stderr)
	dbURL := fs.String("database-url", "", "use this server instead of an ephemeral durable cluster")
	ratesFlag := fs.String("rates", "250,500,750,1000,1250,1500,2000,2500,3000,4000", "arrival rates (requests/s) to step through")
	stepDur := fs.Duration("step", 5*time.Second, "duration of each rate step")
	halfDur := fs.Duration("half", 15*time.Second, "duration of the run at 50% of the raw minimum's saturation")
	conns := fs.Int("conns", 16, "connections in the tool server's pool")
	inFlight := fs.Int("inflight", 256, "requests in flight at most (client side)")
	contenders := fs.Int("contenders", 50, "concurrent claims of one key in the contention test")
	rounds := fs.Int("rounds", 40, "rounds of the contention test")
	cpuProfile := fs.String("cpuprofile", "", "write a CPU profile of the run at 50% to FILE")
	jsonOut := fs.String("json", "", "also write the results as JSON to FILE")
	if err := fs.Parse(args); err != nil {
		return err
	}
	var rates []float64
	for _, f := range strings.Split(*ratesFlag, ",") {
		r, err := strconv.ParseFloat(strings.TrimSpace(f), 64)
		if err != nil || r <= 0 {
			return fmt.Errorf("--rates: %q is not a positive number", f)
		}
		rates = append(rates, r)
	}
	logf := logger(stderr)
	srv, err := startServer(ctx, *dbURL, logf)
	if err != nil {
		return err
	}
	defer srv.stop()
	url, err := srv.createDB(ctx, "lkbench_hotpath", "")
	if err != nil {
		return err
	}
	defer srv.dropDB(context.WithoutCancel(ctx), "lkbench_hotpath")
	counter := &queryCounter{}
	pc, err := pgxpool.ParseConfig(url)
	if err != nil {
		return err
	}
	pc.MaxConns, pc.MinConns = int32(*conns), int32(*conns) //nolint:gosec // G115: a benchmark flag; a pool beyond int32 is not a benchmark anyone runs
	pc.ConnConfig.Tracer = counter
	pool, err := pgxpool.NewWithConfig(ctx, pc)
	if err != nil {
		return err
	}
	defer pool.Close()
	if _, err := migrations.Up(ctx, pool, nil); err != nil {
		return err
	}
	fc, err := pgxpool.ParseConfig(url)
	if err != nil {
		return err
	}
	fc.MaxConns, fc.MinConns = pc.MaxConns, pc.MinConns
	fc.ConnConfig.Tracer = counter
	ledger.FollowPrimary(fc, ledger.FollowOptions{})
	following, err := pgxpool.NewWithConfig(ctx, fc)
	if err != nil {
		return err
	}
	defer following.Close()

	h := hotHandlers(pool, following)
	ts := httptest.NewServer(h)
	defer ts.Close()
	tr := &http.Transport{MaxIdleConns: *inFlight, MaxIdleConnsPerHost: *inFlight, IdleConnTimeout: time.Minute}
	defer tr.CloseIdleConnections()
	client := &http.Client{Transport: tr, Timeout: 30 * time.Second}
	var seq atomic.Int64
	call := func(ctx context.Context, variant, key string) (int, bool, error) {
		body := `{"title":"bench ticket","customer_id":"cus_42","amount_cents":1200}`
		req, err := http.NewRequestWithContext(ctx, http.MethodPost, ts.URL+"/"+variant, strings.NewReader(body))
		if err != nil {
			return 0, false, err
		}
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set(ledger.HeaderIdempotencyKey, key)
		resp, err := client.Do(req)
		if err != nil {
			return 0, false, err
		}
		_, _ = io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		replayed := resp.Header.Get(ledger.HeaderReplayed) == "true"
		if resp.StatusCode != http.StatusCreated {
			return resp.StatusCode, replayed, fmt.Errorf("%s: status %d", variant, resp.StatusCode)
		}
		return resp.StatusCode, replayed, nil
	}
	fresh := func(variant string) func(ctx context.Context, i int64) error {
		return func(ctx context.Context, _ int64) error {
			// Keys of one length for every variant: a fixed-width tag of
			// the variant and a zero-padded sequence.
			_, _, err := call(ctx, variant, fmt.Sprintf("%08x-%012d", crc32.ChecksumIEEE([]byte(variant)), seq.Add(1)))
			return err
		}
	}
	out := hotReport{LoadBefore: loadAvg()}

	// 1. Round trips and WAL per request, one request at a time.
	for _, v := range hotVariants {
		for _, replay := range []bool{false, true} {
			if replay && v == "raw" {
				continue // the raw minimum has no replay
			}
			const n = 200
			key := fmt.Sprintf("count-%s-%d", v, seq.Add(1))
			if replay {
				if _, _, err := call(ctx, v, key); err != nil {
					return err
				}
			}
			wal0, err := walLSN(ctx, pool)
			if err != nil {
				return err
			}
			q0 := counter.n.Load()
			for range n {
				k := key
				if !replay {
					k = fmt.Sprintf("count-%s-%d", v, seq.Add(1))
				}
				_, replayed, err := call(ctx, v, k)
				if err != nil {
					return err
				}
				if replayed != replay {
					return fmt.Errorf("%s: replayed %v, want %v", v, replayed, replay)
				}
			}
			q := counter.n.Load() - q0
			wal1, err := walLSN(ctx, pool)
			if err != nil {
				return err
			}
			what := "new key"
			if replay {
				what = "replay"
			}
			out.Costs = append(out.Costs, requestCost{Variant: v, Request: what,
				Statements: float64(q) / n, WALBytes: float64((wal1 - wal0) / int64(n))})
		}
	}

	// 2. Saturation: step the rate up, variants interleaved at each rate,
	// after a warm-up that opens the client's connections.
	drv := openLoopDriver{MaxInFlight: *inFlight}
	for _, v := range hotVariants {
		drv.Run(ctx, rates[0], 2*time.Second, fresh(v))
	}
	if _, err := pool.Exec(ctx, `CREATE EXTENSION IF NOT EXISTS pg_stat_statements`); err != nil {
		return err
	}
	if _, err := pool.Exec(ctx, `SELECT pg_stat_statements_reset()`); err != nil {
		return err
	}
	// A variant stops after two rates in a row it did not sustain: on a
	// shared machine one step can fail for a neighbour's burst.
	failed := map[string]int{}
	saturated := map[string]bool{}
	for i, rate := range rates {
		for j := range hotVariants {
			// The order rotates with the rate: no variant always runs
			// first (on a cooler machine) or last.
			v := hotVariants[(i+j)%len(hotVariants)]
			if saturated[v] {
				continue
			}
			s := drv.Run(ctx, rate, *stepDur, fresh(v))
			logf("%-22s %5.0f/s: achieved %5.0f/s, p50 %6.2f ms, p99 %7.2f ms, skipped %d, errors %d, load %s",
				v, rate, s.Achieved, s.P50ms, s.P99ms, s.Skipped, s.Errors, loadAvg())
			out.Steps = append(out.Steps, variantStep{Variant: v, loadStep: s})
			if s.Sustained {
				failed[v] = 0
			} else if failed[v]++; failed[v] == 2 {
				saturated[v] = true
			}
		}
		if len(saturated) == len(hotVariants) {
			break
		}
	}
	out.Saturation = map[string]float64{}
	for _, s := range out.Steps {
		out.Saturation[s.Variant] = max(out.Saturation[s.Variant], s.Achieved)
	}
	// The grid's steps are 15-30% apart, wider than the margins the
	// targets ask for: bisect between each variant's best sustained rate
	// and the next it did not sustain, to 5%.
	out.Bisected = map[string]float64{}
	for _, v := range hotVariants {
		lo, hi := bracketOf(out.Steps, v)
		if lo == 0 || hi == 0 {
			continue // never sustained, or never failed: the grid is the answer
		}
		for n := 0; hi/lo > 1.05 && n < 8; n++ {
			mid := (lo + hi) / 2
			s := drv.Run(ctx, mid, *stepDur, fresh(v))
			logf("bisect %-22s %5.0f/s: achieved %5.0f/s, p99 %7.2f ms, sustained %v, load %s", v, mid, s.Achieved, s.P99ms, s.Sustained, loadAvg())
			if s.Sustained {
				lo = mid
			} else {
				hi = mid
			}
		}
		out.Bisected[v] = lo
	}

	// 3. Latency at 50% of the raw minimum's saturation, variants
	// alternating, twice.
	half := out.Saturation["raw"] / 2
	if b := out.Bisected["raw"]; b > 0 {
		half = b / 2
	}
	stopProfile, err := startCPUProfile(*cpuProfile)
	if err != nil {
		return err
	}
	out.HalfRate = half
	// CPU per request: on two cores the driver, the server and PostgreSQL
	// share the CPU, so latency there says more about the scheduler than
	// about the variant; the CPU each request cost does not.
	pgc, err := newPGCPU(ctx, pool)
	if err != nil {
		return err
	}
	for round := range 2 {
		for j := range hotVariants {
			v := hotVariants[(round+j)%len(hotVariants)]
			g0, p0 := selfCPU(), time.Duration(0)
			if p0, err = pgc.sample(); err != nil {
				return err
			}
			s := drv.Run(ctx, half, *halfDur, fresh(v))
			p1, err := pgc.sample()
			if err != nil {
				return err
			}
			step := variantStep{Variant: v, loadStep: s}
			if done := s.Sent - s.Errors; done > 0 {
				step.ProcessCPUus = round2(float64((selfCPU() - g0).Microseconds()) / float64(done))
				step.PGCPUus = round2(float64((p1 - p0).Microseconds()) / float64(done))
			}
			logf("at 50%%: %-22s %5.0f/s: p50 %6.2f ms, p99 %7.2f ms, errors %d, CPU per request: process %.0f µs, PostgreSQL %.0f µs, load %s",
				v, half, s.P50ms, s.P99ms, s.Errors, step.ProcessCPUus, step.PGCPUus, loadAvg())
			out.Half = append(out.Half, step)
			out.LoadDuring = append(out.LoadDuring, loadAvg())
		}
	}
	stopProfile()
	if out.Statements, err = topStatements(ctx, pool, 6); err != nil {
		return err
	}

	// 4. ledger.Claim of one key by many at once.
	for _, completed := range []bool{false, true} {
		c, err := contend(ctx, pool, counter, *contenders, *rounds, completed)
		if err != nil {
			return err
		}
		out.Contention = append(out.Contention, c)
	}
	printHotPath(stdout, out)
	if *jsonOut != "" {
		b, _ := json.MarshalIndent(out, "", "  ")
		return os.WriteFile(*jsonOut, b, 0o644)
	}
	return nil
}

// hotHandlers serves /raw, /middleware and /middleware+heartbeat.
func hotHandlers(pool, following *pgxpool.Pool) http.Handler {
	tool := func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusCreated)
		_, _ = io.WriteString(w, `{"ticket_id":"T-1"}`)
	}
	mux := http.NewServeMux()
	mux.Handle("/middleware", ledger.Middleware(ledger.MiddlewareConfig{DB: pool, Tool: "create_ticket"}, http.HandlerFunc(tool)))
	mux.Handle("/middleware+follow", ledger.Middleware(ledger.MiddlewareConfig{DB: following, Tool: "create_ticket"}, http.HandlerFunc(tool)))
	mux.Handle("/middleware+heartbeat", ledger.Middleware(ledger.MiddlewareConfig{DB: pool, Tool: "create_ticket"},
		http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			a, ok := ledger.AttemptFromContext(r.Context())
			if !ok {
				http.Error(w, `{"error":"no attempt"}`, http.StatusInternalServerError)
				return
			}
			if err := a.Heartbeat(r.Context()); err != nil {
				http.Error(w, `{"error":"heartbeat"}`, http.StatusInternalServerError)
				return
			}
			tool(w, r)
		})))
	// The raw minimum: the claim, the handler, the completion, the answer;
	// no canonical JSON, no envelope, no outcome checks.
	mux.HandleFunc("/raw", func(w http.ResponseWriter, r *http.Request) {
		key := r.Header.Get(ledger.HeaderIdempotencyKey)
		body, err := io.ReadAll(r.Body)
		if err != nil {
			http.Error(w, "read body", http.StatusBadRequest)
			return
		}
		sum := sha256.Sum256(body)
		var claimedAt time.Time
		if err := pool.QueryRow(r.Context(), rawClaim, key, "create_ticket", hex.EncodeToString(sum[:]), string(body), ledger.DefaultTTL).Scan(&claimedAt); err != nil {
			http.Error(w, "claim: "+err.Error(), http.StatusServiceUnavailable)
			return
		}
		rec := &bytesRecorder{header: http.Header{}}
		tool(rec, r)
		if _, err := pool.Exec(context.WithoutCancel(r.Context()), rawComplete, key, claimedAt, rec.code, rec.body.String()); err != nil {
			http.Error(w, "complete: "+err.Error(), http.StatusServiceUnavailable)
			return
		}
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(rec.code)
		_, _ = w.Write(rec.body.Bytes())
	})
	return mux
}

// bytesRecorder keeps a handler's answer, as the middleware must before it
// stores it.
type bytesRecorder struct {
	header http.Header
	code   int
	body   bytes.Buffer
}

func (r *bytesRecorder) Header() http.Header { return r.header }
func (r *bytesRecorder) WriteHeader(code int) {
	if r.code == 0 {
		r.code = code
	}
}
func (r *bytesRecorder) Write(b []byte) (int, error) {
	if r.code == 0 {
		r.code = http.StatusOK
	}
	return r.body.Write(b)
}

// queryCounter counts the statements a pool sends (one per round trip:
// nothing here batches).
type queryCounter struct{ n atomic.Int64 }

func (c *queryCounter) TraceQueryStart(ctx context.Context, _ *pgx.Conn, _ pgx.TraceQueryStartData) context.Context {
	c.n.Add(1)
	return ctx
}

func (c *queryCounter) TraceQueryEnd(context.Context, *pgx.Conn, pgx.TraceQueryEndData) {}

type requestCost struct {
	Variant    string  `json:"variant"`
	Request    string  `json:"request"`
	Statements float64 `json:"statements_per_request"`
	WALBytes   float64 `json:"wal_bytes_per_request"`
}

type variantStep struct {
	Variant string `json:"variant"`
	loadStep
	// ProcessCPUus and PGCPUus are the CPU per completed request of this
	// process (the driver and the tool server together) and of
	// PostgreSQL's processes, over the run (the runs at 50% only).
	ProcessCPUus float64 `json:"process_cpu_us_per_request,omitempty"`
	PGCPUus      float64 `json:"postgresql_cpu_us_per_request,omitempty"`
}

type contention struct {
	Key        string  `json:"key"`
	Contenders int     `json:"contenders"`
	Rounds     int     `json:"rounds"`
	ClaimsPS   float64 `json:"claims_per_sec"`
	WinnerP50  float64 `json:"winner_p50_ms"`
	LoserP50   float64 `json:"loser_p50_ms"`
	LoserP99   float64 `json:"loser_p99_ms"`
	Statements float64 `json:"statements_per_claim"`
	Outcomes   string  `json:"outcomes"`
}

type hotReport struct {
	Costs      []requestCost      `json:"costs"`
	Steps      []variantStep      `json:"steps"`
	Saturation map[string]float64 `json:"saturation_per_sec"`
	// Bisected is each variant's highest sustained rate, bisected to 5%
	// between the grid's last sustained and first unsustained steps.
	Bisected   map[string]float64 `json:"saturation_bisected_per_sec"`
	HalfRate   float64            `json:"half_rate"`
	Half       []variantStep      `json:"half"`
	Contention []contention       `json:"contention"`
	Statements []statement        `json:"statements"`
	LoadBefore string             `json:"load_before"`
	LoadDuring []string           `json:"load_during"`
}

// contend claims one key from n goroutines released together, rounds
// times: on a key nobody holds yet (one wins, the others find it in
// flight), or on a completed key (all replay).
func contend(ctx context.Context, pool *pgxpool.Pool, counter *queryCounter, n, rounds int, completed bool) (contention, error) {
	c := contention{Key: "new key (one wins, the rest in flight)", Contenders: n, Rounds: rounds}
	if completed {
		c.Key = "completed key (all replay)"
	}
	var winners, losers []time.Duration
	outcomes := map[string]int{}
	var busy time.Duration
	var statements int64
	for r := range rounds {
		key := fmt.Sprintf("contend-%v-%d", completed, r)
		p := ledger.ClaimParams{Key: key, Tool: "create_ticket", RequestHash: strings.Repeat("a", 64), RequestBody: json.RawMessage(`{"n":1}`)}
		if completed {
			res, err := ledger.Claim(ctx, pool, p)
			if err != nil {
				return c, err
			}
			if err := ledger.Complete(ctx, pool, key, res.Row.ClaimedAt, 201, json.RawMessage(`{"ticket_id":"T-1"}`)); err != nil {
				return c, err
			}
		}
		q0 := counter.n.Load()
		gate := make(chan struct{})
		var wg sync.WaitGroup
		var mu sync.Mutex
		var errs []error
		for range n {
			wg.Add(1)
			go func() {
				defer wg.Done()
				<-gate
				start := time.Now()
				res, err := ledger.Claim(ctx, pool, p)
				took := time.Since(start)
				mu.Lock()
				defer mu.Unlock()
				if err != nil {
					errs = append(errs, err)
					return
				}
				outcomes[res.Outcome.String()]++
				if res.Outcome == ledger.New {
					winners = append(winners, took)
				} else {
					losers = append(losers, took)
				}
			}()
		}
		start := time.Now()
		close(gate)
		wg.Wait()
		busy += time.Since(start)
		if len(errs) > 0 {
			return c, errs[0]
		}
		statements += counter.n.Load() - q0
	}
	total := len(winners) + len(losers)
	c.ClaimsPS = float64(int(float64(total) / busy.Seconds()))
	c.Statements = round2(float64(statements) / float64(total))
	slices.Sort(winners)
	slices.Sort(losers)
	if len(winners) > 0 {
		c.WinnerP50 = ms(quantile(winners, 0.5))
	}
	if len(losers) > 0 {
		c.LoserP50, c.LoserP99 = ms(quantile(losers, 0.5)), ms(quantile(losers, 0.99))
	}
	var parts []string
	for _, k := range slices.Sorted(maps.Keys(outcomes)) {
		parts = append(parts, fmt.Sprintf("%s %d", k, outcomes[k]))
	}
	c.Outcomes = strings.Join(parts, ", ")
	return c, nil
}

// bracketOf is the highest rate v sustained on the grid and the lowest
// above it that it did not (0 when there is none).
func bracketOf(steps []variantStep, v string) (lo, hi float64) {
	for _, s := range steps {
		if s.Variant == v && s.Sustained && s.Rate > lo {
			lo = s.Rate
		}
	}
	for _, s := range steps {
		if s.Variant == v && !s.Sustained && s.Rate > lo && (hi == 0 || s.Rate < hi) {
			hi = s.Rate
		}
	}
	return lo, hi
}

func printHotPath(w io.Writer, r hotReport) {
	fmt.Fprintf(w, "tool side hot path: one HTTP server, one durable PostgreSQL; load before %s\n\n", r.LoadBefore)
	fmt.Fprintln(w, "statements and WAL per request (one request at a time, counted by a pgx tracer)")
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "variant\trequest\tstatements\tWAL bytes")
	for _, c := range r.Costs {
		fmt.Fprintf(tw, "%s\t%s\t%.2f\t%.0f\n", c.Variant, c.Request, c.Statements, c.WALBytes)
	}
	tw.Flush()
	fmt.Fprintln(w, "\nopen-loop steps (fresh key per request)")
	tw = tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "variant\trate/s\tachieved/s\tp50 ms\tp99 ms\tmax ms\tskipped\terrors\tsustained")
	for _, s := range r.Steps {
		fmt.Fprintf(tw, "%s\t%.0f\t%.0f\t%.2f\t%.2f\t%.2f\t%d\t%d\t%v\n", s.Variant, s.Rate, s.Achieved, s.P50ms, s.P99ms, s.MaxMs, s.Skipped, s.Errors, s.Sustained)
	}
	tw.Flush()
	raw := r.Saturation["raw"]
	fmt.Fprintln(w, "\nthroughput at saturation (best achieved/s of any step)")
	for _, v := range hotVariants {
		fmt.Fprintf(w, "  %-22s %6.0f/s  %.2f of raw\n", v, r.Saturation[v], r.Saturation[v]/raw)
	}
	if len(r.Bisected) > 0 {
		fmt.Fprintln(w, "\nhighest sustained rate, bisected to 5% between the grid's steps")
		rawB := r.Bisected["raw"]
		for _, v := range hotVariants {
			if b, ok := r.Bisected[v]; ok {
				ratio := ""
				if rawB > 0 {
					ratio = fmt.Sprintf("  %.2f of raw", b/rawB)
				}
				fmt.Fprintf(w, "  %-22s %6.0f/s%s\n", v, b, ratio)
			}
		}
	}
	fmt.Fprintf(w, "\nat 50%% of the raw minimum's saturation (%.0f/s), two runs each, alternating\n", r.HalfRate)
	tw = tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "variant\tp50 ms\tp99 ms\tmax ms\terrors\tp50 / raw\tp99 / raw\tCPU µs/request: process (driver + server)\tPostgreSQL\tboth / raw's")
	rawP50, rawP99, rawCPU := map[int]float64{}, map[int]float64{}, map[int]float64{}
	seen := map[string]int{}
	for _, s := range r.Half {
		if s.Variant == "raw" {
			rawP50[seen["raw"]], rawP99[seen["raw"]] = s.P50ms, s.P99ms
			rawCPU[seen["raw"]] = s.ProcessCPUus + s.PGCPUus
		}
		seen[s.Variant]++
	}
	seen = map[string]int{}
	for _, s := range r.Half {
		i := seen[s.Variant]
		seen[s.Variant]++
		fmt.Fprintf(tw, "%s\t%.2f\t%.2f\t%.2f\t%d\t%.2f\t%.2f\t%.0f\t%.0f\t%.2f\n", s.Variant, s.P50ms, s.P99ms, s.MaxMs, s.Errors, s.P50ms/rawP50[i], s.P99ms/rawP99[i],
			s.ProcessCPUus, s.PGCPUus, (s.ProcessCPUus+s.PGCPUus)/rawCPU[i])
	}
	tw.Flush()
	best := map[string]loadStep{}
	for _, s := range r.Half {
		b, ok := best[s.Variant]
		if !ok || s.P99ms < b.P99ms {
			b.P99ms = s.P99ms
		}
		if !ok || s.P50ms < b.P50ms {
			b.P50ms = s.P50ms
		}
		best[s.Variant] = b
	}
	fmt.Fprintln(w, "best of the runs (the machine is shared: the lower figure is the less disturbed)")
	for _, v := range hotVariants {
		b := best[v]
		fmt.Fprintf(w, "  %-22s p50 %6.2f ms (%.2f of raw)  p99 %7.2f ms (%.2f of raw)\n", v, b.P50ms, b.P50ms/best["raw"].P50ms, b.P99ms, b.P99ms/best["raw"].P99ms)
	}
	fmt.Fprintln(w, "\nPostgreSQL's execution time per statement over the steps and the runs at 50% (pg_stat_statements)")
	tw = tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "calls\tmean ms\ttotal ms\tstatement")
	for _, st := range r.Statements {
		fmt.Fprintf(tw, "%d\t%.3f\t%.0f\t%s\n", st.Calls, st.MeanMs, st.TotalMs, st.Query)
	}
	tw.Flush()
	fmt.Fprintln(w, "\nledger.Claim of one key by many at once")
	tw = tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "key\tcontenders\trounds\tclaims/s\twinner p50 ms\tothers p50 ms\tothers p99 ms\tstatements/claim\toutcomes")
	for _, c := range r.Contention {
		fmt.Fprintf(tw, "%s\t%d\t%d\t%.0f\t%.2f\t%.2f\t%.2f\t%.2f\t%s\n", c.Key, c.Contenders, c.Rounds, c.ClaimsPS, c.WinnerP50, c.LoserP50, c.LoserP99, c.Statements, c.Outcomes)
	}
	tw.Flush()
	fmt.Fprintf(w, "\nload during the runs at 50%%: %s\n", strings.Join(r.LoadDuring, " | "))
}
