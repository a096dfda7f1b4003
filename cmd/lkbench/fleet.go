package main

import (
	"bytes"
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"maps"
	"net"
	neturl "net/url"
	"os"
	"runtime/metrics"
	"runtime/pprof"
	"slices"
	"strconv"
	"strings"
	"sync"
	"text/tabwriter"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/ledgerkeeper/ledgerkeeper/internal/daemon"
	"github.com/ledgerkeeper/ledgerkeeper/ledger"
	"github.com/ledgerkeeper/ledgerkeeper/ledger/ledgertest/pgembed"
	"github.com/ledgerkeeper/ledgerkeeper/migrations"
	"github.com/ledgerkeeper/ledgerkeeper/probes"
	"github.com/ledgerkeeper/ledgerkeeper/reconcile"
)

// The variants of lkbench fleet, each run once per round in rotating
// order. --variants names them; a name is parsed by parseFleetVariant.
const (
	// variantSingle: every stuck key in one ledger (the default schema of
	// its own database), one engine.
	variantSingle = "single"
	// variantFleet: the same number of keys spread evenly over the
	// fleet's ledgers (schemas spread over --databases databases), one
	// engine per ledger, every pass at once; each ledger with a pool of its
	// own of daemon.FleetLedgerConns connections, as serve gives it.
	variantFleet = "fleet"
	// variantHung: the fleet's passes beside one more ledger, in a
	// database of its own behind a proxy that stops forwarding mid-pass.
	variantHung = "fleet+hung"
)

// hangTrigger is what the hung ledger's database stops at: the locking
// read of a group of decisions (store.DecideMany), so its keys are leased
// and probed and their verdicts are being written when the database stops
// answering. pgx sends a statement's text when it first prepares it on a
// connection: the hung ledger gets a fresh pool for every pass.
const hangTrigger = "FOR NO KEY UPDATE OF k"

// fleetConfig is how one variant's engines reach their ledgers: its pools
// and their connections' settings.
type fleetConfig struct {
	name   string
	single bool
	// perLedger: a pool per ledger, its connections seeing that ledger's
	// statements only (the fleet's default, as in serve); otherwise one
	// per database, shared by its ledgers (/db:N).
	perLedger bool
	// conns is each pool's MaxConns (and MinConns); 0: --max-conns, or
	// for a pool per ledger daemon.FleetLedgerConns, serve's default.
	conns int32
	// generic sets plan_cache_mode=force_generic_plan on every connection.
	generic bool
	// describe makes pgx's QueryExecModeCacheDescribe the default: no
	// statement prepared by name, each execution planned.
	describe bool
}

// parseFleetVariant parses a variant's name: single or fleet (a pool per
// ledger, of serve's default size), then any of
//
//	/db:N      one pool per database of N connections, shared by its
//	           ledgers (single: its one pool of N)
//	/ledger:N  (fleet only) one pool per ledger of N connections
//	+generic   plan_cache_mode=force_generic_plan on every connection
//	+describe  pgx.QueryExecModeCacheDescribe as the pools' default mode
//
// so fleet/ledger:4, fleet/db:72, single+generic.
func parseFleetVariant(s string) (fleetConfig, error) {
	c := fleetConfig{name: s}
	base, rest := s, ""
	if i := strings.IndexAny(s, "/+"); i >= 0 {
		base, rest = s[:i], s[i:]
	}
	switch base {
	case variantSingle:
		c.single = true
	case variantFleet:
		c.perLedger = true
	default:
		return c, fmt.Errorf("variant %q: a variant is single or fleet, then any of /db:N, /ledger:N, +generic, +describe", s)
	}
	for rest != "" {
		tok := rest
		if j := strings.IndexAny(rest[1:], "/+"); j >= 0 {
			tok, rest = rest[:j+1], rest[j+1:]
		} else {
			rest = ""
		}
		switch {
		case tok == "+generic":
			c.generic = true
		case tok == "+describe":
			c.describe = true
		case strings.HasPrefix(tok, "/db:") || strings.HasPrefix(tok, "/ledger:"):
			kind, num, _ := strings.Cut(tok[1:], ":")
			n, err := strconv.ParseInt(num, 10, 32)
			if err != nil || n < 1 || n > 1000 {
				return c, fmt.Errorf("variant %q: %s wants a number of connections from 1 to 1000", s, tok)
			}
			if kind == "ledger" && c.single {
				return c, fmt.Errorf("variant %q: the single ledger has one pool: /db:N", s)
			}
			c.perLedger, c.conns = kind == "ledger", int32(n)
		default:
			return c, fmt.Errorf("variant %q: unknown part %q (want /db:N, /ledger:N, +generic or +describe)", s, tok)
		}
	}
	return c, nil
}

