package main

import (
	"context"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"

	"github.com/ledgerkeeper/ledgerkeeper/internal/daemon"
	"github.com/ledgerkeeper/ledgerkeeper/ledger"
)

// fleetDatabase is one database of a serve process that keeps several
// ledgers. Its ledgers each have a pool of their own, and it has a small
// one for its writability checks, schema checks and migrations; all of them
// follow the primary together, with one Follower.
type fleetDatabase struct {
	label    string // host:port/dbname, never a credential
	raw      *pgxpool.Pool
	follower *ledger.Follower
	health   *daemon.DatabaseHealth
}

// fleetAdminConns is the size of a fleet database's own pool: a
// writability check every second, and at start (or until they are
// current) its ledgers' schema checks and migrations, one at a time.
const fleetAdminConns = 2

// serveFleet is serve over every ledger of the ledgers section. Each ledger
// runs its own jobs (reconcile, purge, alerts, observe) on its own schema,
// with its own breakers, self-checks, purge lock and rate limits. A ledger
// whose database is unreachable, or whose schema is behind, waits: its jobs
// do nothing but check again (each run fails, counted and logged) until the
// schema is there and current, and /readyz says why; the others run. The
// process is ready while any ledger is.
func (a *app) serveFleet(ctx context.Context, migrate, runAtStart bool) error {
	replica := daemon.ReplicaID()
	logger := a.logger.With("replica", replica)
	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	daemon.RegisterBuildInfo(reg)

	dbs := map[string]*fleetDatabase{}
	var ledgerPools []*pgxpool.Pool
	defer func() {
		for _, p := range ledgerPools {
			p.Close()
		}
		for _, db := range dbs {
			if db.raw != nil {
				db.raw.Close()
			}
		}
	}()
	var services []daemon.Service
	var jobs []daemon.Job
	var targets []daemon.LedgerTarget
	parts := map[string]*ledgerParts{}
	ready := map[string]func(context.Context) error{}
	quiet := []func(error) bool{}
	for _, l := range a.targets() {
		url := l.Database.URL.Reveal()
		if url == "" {
			return &configError{fmt.Errorf("ledger %s: no database: set ledgers.%s.database_url (or database.url at the top level, $%s, or --database-url)", l.Name, l.Name, envDatabaseURL)}
		}
		db := dbs[url]
		if db == nil {
			db = &fleetDatabase{label: databaseLabel(url)}
			dbs[url] = db
			dbReg := prometheus.WrapRegistererWith(prometheus.Labels{"database": db.label}, reg)
			db.health = daemon.NewDatabaseHealth(dbReg, logger.With("component", "database", "database", db.label))
			raw, follower, err := openFollowing(ctx, url, fleetAdminConns, db.health.FollowOptions())
			if err != nil {
				return err // the URL does not parse: a configuration error
			}
			db.raw, db.follower = raw, follower
			db.health.Watch(raw, follower)
			services = append(services, db.health)
			quiet = append(quiet, db.health.Quiet)
			if err := reach(ctx, raw); err != nil {
				// Its ledgers start anyway: their jobs fail (counted,
				// logged) and /readyz says so until it answers.
				logger.Error("database unreachable at start: its ledgers wait for it", "database", db.label, "err", a.redactor().String(rootCause(err)))
			}
		}
		llog := logger.With("ledger", l.Name)
		// A pool of its own (ledgers.NAME.max_conns): its statements,
		// qualified with its schema, are texts of its own, prepared and
		// planned on each connection they run on; on a few connections
		// of its own they are planned once and reused, on a pool shared
		// with the database's other ledgers they were planned again and
		// again (BENCHMARKS.md, "Many ledgers in one process"). A ledger
		// whose statements hang holds only its own connections.
		lraw, err := openLedgerPool(ctx, url, l.Name, l.Database.MaxConns, db.follower)
		if err != nil {
			return err
		}
		ledgerPools = append(ledgerPools, lraw)
		pool := inLedger(lraw, l.Database.Schema)
		gate := &schemaGate{raw: db.raw, schema: pool.schema, migrate: migrate, logger: llog, migrateLogger: a.logger.With("ledger", l.Name)}
		sctx, cancel := context.WithTimeout(ctx, 30*time.Second)
		if err := gate.open(sctx); err != nil {
			llog.Error("the ledger waits for its schema; the others run", "err", a.redactor().String(err.Error()))
		}
		cancel()
		lp, err := a.buildLedger(ctx, l, pool, reg, replica, logger)
		if err != nil {
			return fmt.Errorf("ledger %s: %w", l.Name, err)
		}
		defer lp.closer.Close()
		for _, j := range lp.jobs {
			jobs = append(jobs, gate.wrap(j))
		}
		parts[l.Name] = lp
		targets = append(targets, daemon.LedgerTarget{Name: l.Name, Config: l.Config, Pool: pool, Windows: lp.eng.Windows})
		health, raw, schema := db.health, db.raw, pool.schema
		ready[l.Name] = func(ctx context.Context) error { return ledgerReady(ctx, health, raw, schema) }
		llog.Info("ledger started", "database", db.label, "schema", schemaShown(pool.schema), "tools", len(l.ToolNames()),
			"max_conns", l.Database.MaxConns, "schema_current", gate.ok.Load())
	}
	routes, fleetServices, err := a.fleetFrontEnds(targets, parts, logger)
	if err != nil {
		return err
	}
	d, err := daemon.New(daemon.Config{
		Listen:       a.all.HTTP.Listen,
		Registry:     reg,
		Logger:       logger,
		RunAtStart:   runAtStart,
		Routes:       routes,
		Services:     append(services, fleetServices...),
		LedgersReady: ready,
		QuietError: func(err error) bool {
			for _, q := range quiet {
				if q(err) {
					return true
				}
			}
			return false
		},
		Jobs: jobs,
	})
	return runDaemon(ctx, d, err, logger)
}

