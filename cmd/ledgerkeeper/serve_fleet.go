package main

import (
	"context"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"strings"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"

	"github.com/ledgerkeeper/ledgerkeeper/internal/daemon"
)

// fleetDatabase is one database of a serve process that keeps several
// ledgers: one pool, followed across failovers, shared by the ledgers whose
// schemas it holds.
type fleetDatabase struct {
	label  string // host:port/dbname, never a credential
	raw    *pgxpool.Pool
	health *daemon.DatabaseHealth
	err    error // why it could not be opened at start
}

// serveFleet is serve over every ledger of the ledgers section. Each ledger
// runs its own jobs (reconcile, purge, alerts, observe) on its own schema,
// with its own breakers, self-checks, purge lock and rate limits; a ledger
// whose database is unreachable at start, or whose schema is behind, is not
// started and /readyz says why, and the others run. The process is ready
// while any ledger is.
func (a *app) serveFleet(ctx context.Context, migrate, runAtStart bool) error {
	replica := daemon.ReplicaID()
	logger := a.logger.With("replica", replica)
	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	daemon.RegisterBuildInfo(reg)

	dbs := map[string]*fleetDatabase{}
	defer func() {
		for _, db := range dbs {
			if db.raw != nil {
				db.raw.Close()
			}
		}
	}()
	var services []daemon.Service
	var jobs []daemon.Job
	var targets []daemon.LedgerTarget
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
			raw, follower, err := connectFollowing(ctx, url, l.Database.MaxConns, db.health.FollowOptions())
			if err != nil {
				db.err = err
				logger.Error("database unreachable at start: its ledgers are not started", "database", db.label, "err", a.redactor().String(rootCause(err)))
			} else {
				db.raw = raw
				db.health.Watch(raw, follower)
				services = append(services, db.health)
				quiet = append(quiet, db.health.Quiet)
			}
		}
		llog := logger.With("ledger", l.Name)
		if db.err != nil {
			err := fmt.Errorf("not started: database %s unreachable at start: %s", db.label, rootCause(db.err))
			ready[l.Name] = func(context.Context) error { return err }
			continue
		}
		pool := inLedger(db.raw, l.Database.Schema)
		if migrate {
			if err := migrateAtStart(ctx, pool, llog, a.logger.With("ledger", l.Name)); err != nil {
				llog.Error("migrations failed: the ledger is not started", "err", err)
				err := fmt.Errorf("not started: migrations failed: %w", err)
				ready[l.Name] = func(context.Context) error { return err }
				continue
			}
		}
		if err := checkSchema(ctx, db.raw, pool.schema); err != nil {
			llog.Error("the ledger is not started", "err", err)
			err := fmt.Errorf("not started: %w (or start serve with --migrate)", err)
			ready[l.Name] = func(context.Context) error { return err }
			continue
		}
		lp, err := a.buildLedger(ctx, l, pool, reg, replica, logger)
		if err != nil {
			return fmt.Errorf("ledger %s: %w", l.Name, err)
		}
		defer lp.closer.Close()
		jobs = append(jobs, lp.jobs...)
		targets = append(targets, daemon.LedgerTarget{Name: l.Name, Config: l.Config, Pool: pool, Windows: lp.eng.Windows})
		health, raw, schema := db.health, db.raw, pool.schema
		ready[l.Name] = func(ctx context.Context) error { return ledgerReady(ctx, health, raw, schema) }
		llog.Info("ledger started", "database", db.label, "schema", schemaShown(pool.schema), "tools", len(l.ToolNames()))
	}
	if len(targets) == 0 {
		return fmt.Errorf("no ledger could be started (%d configured): see the errors above", len(ready))
	}
	routes, fleetServices, err := a.fleetFrontEnds(targets, logger)
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
	if err != nil {
		return &configError{err}
	}
	if err := d.Start(ctx); err != nil {
		return err
	}
	<-ctx.Done()
	logger.Info("stopping")
	d.Stop()
	return nil
}

// fleetFrontEnds are the process-wide parts over every started ledger: the
// console's routes and Slack's actions.
func (a *app) fleetFrontEnds(targets []daemon.LedgerTarget, logger *slog.Logger) (map[string]http.Handler, []daemon.Service, error) {
	return nil, nil, nil
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

func schemaShown(s string) string {
	return strings.TrimSpace(map[bool]string{true: "(search_path)", false: s}[s == ""])
}