// runFleet measures one process keeping many ledgers: reconcile passes of
// a fleet of ledgers (schemas of two databases, one engine each, all at
// once) against the same stuck keys in one ledger, and the fleet's passes
// with and without a ledger whose database hangs mid-pass. --variants adds
// other ways of reaching the same ledgers (pools per ledger, larger pools,
// plan_cache_mode), each measured in the same rounds.
func runFleet(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("fleet", flag.ContinueOnError)
	fs.SetOutput(stderr)
	var (
		nLedgers     = fs.Int("ledgers", 50, "ledgers of the fleet, each a schema")
		nDatabases   = fs.Int("databases", 2, "databases the fleet's ledgers are spread over; each has one pool, shared by its ledgers")
		keys         = fs.Int("keys", 1000, "stuck keys per pass: spread evenly over the fleet's ledgers, or all in the single ledger")
		concurrency  = fs.Int("concurrency", 32, "reconcile.concurrency of every engine: the single ledger's, each fleet ledger's and the hung ledger's")
		capacity     = fs.Int("downstream-capacity", -1, "lookups the downstream serves at once, the others waiting their turn (default: --concurrency, so the fleet and the single ledger have the same ideal rate; 0: no bound)")
		maxConns     = fs.Int("max-conns", 0, "connections of the single ledger's pool when its variant names none (default: --concurrency+4, the daemon's default for one ledger)")
		variantsFlag = fs.String("variants", variantSingle+","+variantFleet, "variants measured in every round, comma-separated: single or fleet (a pool per ledger of serve's default size), then any of /db:N (a pool per database of N connections, shared by its ledgers), /ledger:N (a pool per ledger of N), +generic (plan_cache_mode=force_generic_plan), +describe (pgx QueryExecModeCacheDescribe); e.g. single,single+generic,fleet,fleet/ledger:4,fleet/db:72,fleet+generic. Ratios are against the first single variant")
		latency      = fs.Duration("latency", 20*time.Millisecond, "the downstream's answer time")
		passes       = fs.Int("passes", 9, "measured rounds, each running every variant once in rotating order, after the warm-up passes")
		bracket      = fs.String("bracket", bracketOff, "the self-check bracket around each batch of verdicts: off (a stored check vouches, a daemon's usual pass) or on (every ledger checks its probe in every pass)")
		hang         = fs.Bool("hang", true, "also run the fleet beside a ledger whose database hangs mid-pass (needs the fleet variant)")
		hangTimeout  = fs.Duration("hang-timeout", 3*time.Second, "the context timeout of the hung ledger's pass")
		hangWait     = fs.Duration("hang-wait", 25*time.Second, "how long past its timeout the hung ledger's pass may run before its database answers again (the overshoot is reported)")
		warmup       = fs.Int("warmup", 40, "warm-up passes of every variant before the measured rounds (a fleet ledger's statements reach a connection's generic plan only after several passes: a daemon's first minutes)")
		reload       = fs.String("reload", reloadDelete, "how a pass's keys replace the last pass's: delete (DELETE and no VACUUM ANALYZE after the first load: the caches a long-running daemon keeps between passes survive; autovacuum runs as it would) or truncate (TRUNCATE, then VACUUM ANALYZE: every table gets a new file and new statistics, so every connection's cached plans and catalog entries for it are invalidated before every pass, which no daemon does)")
		stmtCache    = fs.Int("statement-cache", 0, "pgx statement_cache_capacity of the engines' pools (0: pgx's default, 512 per connection)")
		serverSets   = fs.String("server-settings", "", "extra settings of the benchmark's PostgreSQL, comma-separated name=value (e.g. autovacuum=off, to see what autovacuum's ANALYZE of the ledgers' tables costs the cached plans)")
		jsonOut      = fs.String("json", "", "also write the results as JSON to FILE")
		cpuProfile   = fs.String("cpuprofile", "", "write a CPU profile of the measured rounds to FILE, each sample labelled with its variant (go tool pprof -tagfocus variant=fleet/ledger:2)")
	)
	if err := fs.Parse(args); err != nil {
		return err
	}
	switch {
	case *nLedgers < 1 || *nDatabases < 1 || *nDatabases > *nLedgers:
		return fmt.Errorf("--ledgers must be at least 1 and --databases between 1 and --ledgers (%d)", *nLedgers)
	case *keys%*nLedgers != 0 || *keys / *nLedgers < 2:
		return fmt.Errorf("--keys (%d) must be a multiple of --ledgers (%d), at least 2 keys per ledger", *keys, *nLedgers)
	case *concurrency < 1 || *passes < 1 || *latency <= 0 || *maxConns < 0 || *hangTimeout <= 0 || *hangWait < 0 || *warmup < 0 || *stmtCache < 0:
		return errors.New("--concurrency and --passes must be at least 1, --latency and --hang-timeout positive, --max-conns, --hang-wait, --warmup and --statement-cache not negative")
	case *bracket != bracketOn && *bracket != bracketOff:
		return fmt.Errorf("--bracket must be on or off, not %q", *bracket)
	case *reload != reloadTruncate && *reload != reloadDelete:
		return fmt.Errorf("--reload must be truncate or delete, not %q", *reload)
	}
	var cfgs []fleetConfig
	var variants []string
	for v := range strings.SplitSeq(*variantsFlag, ",") {
		v = strings.TrimSpace(v)
		c, err := parseFleetVariant(v)
		if err != nil {
			return fmt.Errorf("--variants: %w", err)
		}
		if slices.Contains(variants, v) {
			return fmt.Errorf("--variants: %s twice", v)
		}
		cfgs, variants = append(cfgs, c), append(variants, v)
	}
	baseline := slices.IndexFunc(cfgs, func(c fleetConfig) bool { return c.single })
	switch {
	case baseline < 0:
		return errors.New("--variants: name at least one single variant, the ratios' baseline")
	case *hang && !slices.Contains(variants, variantFleet):
		return errors.New("--hang runs beside the fleet variant: add fleet to --variants, or --hang=false")
	}
	extra := map[string]string{}
	for kv := range strings.SplitSeq(*serverSets, ",") {
		if kv = strings.TrimSpace(kv); kv == "" {
			continue
		}
		k, v, ok := strings.Cut(kv, "=")
		if !ok || strings.TrimSpace(k) == "" {
			return fmt.Errorf("--server-settings: %q is not name=value", kv)
		}
		extra[strings.TrimSpace(k)] = strings.TrimSpace(v)
	}
	if *capacity < 0 {
		*capacity = *concurrency
	}
	if *maxConns == 0 {
		*maxConns = *concurrency + 4
	}
	logf := logger(stderr)
	devNull, err := os.OpenFile(os.DevNull, os.O_WRONLY, 0)
	if err != nil {
		return err
	}
	defer devNull.Close()

	ds, err := startDownstream(*latency, *capacity)
	if err != nil {
		return err
	}
	defer ds.stop()
	b := &fleetBench{keys: *keys, perLedger: *keys / *nLedgers, concurrency: *concurrency, maxConns: int32(*maxConns), //nolint:gosec // G115: a benchmark flag; a pool beyond int32 is not a benchmark anyone runs
		stmtCache: *stmtCache, reload: *reload, bracket: *bracket, hangTimeout: *hangTimeout, hangWait: *hangWait, ds: ds, logs: devNull, logf: logf,
		setups: map[string]*fleetSetup{}}
	defer b.close()
	// Every variant's pools stay open for the whole run (a connection's
	// prepared statements are what some variants are about): the server
	// must admit all of them at once.
	need := 64
	for _, c := range cfgs {
		need += int(b.connsOf(c)) * b.poolsOf(c, *nLedgers, *nDatabases)
	}
	if *hang {
		need += *maxConns
	}
	srv, err := startFleetServer(ctx, max(400, need), extra, logf)
	if err != nil {
		return err
	}
	defer srv.stop()
	b.srv = srv
	if err := b.setup(ctx, *nLedgers, *nDatabases, *hang, cfgs); err != nil {
		return err
	}

	if *hang {
		variants = append(variants, variantHung)
	}
	for i := range *warmup {
		for _, v := range variants {
			if v == variantHung {
				continue
			}
			logf("%s: warm-up pass %d", v, i+1)
			if _, err := b.pass(ctx, v); err != nil {
				return err
			}
		}
	}
	rss0 := selfRSS()
	load0 := loadAvg()
	runs := map[string][]fleetPass{}
	stopProfile, err := startCPUProfile(*cpuProfile)
	if err != nil {
		return err
	}
	defer stopProfile()
	for i := range *passes {
		for j := range variants {
			v := variants[(i+j)%len(variants)]
			var r fleetPass
			pprof.Do(ctx, pprof.Labels("variant", v), func(ctx context.Context) { r, err = b.pass(ctx, v) })
			if err != nil {
				return err
			}
			r.Round = i + 1
			runs[v] = append(runs[v], r)
			logf("round %d, %s: %.0f keys/s, pass %.2fs%s, %.0f µs CPU/key, %.2f plans/key, peak RSS %.0f MiB, load %s",
				i+1, v, r.KeysPerSec, r.Seconds, hungText(r.Hung), (r.GoCPU+r.PGCPU).Seconds()*1e6/float64(r.Keys),
				float64(r.StatementTotals.Plans)/float64(r.Keys), float64(r.PeakRSSKiB)/1024, r.Load)
		}
	}
	out := fleetReport{Ledgers: *nLedgers, Databases: *nDatabases, Keys: *keys, KeysPerLedger: b.perLedger, Concurrency: *concurrency,
		DownstreamCapacity: *capacity, Warmup: *warmup, StatementCache: *stmtCache, MaxConns: *maxConns, LatencyMs: ms(*latency), Bracket: *bracket,
		RSSBeforeKiB: rss0, LoadBefore: load0, LoadAfter: loadAvg()}
	for _, v := range variants {
		inFlight := min(*concurrency, *keys)
		if s := b.setups[v]; s == nil || !s.cfg.single {
			inFlight = *nLedgers * min(*concurrency, b.perLedger)
		}
		out.Variants = append(out.Variants, summariseFleet(v, runs[v], idealRate(inFlight, *capacity, *latency)))
	}
	base := variants[baseline]
	for _, v := range variants {
		if v == base || v == variantHung {
			continue
		}
		target, met := ">= 0.9", func(r float64) bool { return r >= 0.9 }
		if b.setups[v].cfg.single {
			target, met = ">= 0.95 (no regression)", func(r float64) bool { return r >= 0.95 }
		}
		r := ratioOf(v+" / "+base+" keys/s", runs[v], runs[base], func(p fleetPass) float64 { return p.KeysPerSec }, target, met)
		out.Ratios = append(out.Ratios, r)
		if v == variantFleet && base == variantSingle {
			out.FleetOverSingle = &r
		}
	}
	if *hang {
		r := ratioOf("with a hung ledger / without: the fleet's pass seconds (its last ledger's return)", runs[variantHung], runs[variantFleet],
			func(p fleetPass) float64 { return p.Seconds }, "<= 1.2", func(r float64) bool { return r <= 1.2 })
		out.HungOverWithout = &r
		m := ratioOf("with a hung ledger / without: the median ledger's pass seconds", runs[variantHung], runs[variantFleet],
			func(p fleetPass) float64 { return p.LedgerSeconds.Median }, "<= 1.2", func(r float64) bool { return r <= 1.2 })
		out.HungOverWithoutLedger = &m
	}
	printFleet(stdout, out)
	if *jsonOut != "" {
		js, _ := json.MarshalIndent(out, "", "  ")
		return os.WriteFile(*jsonOut, js, 0o644)
	}
	return nil
}

// startFleetServer starts the ephemeral cluster of benchSettings and extra
// admitting maxConns connections.
func startFleetServer(ctx context.Context, maxConns int, extra map[string]string, logf func(string, ...any)) (*server, error) {
	logf("starting an ephemeral durable PostgreSQL cluster (fsync on, max_connections %d; %v)", maxConns, extra)
	settings := maps.Clone(benchSettings)
	maps.Copy(settings, extra)
	// pgembed passes its own max_connections first: a later -c wins.
	settings["max_connections"] = strconv.Itoa(maxConns)
	srv, err := pgembed.Start(ctx, pgembed.Options{Durable: true, Settings: settings, StartTimeout: 2 * time.Minute})
	if err != nil {
		return nil, err
	}
	return &server{adminURL: srv.URL, stop: srv.Stop}, nil
}

// fleetBench holds the ledgers, and every variant's pools and engines on
// them.
type fleetBench struct {
	keys, perLedger, concurrency int
	maxConns                     int32
	stmtCache                    int
	reload                       string
	bracket                      string
	hangTimeout, hangWait        time.Duration
	ds                           *downstreamProc
	srv                          *server
	// singleLoaded and fleetLoaded: a load has truncated and analysed
	// the ledgers once (--reload delete reloads without either after).
	singleLoaded, fleetLoaded bool
	logs                      io.Writer
	logf                      func(string, ...any)
	closers                   []func()

	pg *pgCPU
	// dbs are the fleet's databases, ledgers its ledgers in order (each
	// database's in turn).
	dbs     []*fleetDB
	ledgers []*fleetLedger
	// single is a small pool on the single ledger's database (the default
	// schema), for loading its keys, checking its verdicts and reading
	// pg_stat_statements: no variant's.
	single      *pgxpool.Pool
	singleURL   string
	singleProbe probes.Probe
	// setups are the variants' pools and engines, by variant.
	setups map[string]*fleetSetup
	hung   *hungLedger
}

// fleetDB is one of the fleet's databases; loader is a small pool of its
// own for loading keys and checking verdicts, outside every variant's
// pools (and their statement caches).
type fleetDB struct {
	name    string
	url     string
	loader  *pgxpool.Pool
	ledgers int
}

// fleetLedger is one ledger of the fleet: a schema of a fleet database,
// with a probe of its own (a process builds each ledger's probes from its
// configuration), shared by every variant's engine of the ledger (the
// variants' passes never overlap).
type fleetLedger struct {
	name   string // database/schema
	schema string
	loader *ledger.SchemaDB
	probe  probes.Probe
}

// fleetSetup is a variant's way to its ledgers: its pools, grouped by
// database, and an engine per ledger (b.ledgers' order) or the single
// ledger's one.
type fleetSetup struct {
	cfg     fleetConfig
	groups  []poolGroup
	engines []*reconcile.Engine
}

// poolGroup is the pools of one database: one shared by its ledgers, or
// one per ledger.
type poolGroup struct {
	name    string
	pools   []*pgxpool.Pool
	ledgers int
}