// fleetFrontEnds are the process-wide parts over every started ledger: the
// console's routes and Slack's actions.
func (a *app) fleetFrontEnds(targets []daemon.LedgerTarget, parts map[string]*ledgerParts, logger *slog.Logger) (map[string]http.Handler, []daemon.Service, error) {
	// Slack actions (alerts.slack.interactive): one handler over every
	// ledger, each action on the ledger its control names.
	inter, err := daemon.BuildFleetInteractivity(a.all, targets, logger.With("component", "interact"))
	if err != nil {
		return nil, nil, &configError{err}
	}
	if inter != nil {
		logger.Info("slack actions on", inter.LogAttrs(a.all)...)
	}
	// The console: /ui/ lists the ledgers, /ui/ledgers/NAME/ is each one's.
	clog := logger.With("component", "console")
	byName := map[string]daemon.LedgerTarget{}
	for _, t := range targets {
		byName[t.Name] = t
	}
	routes, err := daemon.FleetConsoleRoutes(a.all, targets, clog, inter.Routes(), func(name string) []daemon.ConsoleOption {
		t, lp := byName[name], parts[name]
		return []daemon.ConsoleOption{
			daemon.WithProbePauses(lp.eng.ProbePauses),
			daemon.WithRun(daemon.ConsoleRun(t.Config, t.Pool, a.registry(), lp.eng, clog.With("ledger", name))),
		}
	})
	if err != nil {
		return nil, nil, &configError{err}
	}
	return routes, inter.Services(), nil
}

// databaseLabel names a database in metrics and logs: host:port/dbname,
// never a user or password.
func databaseLabel(url string) string {
	pc, err := pgconn.ParseConfig(url)
	if err != nil {
		return "unparsable"
	}
	return net.JoinHostPort(pc.Host, fmt.Sprint(pc.Port)) + "/" + pc.Database
}

// schemaShown names a ledger's schema in logs and status: "(search_path)"
// for none.
func schemaShown(s string) string {
	if s == "" {
		return "(search_path)"
	}
	return s
}

// schemaGate holds a ledger's jobs until its schema is there and current:
// checked (and, with --migrate, migrated) at start and, until then, before
// each run; once current it stays open (a schema does not go back).
type schemaGate struct {
	raw           *pgxpool.Pool
	schema        string
	migrate       bool
	logger        *slog.Logger
	migrateLogger *slog.Logger
	mu            sync.Mutex
	ok            atomic.Bool
}

// open checks (and migrates) now, and reports why the ledger waits.
func (g *schemaGate) open(ctx context.Context) error {
	if g.ok.Load() {
		return nil
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.ok.Load() {
		return nil
	}
	if g.migrate {
		pool := inLedger(g.raw, g.schema)
		if err := migrateAtStart(ctx, pool, g.logger, g.migrateLogger); err != nil {
			return fmt.Errorf("ledger waits: migrations failed: %w", err)
		}
	}
	if err := checkSchema(ctx, g.raw, g.schema); err != nil {
		return fmt.Errorf("ledger waits: %w (or start serve with --migrate)", err)
	}
	g.ok.Store(true)
	g.logger.Info("ledger schema current: its jobs run")
	return nil
}

// wrap is j held by the gate.
func (g *schemaGate) wrap(j daemon.Job) daemon.Job {
	run := j.Run
	j.Run = func(ctx context.Context) error {
		if err := g.open(ctx); err != nil {
			return err
		}
		return run(ctx)
	}
	return j
}