// hungLedger is a ledger in a database of its own reached through a
// hangProxy; each pass gets a fresh pool and engine (the old pool's
// connections are dead once the proxy let them go).
type hungLedger struct {
	name     string
	schema   string
	proxyURL string
	loader   *ledger.SchemaDB // direct, not through the proxy: loads its keys
	proxy    *hangProxy
	probe    probes.Probe
}

// connsOf is the connections of each of c's pools.
func (b *fleetBench) connsOf(c fleetConfig) int32 {
	if c.perLedger && c.conns == 0 {
		return int32(daemon.FleetLedgerConns(b.concurrency)) //nolint:gosec // G115: a handful of connections
	}
	return cmp.Or(c.conns, b.maxConns)
}

// poolsOf is how many pools c opens.
func (b *fleetBench) poolsOf(c fleetConfig, nLedgers, nDatabases int) int {
	switch {
	case c.single:
		return 1
	case c.perLedger:
		return nLedgers
	}
	return nDatabases
}

// engineURL is u with the pgx statement cache of --statement-cache.
func (b *fleetBench) engineURL(u string) string {
	if b.stmtCache == 0 {
		return u
	}
	parsed, err := neturl.Parse(u)
	if err != nil {
		return u
	}
	q := parsed.Query()
	q.Set("statement_cache_capacity", strconv.Itoa(b.stmtCache))
	parsed.RawQuery = q.Encode()
	return parsed.String()
}

// enginePool opens a pool of an engine of variant c to url, every
// connection open before it returns. Its connections are the daemon's
// (application_name ledgerkeeper, jit off: cmd/ledgerkeeper poolConfig),
// with c's plan_cache_mode and pgx query mode.
func (b *fleetBench) enginePool(ctx context.Context, url string, c fleetConfig) (*pgxpool.Pool, error) {
	pc, err := pgxpool.ParseConfig(b.engineURL(url))
	if err != nil {
		return nil, err
	}
	pc.MaxConns = b.connsOf(c)
	pc.MinConns = pc.MaxConns
	pc.ConnConfig.RuntimeParams["application_name"] = "ledgerkeeper"
	pc.ConnConfig.RuntimeParams["jit"] = "off"
	if c.generic {
		pc.ConnConfig.RuntimeParams["plan_cache_mode"] = "force_generic_plan"
	}
	if c.describe {
		pc.ConnConfig.DefaultQueryExecMode = pgx.QueryExecModeCacheDescribe
	}
	pool, err := pgxpool.NewWithConfig(ctx, pc)
	if err != nil {
		return nil, err
	}
	b.closers = append(b.closers, pool.Close)
	if err := fillPool(ctx, pool); err != nil {
		return nil, fmt.Errorf("variant %s: open its pool's connections: %w", c.name, err)
	}
	return pool, nil
}

func (b *fleetBench) close() {
	for i := len(b.closers) - 1; i >= 0; i-- {
		b.closers[i]()
	}
}

// setup creates the databases: the first fleet database migrated with
// one schema per ledger, the others (and the hung ledger's) copied from it
// as templates; the single ledger's migrated in the default schema. Then
// every variant's pools and engines.
func (b *fleetBench) setup(ctx context.Context, nLedgers, nDatabases int, withHung bool, cfgs []fleetConfig) error {
	counts := make([]int, nDatabases)
	for i := range nLedgers {
		counts[i*nDatabases/nLedgers]++
	}
	t0 := time.Now()
	tmpl := "lkbench_fleet_0"
	url, err := b.srv.createDB(ctx, tmpl, "")
	if err != nil {
		return err
	}
	pool, err := newPool(ctx, url, 8, "lkbench-fleet-setup")
	if err != nil {
		return err
	}
	// Each schema has its own migration lock: four at a time.
	g := newBigGroup(ctx, 4)
	for i := range slices.Max(counts) {
		g.Go(func(ctx context.Context) error {
			if _, err := migrations.Apply(ctx, pool, migrations.Options{Schema: fleetSchema(i)}); err != nil {
				return fmt.Errorf("migrate schema %s: %w", fleetSchema(i), err)
			}
			return nil
		})
	}
	err = g.Wait()
	pool.Close()
	if err != nil {
		return err
	}
	b.logf("migrated %d schemas in %s in %s", slices.Max(counts), tmpl, time.Since(t0).Round(time.Millisecond))
	// The other databases are copies of the first: no session may be in
	// it meanwhile, and a closed pool's backends exit on their own time.
	if err := b.srv.awaitNoSessions(ctx, tmpl); err != nil {
		return err
	}
	urls := []string{url}
	for d := 1; d < nDatabases; d++ {
		u, err := b.srv.createDB(ctx, fmt.Sprintf("lkbench_fleet_%d", d), tmpl)
		if err != nil {
			return err
		}
		urls = append(urls, u)
	}
	var hungURL string
	if withHung {
		if hungURL, err = b.srv.createDB(ctx, "lkbench_fleet_hung", tmpl); err != nil {
			return err
		}
	}
	for _, name := range append(dbNames(nDatabases, withHung), "lkbench_fleet_single") {
		if name == "lkbench_fleet_single" {
			if _, err := b.srv.createDB(ctx, name, ""); err != nil {
				return err
			}
		}
		// Planning apart from execution: a statement prepared on a
		// connection is planned afresh in its first executions.
		if err := b.srv.exec(ctx, "ALTER DATABASE "+pgx.Identifier{name}.Sanitize()+" SET pg_stat_statements.track_planning = on"); err != nil {
			return err
		}
	}
	for d, n := range counts {
		name := fmt.Sprintf("lkbench_fleet_%d", d)
		loader, err := newPool(ctx, urls[d], 4, "lkbench-fleet-loader")
		if err != nil {
			return err
		}
		b.closers = append(b.closers, loader.Close)
		b.dbs = append(b.dbs, &fleetDB{name: name, url: urls[d], loader: loader, ledgers: n})
		for i := range n {
			sdb, err := ledger.InSchema(loader, fleetSchema(i))
			if err != nil {
				return err
			}
			hp, closeProbe, err := b.ds.probe(b.concurrency)
			if err != nil {
				return err
			}
			b.closers = append(b.closers, closeProbe)
			b.ledgers = append(b.ledgers, &fleetLedger{name: name + "/" + fleetSchema(i), schema: fleetSchema(i), loader: sdb, probe: hp})
		}
	}
	if b.pg, err = newPGCPU(ctx, b.dbs[0].loader); err != nil {
		return err
	}

	b.singleURL = pgembed.WithDatabase(b.srv.adminURL, "lkbench_fleet_single")
	if b.single, err = newPool(ctx, b.singleURL, 4, "lkbench-fleet-loader"); err != nil {
		return err
	}
	b.closers = append(b.closers, b.single.Close)
	if _, err := migrations.Up(ctx, b.single, nil); err != nil {
		return err
	}
	if _, err := b.single.Exec(ctx, `CREATE EXTENSION IF NOT EXISTS pg_stat_statements`); err != nil {
		return err
	}
	hp, closeProbe, err := b.ds.probe(b.concurrency)
	if err != nil {
		return err
	}
	b.closers = append(b.closers, closeProbe)
	b.singleProbe = hp

	for _, c := range cfgs {
		t0 := time.Now()
		s, err := b.openSetup(ctx, c)
		if err != nil {
			return err
		}
		b.setups[c.name] = s
		n := 0
		for _, g := range s.groups {
			n += len(g.pools)
		}
		b.logf("%s: %d pools of %d connections open in %s", c.name, n, b.connsOf(c), time.Since(t0).Round(time.Millisecond))
	}

	if !withHung {
		return nil
	}
	loaderPool, err := newPool(ctx, hungURL, 2, "lkbench-fleet-loader")
	if err != nil {
		return err
	}
	b.closers = append(b.closers, loaderPool.Close)
	u, err := neturl.Parse(hungURL)
	if err != nil {
		return err
	}
	proxy, err := startHangProxy(u.Host)
	if err != nil {
		return err
	}
	b.closers = append(b.closers, proxy.close)
	u.Host = proxy.addr()
	h := &hungLedger{name: "lkbench_fleet_hung/" + fleetSchema(0), schema: fleetSchema(0), proxyURL: u.String(), proxy: proxy}
	if h.loader, err = ledger.InSchema(loaderPool, h.schema); err != nil {
		return err
	}
	hp, closeProbe, err = b.ds.probe(b.concurrency)
	if err != nil {
		return err
	}
	b.closers = append(b.closers, closeProbe)
	h.probe = hp
	b.hung = h
	return nil
}

// openSetup opens variant c's pools and builds its engines.
func (b *fleetBench) openSetup(ctx context.Context, c fleetConfig) (*fleetSetup, error) {
	s := &fleetSetup{cfg: c}
	if c.single {
		p, err := b.enginePool(ctx, b.singleURL, c)
		if err != nil {
			return nil, err
		}
		s.groups = []poolGroup{{name: "lkbench_fleet_single", pools: []*pgxpool.Pool{p}, ledgers: 1}}
		s.engines = []*reconcile.Engine{benchEngine("lkbench-single", b.concurrency, b.singleProbe, b.bracket, p, b.logs)}
		return s, nil
	}
	li := 0
	for _, d := range b.dbs {
		g := poolGroup{name: d.name, ledgers: d.ledgers}
		var shared *pgxpool.Pool
		if !c.perLedger {
			p, err := b.enginePool(ctx, d.url, c)
			if err != nil {
				return nil, err
			}
			shared, g.pools = p, append(g.pools, p)
		}
		for range d.ledgers {
			l := b.ledgers[li]
			li++
			pool := shared
			if c.perLedger {
				p, err := b.enginePool(ctx, d.url, c)
				if err != nil {
					return nil, err
				}
				pool, g.pools = p, append(g.pools, p)
			}
			sdb, err := ledger.InSchema(pool, l.schema)
			if err != nil {
				return nil, err
			}
			s.engines = append(s.engines, benchEngine("lkbench-"+l.name, b.concurrency, l.probe, b.bracket, sdb, b.logs))
		}
		s.groups = append(s.groups, g)
	}
	return s, nil
}

// awaitNoSessions waits (10 s at most) until no session is connected to
// database name.
func (s *server) awaitNoSessions(ctx context.Context, name string) error {
	conn, err := pgx.Connect(ctx, s.adminURL)
	if err != nil {
		return err
	}
	defer conn.Close(ctx)
	deadline := time.Now().Add(10 * time.Second)
	for {
		var n int
		if err := conn.QueryRow(ctx, `SELECT count(*) FROM pg_stat_activity WHERE datname = $1`, name).Scan(&n); err != nil {
			return err
		}
		if n == 0 {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("database %s still has %d sessions 10s after its pool closed", name, n)
		}
		if err := sleepCtx(ctx, 20*time.Millisecond); err != nil {
			return err
		}
	}
}

// dbNames are the fleet's databases, and the hung ledger's.
func dbNames(n int, withHung bool) []string {
	var out []string
	for d := range n {
		out = append(out, fmt.Sprintf("lkbench_fleet_%d", d))
	}
	if withHung {
		out = append(out, "lkbench_fleet_hung")
	}
	return out
}

func fleetSchema(i int) string { return fmt.Sprintf("ledger_%03d", i) }

// ledgerRun is one engine's pass.
type ledgerRun struct {
	rep  reconcile.Report
	err  error
	took time.Duration
}

// pass runs one pass of variant over freshly loaded stuck keys.
func (b *fleetBench) pass(ctx context.Context, variant string) (fleetPass, error) {
	if variant == variantHung {
		return b.passFleet(ctx, b.setups[variantFleet], true)
	}
	s := b.setups[variant]
	if s.cfg.single {
		return b.passSingle(ctx, s)
	}
	return b.passFleet(ctx, s, false)
}

func (b *fleetBench) passSingle(ctx context.Context, s *fleetSetup) (fleetPass, error) {
	variant := s.cfg.name
	if err := stuckKeys(ctx, b.loader(b.single, b.singleLoaded), b.keys); err != nil {
		return fleetPass{}, err
	}
	b.singleLoaded = true
	m, err := b.startMeasure(ctx, s.groups)
	if err != nil {
		return fleetPass{}, err
	}
	start := time.Now()
	rep, err := s.engines[0].Run(ctx, reconcile.Options{})
	el := time.Since(start)
	res := m.stop(ctx, variant, b.keys, el)
	if err != nil {
		return res, fmt.Errorf("%s: the single ledger's pass: %w", variant, err)
	}
	if err := checkPass(rep, b.keys, b.bracket); err != nil {
		return res, fmt.Errorf("%s: single ledger: %w", variant, err)
	}
	if err := checkDecided(ctx, b.single, b.keys); err != nil {
		return res, fmt.Errorf("%s: single ledger: %w", variant, err)
	}
	if err := m.checkDownstream(ctx, &res, b.keys, b.keys); err != nil {
		return res, err
	}
	res.LedgerSeconds = spreadOf([]float64{el.Seconds()})
	return res, nil
}

// passFleet runs every fleet ledger's pass at once on s's engines and,
// with hung, the hung ledger's beside them. The fleet's time is from the
// start to its last ledger's return: nothing waits for the hung ledger.
func (b *fleetBench) passFleet(ctx context.Context, s *fleetSetup, hung bool) (fleetPass, error) {
	variant := s.cfg.name
	if hung {
		variant = variantHung
	}
	if err := b.loadFleet(ctx, hung); err != nil {
		return fleetPass{}, err
	}
	analyses, err := b.analyses(ctx)
	if err != nil {
		return fleetPass{}, err
	}
	var hungPool *pgxpool.Pool
	var hungEngine *reconcile.Engine
	if hung {
		b.hung.proxy.arm(hangTrigger)
		var err error
		if hungPool, err = newPool(ctx, b.engineURL(b.hung.proxyURL), b.maxConns, "ledgerkeeper"); err != nil {
			return fleetPass{}, err
		}
		defer hungPool.Close()
		if err := fillPool(ctx, hungPool); err != nil {
			return fleetPass{}, fmt.Errorf("hung ledger's pool: %w", err)
		}
		sdb, err := ledger.InSchema(hungPool, b.hung.schema)
		if err != nil {
			return fleetPass{}, err
		}
		hungEngine = benchEngine("lkbench-"+b.hung.name, b.concurrency, b.hung.probe, b.bracket, sdb, b.logs)
	}
	groups := slices.Clone(s.groups)
	if hung {
		groups = append(groups, poolGroup{name: "lkbench_fleet_hung (hung)", pools: []*pgxpool.Pool{hungPool}, ledgers: 1})
	}
	m, err := b.startMeasure(ctx, groups)
	if err != nil {
		return fleetPass{}, err
	}
	start := time.Now()
	hungDone := make(chan ledgerRun, 1)
	if hung {
		go func() {
			hctx, cancel := context.WithTimeout(ctx, b.hangTimeout)
			defer cancel()
			rep, err := hungEngine.Run(hctx, reconcile.Options{})
			hungDone <- ledgerRun{rep: rep, err: err, took: time.Since(start)}
		}()
	}
	runs := make([]ledgerRun, len(b.ledgers))
	var wg sync.WaitGroup
	for i, e := range s.engines {
		wg.Go(func() {
			t0 := time.Now()
			rep, err := e.Run(ctx, reconcile.Options{})
			runs[i] = ledgerRun{rep: rep, err: err, took: time.Since(t0)}
		})
	}
	wg.Wait()
	el := time.Since(start)
	res := m.stop(ctx, variant, b.keys, el)
	res.Analyses = analyses
	probedMax := b.keys
	if hung {
		// Before anything that may fail: the hung pool closes only once
		// its pass has given its connections back.
		h, err := b.awaitHung(ctx, start, hungDone)
		res.Hung = h
		if err != nil {
			return res, err
		}
		probedMax += b.perLedger // the hung ledger's keys: each probed at most once
	}
	var took []float64
	for i, r := range runs {
		if r.err != nil {
			return res, fmt.Errorf("%s: ledger %s: %w", variant, b.ledgers[i].name, r.err)
		}
		if err := checkPass(r.rep, b.perLedger, b.bracket); err != nil {
			return res, fmt.Errorf("%s: ledger %s: %w", variant, b.ledgers[i].name, err)
		}
		took = append(took, r.took.Seconds())
	}
	res.LedgerSeconds = spreadOf(took)
	for _, l := range b.ledgers {
		if err := checkDecided(ctx, l.loader, b.perLedger); err != nil {
			return res, fmt.Errorf("%s: ledger %s: %w", variant, l.name, err)
		}
	}
	if err := m.checkDownstream(ctx, &res, b.keys, probedMax); err != nil {
		return res, err
	}
	return res, nil
}

// fillPool opens every connection of pool before the pass: a process's
// pool has its connections already, and their start-up (a backend forked
// for each) is no part of the pass.
// analyses sums the fleet's databases' analyse counts (pg_stat_user_tables:
// autovacuum's and ANALYZE's); the statistics collector reports them with
// a lag of up to a second or so.
func (b *fleetBench) analyses(ctx context.Context) (int64, error) {
	var total int64
	for _, d := range b.dbs {
		var n int64
		if err := d.loader.QueryRow(ctx, `SELECT coalesce(sum(autoanalyze_count + analyze_count), 0)::bigint FROM pg_stat_user_tables`).Scan(&n); err != nil {
			return 0, fmt.Errorf("%s: analyse counts: %w", d.name, err)
		}
		total += n
	}
	return total, nil
}

func fillPool(ctx context.Context, pool *pgxpool.Pool) error {
	var conns []*pgxpool.Conn
	defer func() {
		for _, c := range conns {
			c.Release()
		}
	}()
	for range pool.Config().MaxConns {
		c, err := pool.Acquire(ctx)
		if err != nil {
			return err
		}
		conns = append(conns, c)
	}
	return nil
}

// awaitHung waits for the hung ledger's pass: until its timeout and
// hangWait past it with its database hung, then with the database
// answering again (the proxy lets go of every connection it held).
func (b *fleetBench) awaitHung(ctx context.Context, start time.Time, done <-chan ledgerRun) (*hungResult, error) {
	h := &hungResult{TimeoutSec: b.hangTimeout.Seconds()}
	defer b.hung.proxy.heal()
	var r ledgerRun
	select {
	case r = <-done:
	case <-time.After(time.Until(start.Add(b.hangTimeout + b.hangWait))):
		h.LetThroughSec = round2(time.Since(start).Seconds())
		b.hung.proxy.heal()
		select {
		case r = <-done:
		case <-time.After(2 * time.Minute):
			return h, fmt.Errorf("hung ledger %s: its pass had not returned 2 minutes after its database answered again", b.hung.name)
		case <-ctx.Done():
			return h, ctx.Err()
		}
	case <-ctx.Done():
		return h, ctx.Err()
	}
	at, ok := b.hung.proxy.hungAt()
	if !ok {
		err := fmt.Errorf("hung ledger %s: its database never hung (no statement with %q went through the proxy; its pass decided %d keys)",
			b.hung.name, hangTrigger, r.rep.Decided)
		if r.err != nil {
			err = fmt.Errorf("%w; its pass failed: %w", err, r.err)
		}
		return h, err
	}
	h.HungAfterSec = round2(at.Sub(start).Seconds())
	h.ReturnedAfterSec = round2(r.took.Seconds())
	h.PastTimeoutSec = round2(max(0, r.took.Seconds()-b.hangTimeout.Seconds()))
	h.Decided, h.GivenBack = r.rep.Decided, r.rep.GivenBack
	if r.err != nil {
		h.Err = firstLines(r.err.Error(), 1)
	}
	return h, nil
}

// loadFleet loads every fleet ledger's stuck keys (and the hung
// ledger's), four ledgers at a time, then checkpoints once.
func (b *fleetBench) loadFleet(ctx context.Context, hung bool) error {
	g := newBigGroup(ctx, 4)
	for _, l := range b.ledgers {
		db := b.loader(l.loader, b.fleetLoaded)
		g.Go(func(ctx context.Context) error { return loadStuck(ctx, db, b.perLedger) })
	}
	if hung {
		g.Go(func(ctx context.Context) error { return loadStuck(ctx, b.hung.loader, b.perLedger) })
	}
	if err := g.Wait(); err != nil {
		return err
	}
	b.fleetLoaded = true
	_, err := b.dbs[0].loader.Exec(ctx, `CHECKPOINT`)
	return err
}

// The ways --reload replaces a pass's keys.
const (
	reloadTruncate = "truncate"
	reloadDelete   = "delete"
)

// loader is what loads a ledger's keys through db: db itself (loadStuck
// truncates, then vacuums and analyses), or with --reload delete once
// loaded (the ledger was loaded once already), db with the truncation
// made DELETEs and the VACUUM ANALYZE left out.
func (b *fleetBench) loader(db execer, loaded bool) execer {
	if b.reload != reloadDelete {
		return db
	}
	if !loaded {
		return db
	}
	return keepCaches{db: db}
}

// keepCaches runs loadStuck's statements without the two that invalidate
// every connection's cached plans and catalog entries of the ledger's
// tables: TRUNCATE (a new file for each table) becomes a DELETE of each,
// and VACUUM ANALYZE (new statistics) is skipped. Any other statement
// passes as it is.
type keepCaches struct{ db execer }

func (k keepCaches) Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error) {
	switch {
	case strings.HasPrefix(sql, "TRUNCATE "):
		for t := range strings.SplitSeq(strings.TrimPrefix(sql, "TRUNCATE "), ",") {
			t = strings.TrimSpace(t)
			if !slices.Contains(ledger.Tables, t) {
				return pgconn.CommandTag{}, fmt.Errorf("--reload delete: %q in %q is not a ledger table", t, sql)
			}
			if _, err := k.db.Exec(ctx, "DELETE FROM "+t); err != nil {
				return pgconn.CommandTag{}, err
			}
		}
		return pgconn.CommandTag{}, nil
	case strings.HasPrefix(sql, "VACUUM ANALYZE "):
		return pgconn.CommandTag{}, nil
	}
	return k.db.Exec(ctx, sql, args...)
}

// checkDecided reads the ledger: none of its n stuck keys left processing,
// half completed, half failed_retryable.
func checkDecided(ctx context.Context, db interface {
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
}, n int) error {
	var left, done, failed int
	if err := db.QueryRow(ctx, `SELECT count(*) FILTER (WHERE status = 'processing'),
		count(*) FILTER (WHERE status = 'completed' AND key LIKE 'rk-%'), count(*) FILTER (WHERE status = 'failed_retryable')
		FROM idempotency_keys`).Scan(&left, &done, &failed); err != nil {
		return err
	}
	if left != 0 || done != n/2 || failed != n-n/2 {
		return fmt.Errorf("after the pass the ledger has %d keys processing, %d completed, %d failed_retryable; want 0, %d, %d", left, done, failed, n/2, n-n/2)
	}
	return nil
}

// measure is what a pass is measured by: CPU, the downstream's lookups,
// and a sampler of the process's memory and the pools' connections.
type measure struct {
	ds               *downstreamProc
	pg               *pgCPU
	groups           []poolGroup
	hits0            downstreamHits
	dsCPU0, pg0, go0 time.Duration
	stats0           [][]*pgxpool.Stat
	stmts            *pgxpool.Pool // reads pg_stat_statements
	logf             func(string, ...any)
	stopSampling     chan struct{}
	sampled          chan samples
}

// samples is what the sampler saw, every 10 ms of a pass: of each pool
// group, the connections its pools had acquired together (peak, sum) and
// the most one of its pools had; of all pools, the most acquired and open
// at one sample.
type samples struct {
	n               int
	peakRSS, sumRSS int64
	peakHeap        uint64
	peakGoroutines  uint64
	peakAcq         []int32
	peakOnePool     []int32
	sumAcq          []int64
	peakAcqAll      int32
	peakOpenAll     int32
}

func (b *fleetBench) startMeasure(ctx context.Context, groups []poolGroup) (*measure, error) {
	m := &measure{ds: b.ds, pg: b.pg, groups: groups, stmts: b.single, logf: b.logf,
		stopSampling: make(chan struct{}), sampled: make(chan samples, 1)}
	if _, err := b.single.Exec(ctx, `SELECT pg_stat_statements_reset()`); err != nil {
		return nil, err
	}
	var err error
	if m.hits0, err = b.ds.hits(ctx); err != nil {
		return nil, err
	}
	if m.dsCPU0, err = b.ds.cpu(); err != nil {
		return nil, err
	}
	if m.pg0, err = b.pg.sample(); err != nil {
		return nil, err
	}
	for _, g := range groups {
		var st []*pgxpool.Stat
		for _, p := range g.pools {
			st = append(st, p.Stat())
		}
		m.stats0 = append(m.stats0, st)
	}
	m.go0 = selfCPU()
	go m.sample()
	return m, nil
}

// sample samples until stopSampling closes, then sends what it saw.
func (m *measure) sample() {
	s := samples{peakAcq: make([]int32, len(m.groups)), peakOnePool: make([]int32, len(m.groups)), sumAcq: make([]int64, len(m.groups))}
	rt := []metrics.Sample{{Name: "/memory/classes/heap/objects:bytes"}, {Name: "/sched/goroutines:goroutines"}}
	tick := time.NewTicker(10 * time.Millisecond)
	defer tick.Stop()
	for {
		rss := selfRSS()
		s.n++
		s.sumRSS += rss
		s.peakRSS = max(s.peakRSS, rss)
		metrics.Read(rt)
		if rt[0].Value.Kind() == metrics.KindUint64 {
			s.peakHeap = max(s.peakHeap, rt[0].Value.Uint64())
		}
		if rt[1].Value.Kind() == metrics.KindUint64 {
			s.peakGoroutines = max(s.peakGoroutines, rt[1].Value.Uint64())
		}
		var all, open int32
		for i, g := range m.groups {
			var a int32
			for _, p := range g.pools {
				st := p.Stat()
				pa := st.AcquiredConns()
				a += pa
				open += st.TotalConns()
				s.peakOnePool[i] = max(s.peakOnePool[i], pa)
			}
			s.peakAcq[i] = max(s.peakAcq[i], a)
			s.sumAcq[i] += int64(a)
			all += a
		}
		s.peakAcqAll, s.peakOpenAll = max(s.peakAcqAll, all), max(s.peakOpenAll, open)
		select {
		case <-m.stopSampling:
			m.sampled <- s
			return
		case <-tick.C:
		}
	}
}

// stop ends the measurement of a pass of keys that took el.
func (m *measure) stop(ctx context.Context, variant string, keys int, el time.Duration) fleetPass {
	goCPU := selfCPU() - m.go0
	pg1, _ := m.pg.sample()
	close(m.stopSampling)
	s := <-m.sampled
	r := fleetPass{Variant: variant, Keys: keys, Seconds: el.Seconds(), KeysPerSec: float64(keys) / el.Seconds(),
		GoCPU: goCPU, PGCPU: pg1 - m.pg0, PeakRSSKiB: s.peakRSS, PeakHeapBytes: s.peakHeap, PeakGoroutines: s.peakGoroutines,
		PeakAcquiredAll: s.peakAcqAll, PeakOpenAll: s.peakOpenAll, Load: loadAvg()}
	var err error
	if r.Statements, r.StatementTotals, err = fleetStatements(ctx, m.stmts, 10); err != nil {
		m.logf("%s: no statement statistics: %v", variant, err)
	}
	if s.n > 0 {
		r.MeanRSSKiB = s.sumRSS / int64(s.n)
	}
	for i, g := range m.groups {
		u := poolUse{Database: g.name, Ledgers: g.ledgers, Pools: len(g.pools), PeakAcquired: s.peakAcq[i], PeakOnePool: s.peakOnePool[i]}
		for j, p := range g.pools {
			st, st0 := p.Stat(), m.stats0[i][j]
			u.MaxConns += st.MaxConns()
			u.Acquires += st.AcquireCount() - st0.AcquireCount()
			u.EmptyAcquires += st.EmptyAcquireCount() - st0.EmptyAcquireCount()
			u.EmptyWaitMs += ms(st.EmptyAcquireWaitTime() - st0.EmptyAcquireWaitTime())
		}
		u.EmptyWaitMs = round2(u.EmptyWaitMs)
		if s.n > 0 {
			u.MeanAcquired = round2(float64(s.sumAcq[i]) / float64(s.n))
		}
		// Per ledger: of its own pool's, or of a shared pool's over the
		// ledgers sharing it.
		u.PeakPerLedger = round2(float64(u.PeakAcquired) / float64(u.Ledgers))
		if len(g.pools) == g.ledgers && g.ledgers > 1 {
			u.PeakPerLedger = float64(u.PeakOnePool)
		}
		u.MeanPerLedger = round2(u.MeanAcquired / float64(u.Ledgers))
		r.Pools = append(r.Pools, u)
	}
	return r
}

// checkDownstream reads the downstream's lookups and CPU since the start:
// every stuck key looked up once (the hung ledger's at most once each:
// between lo and hi lookups).
func (m *measure) checkDownstream(ctx context.Context, r *fleetPass, lo, hi int) error {
	dsCPU, err := m.ds.cpu()
	if err != nil {
		return err
	}
	r.DownstreamCPU = dsCPU - m.dsCPU0
	h, err := m.ds.hits(ctx)
	if err != nil {
		return err
	}
	seen := h.minus(m.hits0)
	if seen.Keys < int64(lo) || seen.Keys > int64(hi) {
		return fmt.Errorf("%s: the downstream saw %d lookups of stuck keys, want %d to %d", r.Variant, seen.Keys, lo, hi)
	}
	r.Lookups = seen.Keys
	return nil
}

// fleetStatements sums what pg_stat_statements recorded since its reset
// in the benchmark's databases, each statement's ledgers together (its
// schema taken out of its text): the n with the most execution time
// first, and the calls and execution time of all of them.
func fleetStatements(ctx context.Context, db *pgxpool.Pool, n int) (top []fleetStatement, all statementTotals, err error) {
	const byStatement = `SELECT left(regexp_replace(regexp_replace(query, '"ledger_[0-9]+"\.', '', 'g'), '\s+', ' ', 'g'), 70) AS q,
		sum(calls)::bigint AS calls, sum(total_exec_time) AS total, sum(plans)::bigint AS plans, sum(total_plan_time) AS plan
	FROM pg_stat_statements
	WHERE dbid IN (SELECT oid FROM pg_database WHERE datname LIKE 'lkbench\_fleet%') AND query NOT LIKE '%pg_stat_statements%'
	GROUP BY 1`
	if err := db.QueryRow(ctx, `SELECT coalesce(sum(calls), 0)::bigint, coalesce(sum(total), 0), coalesce(sum(plans), 0)::bigint, coalesce(sum(plan), 0),
			(SELECT count(*) FROM pg_stat_statements WHERE dbid IN (SELECT oid FROM pg_database WHERE datname LIKE 'lkbench\_fleet%')
			   AND query NOT LIKE '%pg_stat_statements%')
		FROM (`+byStatement+`) s`).Scan(&all.Calls, &all.ExecMs, &all.Plans, &all.PlanMs, &all.Texts); err != nil {
		return nil, all, err
	}
	all.ExecMs, all.PlanMs = round2(all.ExecMs), round2(all.PlanMs)
	rows, err := db.Query(ctx, `SELECT q, calls, total, plans, plan FROM (`+byStatement+`) s ORDER BY total + plan DESC LIMIT $1`, n)
	if err != nil {
		return nil, all, err
	}
	top, err = pgx.CollectRows(rows, func(row pgx.CollectableRow) (fleetStatement, error) {
		var s fleetStatement
		err := row.Scan(&s.Query, &s.Calls, &s.TotalMs, &s.Plans, &s.PlanMs)
		s.MeanMs = round3(s.TotalMs / float64(max(s.Calls, 1)))
		s.TotalMs, s.PlanMs = round2(s.TotalMs), round2(s.PlanMs)
		return s, err
	})
	return top, all, err
}

// fleetStatement is a statement of pg_stat_statements, every ledger's of
// its shape together: its executions and their time, and the plans made
// for them and theirs.
type fleetStatement struct {
	Query   string  `json:"query"`
	Calls   int64   `json:"calls"`
	TotalMs float64 `json:"total_ms"`
	MeanMs  float64 `json:"mean_ms"`
	Plans   int64   `json:"plans"`
	PlanMs  float64 `json:"plan_ms"`
}

// statementTotals sums pg_stat_statements over a pass: executions and
// their time, plans made and their time.
type statementTotals struct {
	// Texts counts the statements of distinct text (a ledger's own, in
	// its schema, apart from another's).
	Texts  int64   `json:"texts"`
	Calls  int64   `json:"calls"`
	ExecMs float64 `json:"exec_ms"`
	Plans  int64   `json:"plans"`
	PlanMs float64 `json:"plan_ms"`
}

// selfRSS is this process's VmRSS in KiB (0 if unreadable).
func selfRSS() int64 {
	st, err := procStatus(os.Getpid())
	if err != nil {
		return 0
	}
	return st["VmRSS"]
}

// idealRate is the keys/s of inFlight probes of latency each, at most
// capacity of them served at once (0: no bound).
func idealRate(inFlight, capacity int, latency time.Duration) float64 {
	if capacity > 0 {
		inFlight = min(inFlight, capacity)
	}
	return float64(inFlight) / latency.Seconds()
}

// fleetPass is one pass of a variant.
type fleetPass struct {
	Variant string `json:"variant"`
	Round   int    `json:"round"`
	Keys    int    `json:"keys"`
	// Seconds is from the start of the passes to the last ledger's
	// return (the hung ledger's not waited for); KeysPerSec is Keys over
	// it.
	Seconds    float64 `json:"seconds"`
	KeysPerSec float64 `json:"keys_per_sec"`
	// LedgerSeconds spreads the ledgers' own pass times.
	LedgerSeconds spread `json:"ledger_seconds"`
	// Lookups is how many lookups of stuck keys the downstream answered.
	Lookups       int64         `json:"downstream_lookups"`
	GoCPU         time.Duration `json:"go_cpu_ns"`
	PGCPU         time.Duration `json:"pg_cpu_ns"`
	DownstreamCPU time.Duration `json:"downstream_cpu_ns"`
	// Sampled every 10 ms during the pass: the process's VmRSS, its Go
	// heap objects and goroutines.
	PeakRSSKiB     int64  `json:"peak_rss_kib"`
	MeanRSSKiB     int64  `json:"mean_rss_kib"`
	PeakHeapBytes  uint64 `json:"peak_heap_object_bytes"`
	PeakGoroutines uint64 `json:"peak_goroutines"`
	// PeakAcquiredAll and PeakOpenAll: the most connections the
	// variant's pools had acquired, and open, together at one sample.
	PeakAcquiredAll int32 `json:"peak_acquired_all_pools"`
	PeakOpenAll     int32 `json:"peak_open_all_pools"`
	// Statements: pg_stat_statements over the pass, the ledgers'
	// statements of one text summed; StatementTotals: all statements.
	Statements      []fleetStatement `json:"statements"`
	StatementTotals statementTotals  `json:"statement_totals"`
	// Pools: each database's pool during the pass.
	Pools []poolUse   `json:"pools"`
	Hung  *hungResult `json:"hung,omitempty"`
	Load  string      `json:"load_after"`
	// Analyses is how many times the fleet's databases' tables had been
	// analysed (by autovacuum or ANALYZE) when the pass started, summed:
	// the difference between two passes of a variant is the analyses
	// that invalidated its connections' cached plans in between.
	Analyses int64 `json:"fleet_analyses_so_far"`
}

// poolUse is a database's pools' connections during a pass (pgxpool.Stat,
// sampled every 10 ms): its one pool shared by its ledgers, or its
// ledgers' own pools summed. Per ledger: a shared pool's over the ledgers
// sharing it, or the most one ledger's own pool had (peak).
type poolUse struct {
	Database     string `json:"database"`
	Ledgers      int    `json:"ledgers"`
	Pools        int    `json:"pools"`
	MaxConns     int32  `json:"max_conns"`
	PeakAcquired int32  `json:"peak_acquired"`
	// PeakOnePool: the most one of the pools had acquired.
	PeakOnePool   int32   `json:"peak_acquired_one_pool"`
	MeanAcquired  float64 `json:"mean_acquired"`
	PeakPerLedger float64 `json:"peak_acquired_per_ledger"`
	MeanPerLedger float64 `json:"mean_acquired_per_ledger"`
	Acquires      int64   `json:"acquires"`
	// EmptyAcquires waited for a connection, EmptyWaitMs in all.
	EmptyAcquires int64   `json:"empty_acquires"`
	EmptyWaitMs   float64 `json:"empty_acquire_wait_ms"`
}

// hungResult is the hung ledger's pass: seconds since the passes started.
type hungResult struct {
	TimeoutSec float64 `json:"timeout_s"`
	// HungAfterSec: when its database stopped answering.
	HungAfterSec float64 `json:"hung_after_s"`
	// ReturnedAfterSec: when its Run returned; PastTimeoutSec how long
	// after its context's deadline.
	ReturnedAfterSec float64 `json:"returned_after_s"`
	PastTimeoutSec   float64 `json:"past_timeout_s"`
	// LetThroughSec: when the benchmark stopped waiting and the database
	// answered again (0: the pass returned with it still hung).
	LetThroughSec float64 `json:"let_through_after_s,omitempty"`
	Decided       int     `json:"decided"`
	GivenBack     int     `json:"given_back"`
	Err           string  `json:"err,omitempty"`
}

func hungText(h *hungResult) string {
	if h == nil {
		return ""
	}
	s := fmt.Sprintf(" (hung ledger: hung at %.2fs, returned at %.2fs", h.HungAfterSec, h.ReturnedAfterSec)
	if h.LetThroughSec > 0 {
		s += fmt.Sprintf(" after its database answered again at %.2fs", h.LetThroughSec)
	}
	return s + ")"
}

type spread struct {
	Median float64 `json:"median"`
	Min    float64 `json:"min"`
	Max    float64 `json:"max"`
}

func spreadOf(v []float64) spread {
	if len(v) == 0 {
		return spread{}
	}
	s := slices.Sorted(slices.Values(v))
	return spread{Median: round3(median(v)), Min: round3(s[0]), Max: round3(s[len(s)-1])}
}

func round3(f float64) float64 { return float64(int64(f*1000+0.5)) / 1000 }

// fleetSummary sums up a variant's passes.
type fleetSummary struct {
	Variant    string      `json:"variant"`
	Passes     []fleetPass `json:"passes"`
	KeysPerSec spread      `json:"keys_per_sec"`
	Seconds    spread      `json:"seconds"`
	// LedgerSecondsMedian spreads the passes' median ledger pass times.
	LedgerSecondsMedian spread  `json:"ledger_seconds_median"`
	Ideal               float64 `json:"ideal_keys_per_sec"`
	OfIdeal             float64 `json:"of_ideal"`
	GoCPUPerKeyUs       float64 `json:"go_cpu_us_per_key"`
	PGCPUPerKeyUs       float64 `json:"pg_cpu_us_per_key"`
	DownstreamUs        float64 `json:"downstream_cpu_us_per_key"`
	PeakRSSKiB          int64   `json:"peak_rss_kib"`
	// StatementsPerKey and StatementMsPerKey: PostgreSQL's statements
	// (all ledgers') per key decided, and their execution time; PlansPerKey
	// and PlanMsPerKey: the plans made for them, and their time.
	StatementsPerKey  float64 `json:"statements_per_key"`
	StatementMsPerKey float64 `json:"statement_ms_per_key"`
	PlansPerKey       float64 `json:"plans_per_key"`
	PlanMsPerKey      float64 `json:"plan_ms_per_key"`
	// AnalysesBetween spreads the analyses of the fleet's tables between
	// two consecutive passes of a fleet variant (each one invalidates the
	// cached plans of the statements on its table).
	AnalysesBetween *spread `json:"analyses_between_passes,omitempty"`
	// PeakPerLedger is the most connections a pool of the fleet's had
	// acquired per ledger sharing it, over every pass (the hung ledger's
	// own pool apart); MeanPerLedger the mean of its passes' means.
	PeakPerLedger float64 `json:"peak_acquired_per_ledger"`
	MeanPerLedger float64 `json:"mean_acquired_per_ledger"`
	EmptyAcquires int64   `json:"empty_acquires"`
	// PeakAcquiredAll and PeakOpenAll: the most connections the
	// variant's pools had acquired, and open, together, over its passes.
	PeakAcquiredAll int32 `json:"peak_acquired_all_pools"`
	PeakOpenAll     int32 `json:"peak_open_all_pools"`
	// CPUPerKeyUs: the engines' and PostgreSQL's CPU per key, the
	// median of the passes'.
	CPUPerKeyUs spread `json:"cpu_us_per_key"`
	// PlansPerKeyPasses spreads the passes' plans per key.
	PlansPerKeyPasses spread `json:"plans_per_key_passes"`
}

func summariseFleet(variant string, runs []fleetPass, ideal float64) fleetSummary {
	s := fleetSummary{Variant: variant, Passes: runs, Ideal: ideal}
	var rates, secs, ledgerSecs, means, cpus, plans []float64
	var keys int
	var goCPU, pgCPU, dsCPU time.Duration
	var st statementTotals
	for _, r := range runs {
		t := r.StatementTotals
		st = statementTotals{Calls: st.Calls + t.Calls, ExecMs: st.ExecMs + t.ExecMs, Plans: st.Plans + t.Plans, PlanMs: st.PlanMs + t.PlanMs}
		rates, secs, ledgerSecs = append(rates, r.KeysPerSec), append(secs, r.Seconds), append(ledgerSecs, r.LedgerSeconds.Median)
		keys += r.Keys
		goCPU, pgCPU, dsCPU = goCPU+r.GoCPU, pgCPU+r.PGCPU, dsCPU+r.DownstreamCPU
		s.PeakRSSKiB = max(s.PeakRSSKiB, r.PeakRSSKiB)
		s.PeakAcquiredAll, s.PeakOpenAll = max(s.PeakAcquiredAll, r.PeakAcquiredAll), max(s.PeakOpenAll, r.PeakOpenAll)
		cpus = append(cpus, (r.GoCPU+r.PGCPU).Seconds()*1e6/float64(r.Keys))
		plans = append(plans, float64(t.Plans)/float64(r.Keys))
		for _, p := range r.Pools {
			if strings.HasSuffix(p.Database, "(hung)") {
				continue
			}
			s.PeakPerLedger = max(s.PeakPerLedger, p.PeakPerLedger)
			means = append(means, p.MeanPerLedger)
			s.EmptyAcquires += p.EmptyAcquires
		}
	}
	s.KeysPerSec, s.Seconds, s.LedgerSecondsMedian = spreadOf(rates), spreadOf(secs), spreadOf(ledgerSecs)
	s.CPUPerKeyUs, s.PlansPerKeyPasses = spreadOf(cpus), spreadOf(plans)
	s.KeysPerSec.Median, s.KeysPerSec.Min, s.KeysPerSec.Max = float64(int64(s.KeysPerSec.Median)), float64(int64(s.KeysPerSec.Min)), float64(int64(s.KeysPerSec.Max))
	s.OfIdeal = round2(s.KeysPerSec.Median / ideal)
	s.GoCPUPerKeyUs = float64(int64(goCPU.Seconds() * 1e6 / float64(keys)))
	s.PGCPUPerKeyUs = float64(int64(pgCPU.Seconds() * 1e6 / float64(keys)))
	s.DownstreamUs = float64(int64(dsCPU.Seconds() * 1e6 / float64(keys)))
	if len(means) > 0 {
		s.MeanPerLedger = round2(median(means))
	}
	k := float64(keys)
	s.StatementsPerKey, s.StatementMsPerKey = round2(float64(st.Calls)/k), round3(st.ExecMs/k)
	s.PlansPerKey, s.PlanMsPerKey = round2(float64(st.Plans)/k), round3(st.PlanMs/k)
	var between []float64
	for i := 1; i < len(runs); i++ {
		if runs[i].Analyses > 0 {
			between = append(between, float64(runs[i].Analyses-runs[i-1].Analyses))
		}
	}
	if len(between) > 0 {
		a := spreadOf(between)
		s.AnalysesBetween = &a
	}
	return s
}

// fleetRatio is a ratio of two variants: of their medians, and of the
// passes the same round ran of each.
type fleetRatio struct {
	Of         string    `json:"of"`
	Medians    float64   `json:"medians"`
	PairRatios []float64 `json:"round_ratios"`
	PairMedian float64   `json:"round_median"`
	PairMin    float64   `json:"round_min"`
	PairMax    float64   `json:"round_max"`
	Target     string    `json:"target"`
	Met        bool      `json:"met"`
}

func ratioOf(of string, num, den []fleetPass, val func(fleetPass) float64, target string, met func(float64) bool) fleetRatio {
	r := fleetRatio{Of: of, Target: target}
	var nv, dv []float64
	for i := range min(len(num), len(den)) {
		n, d := val(num[i]), val(den[i])
		nv, dv = append(nv, n), append(dv, d)
		if d > 0 {
			r.PairRatios = append(r.PairRatios, round2(n/d))
		}
	}
	if len(dv) > 0 && median(dv) > 0 {
		r.Medians = round2(median(nv) / median(dv))
	}
	if len(r.PairRatios) > 0 {
		s := slices.Sorted(slices.Values(r.PairRatios))
		r.PairMedian, r.PairMin, r.PairMax = median(s), s[0], s[len(s)-1]
	}
	r.Met = met(r.Medians)
	return r
}

type fleetReport struct {
	Ledgers            int     `json:"ledgers"`
	Databases          int     `json:"databases"`
	Keys               int     `json:"keys"`
	KeysPerLedger      int     `json:"keys_per_ledger"`
	Concurrency        int     `json:"concurrency"`
	DownstreamCapacity int     `json:"downstream_capacity"`
	Warmup             int     `json:"warmup_passes"`
	StatementCache     int     `json:"statement_cache_capacity"`
	MaxConns           int     `json:"max_conns_per_pool"`
	LatencyMs          float64 `json:"latency_ms"`
	Bracket            string  `json:"bracket"`
	// RSSBeforeKiB is the process's VmRSS after the warm-up passes.
	RSSBeforeKiB int64          `json:"rss_before_kib"`
	Variants     []fleetSummary `json:"variants"`
	// Ratios: every variant's keys/s over the first single variant's.
	Ratios                []fleetRatio `json:"ratios"`
	FleetOverSingle       *fleetRatio  `json:"fleet_over_single,omitempty"`
	HungOverWithout       *fleetRatio  `json:"hung_over_without,omitempty"`
	HungOverWithoutLedger *fleetRatio  `json:"hung_over_without_ledger,omitempty"`
	LoadBefore            string       `json:"load_before"`
	LoadAfter             string       `json:"load_after"`
}

func printFleet(w io.Writer, r fleetReport) {
	capText := "no bound"
	if r.DownstreamCapacity > 0 {
		capText = fmt.Sprintf("%d at once", r.DownstreamCapacity)
	}
	fmt.Fprintf(w, "fleet: %d ledgers (schemas over %d databases; pools of %d unless the variant says) of %d stuck keys, against one ledger of %d; "+
		"every engine at concurrency %d, bracket %s; downstream %.0f ms, %s; load before %s, after %s\n\n",
		r.Ledgers, r.Databases, r.MaxConns, r.KeysPerLedger, r.Keys, r.Concurrency, r.Bracket, r.LatencyMs, capText, r.LoadBefore, r.LoadAfter)
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "variant\tpasses\tkeys/s (median)\tkeys/s (range)\tideal\tof ideal\tpass s (median)\tledger pass s (median of medians)\tengine µs/key\tPostgreSQL µs/key\tCPU µs/key (median, range)\tstatements/key\texec ms/key\tplans/key\t(range)\tplan ms/key\tpeak RSS MiB\tconns open\tacquired peak (all pools)\tconns/ledger peak\tmean\tacquires that waited\t")
	for _, s := range r.Variants {
		fmt.Fprintf(tw, "%s\t%d\t%.0f\t%.0f–%.0f\t%.0f\t%.2f\t%.3f\t%.3f\t%.0f\t%.0f\t%.0f (%.0f–%.0f)\t%.2f\t%.3f\t%.2f\t%.2f–%.2f\t%.3f\t%.1f\t%d\t%d\t%.2f\t%.2f\t%d\t\n", s.Variant, len(s.Passes),
			s.KeysPerSec.Median, s.KeysPerSec.Min, s.KeysPerSec.Max, s.Ideal, s.OfIdeal, s.Seconds.Median, s.LedgerSecondsMedian.Median,
			s.GoCPUPerKeyUs, s.PGCPUPerKeyUs, s.CPUPerKeyUs.Median, s.CPUPerKeyUs.Min, s.CPUPerKeyUs.Max,
			s.StatementsPerKey, s.StatementMsPerKey, s.PlansPerKey, s.PlansPerKeyPasses.Min, s.PlansPerKeyPasses.Max, s.PlanMsPerKey,
			float64(s.PeakRSSKiB)/1024, s.PeakOpenAll, s.PeakAcquiredAll, s.PeakPerLedger, s.MeanPerLedger, s.EmptyAcquires)
	}
	tw.Flush()
	for _, s := range r.Variants {
		if a := s.AnalysesBetween; a != nil {
			fmt.Fprintf(w, "%s: the fleet's tables analysed between two of its passes: %.0f (%.0f–%.0f)\n", s.Variant, a.Median, a.Min, a.Max)
		}
	}
	fmt.Fprintf(w, "\nRSS after the warm-up passes: %.1f MiB\n", float64(r.RSSBeforeKiB)/1024)
	var ratios []*fleetRatio
	for i := range r.Ratios {
		ratios = append(ratios, &r.Ratios[i])
	}
	for _, x := range append(ratios, r.HungOverWithout, r.HungOverWithoutLedger) {
		if x == nil {
			continue
		}
		met := "met"
		if !x.Met {
			met = "NOT met"
		}
		fmt.Fprintf(w, "%s: %.2f (medians); per round %.2f, range %.2f–%.2f; target %s: %s\n", x.Of, x.Medians, x.PairMedian, x.PairMin, x.PairMax, x.Target, met)
	}
	for _, s := range r.Variants {
		if s.Variant != variantHung {
			continue
		}
		for _, p := range s.Passes {
			h := p.Hung
			fmt.Fprintf(w, "round %d: hung ledger's database hung %.2fs into the pass; its pass (timeout %.0fs) returned at %.2fs, %.2fs past its timeout",
				p.Round, h.HungAfterSec, h.TimeoutSec, h.ReturnedAfterSec, h.PastTimeoutSec)
			if h.LetThroughSec > 0 {
				fmt.Fprintf(w, ", after the database answered again at %.2fs", h.LetThroughSec)
			} else {
				fmt.Fprint(w, ", its database still hung")
			}
			fmt.Fprintf(w, "; %d decided, %d given back\n", h.Decided, h.GivenBack)
		}
	}
	for _, s := range r.Variants {
		if len(s.Passes) == 0 || len(s.Passes[0].Pools) == 1 && s.Passes[0].Pools[0].Ledgers == 1 {
			continue
		}
		last := s.Passes[len(s.Passes)-1]
		fmt.Fprintf(w, "\n%s, round %d: pools (connections acquired, sampled every 10 ms)\n", s.Variant, last.Round)
		tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
		fmt.Fprintln(tw, "database\tledgers\tpools\tmax conns\tpeak acquired\tmean\tpeak per ledger\tmean per ledger\tacquires\tthat waited\twaited ms\t")
		for _, p := range last.Pools {
			fmt.Fprintf(tw, "%s\t%d\t%d\t%d\t%d\t%.1f\t%.2f\t%.2f\t%d\t%d\t%.1f\t\n", p.Database, p.Ledgers, p.Pools, p.MaxConns, p.PeakAcquired, p.MeanAcquired,
				p.PeakPerLedger, p.MeanPerLedger, p.Acquires, p.EmptyAcquires, p.EmptyWaitMs)
		}
		tw.Flush()
	}
	for _, s := range r.Variants {
		if len(s.Passes) == 0 {
			continue
		}
		last := s.Passes[len(s.Passes)-1]
		fmt.Fprintf(w, "\n%s, round %d: PostgreSQL statements by execution and planning time (pg_stat_statements: %d texts, every ledger's of one shape together)\n",
			s.Variant, last.Round, last.StatementTotals.Texts)
		tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
		fmt.Fprintln(tw, "calls\tper key\ttotal ms\tmean ms\tplans\tplan ms\tstatement")
		for _, st := range last.Statements {
			fmt.Fprintf(tw, "%d\t%.3f\t%.0f\t%.3f\t%d\t%.0f\t%s\n", st.Calls, float64(st.Calls)/float64(last.Keys), st.TotalMs, st.MeanMs, st.Plans, st.PlanMs, st.Query)
		}
		tw.Flush()
	}
}

// hangProxy forwards TCP connections to a PostgreSQL server until a
// client sends a message containing its armed trigger. From then on it
// forwards nothing more, in either direction, on any connection, and
// accepts new ones without forwarding them either; it closes none: a
// server that stopped answering, or a network that drops packets without
// a reset. heal closes every connection it held and forwards again.
// (ledgertest.CutProxy cuts a connection rather than hanging it, and links
// package testing, which a program must not.)
type hangProxy struct {
	ln      net.Listener
	backend string
	wg      sync.WaitGroup

	mu      sync.Mutex
	trigger []byte
	hung    bool
	at      time.Time
	healed  chan struct{} // closed by heal: the held connections' goroutines return
	conns   map[net.Conn]struct{}
	closed  bool
}

func startHangProxy(backend string) (*hangProxy, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	p := &hangProxy{ln: ln, backend: backend, healed: make(chan struct{}), conns: map[net.Conn]struct{}{}}
	p.wg.Go(p.accept)
	return p, nil
}

func (p *hangProxy) addr() string { return p.ln.Addr().String() }

// arm makes the next message containing trigger hang the proxy.
func (p *hangProxy) arm(trigger string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.trigger = []byte(trigger)
	p.at = time.Time{}
}

// hungAt is when the armed trigger last hung the proxy.
func (p *hangProxy) hungAt() (time.Time, bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.at, !p.at.IsZero()
}

// heal closes every connection and forwards new ones again.
func (p *hangProxy) heal() {
	p.mu.Lock()
	defer p.mu.Unlock()
	if !p.hung {
		return
	}
	for c := range p.conns {
		_ = c.Close()
	}
	clear(p.conns)
	p.hung = false
	close(p.healed)
	p.healed = make(chan struct{})
}

func (p *hangProxy) close() {
	_ = p.ln.Close()
	p.mu.Lock()
	p.closed = true
	for c := range p.conns {
		_ = c.Close()
	}
	if p.hung {
		close(p.healed)
		p.hung = false
	}
	p.mu.Unlock()
	p.wg.Wait()
}

// track registers c, or closes it if the proxy is closed; held is the
// channel a connection hung now waits on.
func (p *hangProxy) track(c net.Conn) (hung bool, healed <-chan struct{}) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed {
		_ = c.Close()
		return false, nil
	}
	p.conns[c] = struct{}{}
	return p.hung, p.healed
}

func (p *hangProxy) untrack(cs ...net.Conn) {
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, c := range cs {
		delete(p.conns, c)
		_ = c.Close()
	}
}

func (p *hangProxy) accept() {
	for {
		c, err := p.ln.Accept()
		if err != nil {
			return
		}
		hung, healed := p.track(c)
		if healed == nil {
			return
		}
		if hung {
			continue // held, unanswered, until heal closes it
		}
		var d net.Dialer
		s, err := d.DialContext(context.Background(), "tcp", p.backend)
		if err != nil {
			p.untrack(c)
			continue
		}
		if _, healed := p.track(s); healed == nil {
			p.untrack(c)
			return
		}
		p.wg.Go(func() { p.forward(s, c, true); p.untrack(c, s) })
		p.wg.Go(func() { p.forward(c, s, false); p.untrack(c, s) })
	}
}

// forward copies src to dst until either fails or the proxy hangs; a
// chunk read while hung is held (never written) until heal. inspect: src
// is the client, whose messages may carry the trigger.
func (p *hangProxy) forward(dst, src net.Conn, inspect bool) {
	buf := make([]byte, 64<<10)
	for {
		n, err := src.Read(buf)
		if err != nil {
			return
		}
		p.mu.Lock()
		if inspect && p.trigger != nil && bytes.Contains(buf[:n], p.trigger) {
			p.trigger, p.hung, p.at = nil, true, time.Now()
		}
		hung, healed := p.hung, p.healed
		p.mu.Unlock()
		if hung {
			<-healed
			return
		}
		if _, err := dst.Write(buf[:n]); err != nil {
			return
		}
	}
}
