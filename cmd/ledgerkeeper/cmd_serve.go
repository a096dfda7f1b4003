package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net"
	"strings"
	"sync"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/spf13/cobra"

	"github.com/ledgerkeeper/ledgerkeeper/alerts"
	"github.com/ledgerkeeper/ledgerkeeper/expiry"
	"github.com/ledgerkeeper/ledgerkeeper/internal/config"
	"github.com/ledgerkeeper/ledgerkeeper/internal/daemon"
	"github.com/ledgerkeeper/ledgerkeeper/internal/engine"
	"github.com/ledgerkeeper/ledgerkeeper/migrations"
	"github.com/ledgerkeeper/ledgerkeeper/reconcile"
	"github.com/ledgerkeeper/ledgerkeeper/store"
)

func newServeCmd(a *app) *cobra.Command {
	var migrate, runAtStart bool
	var listen string
	cmd := &cobra.Command{
		Use:   "serve",
		Short: "Run the daemon: scheduled reconcile, purge and alert delivery; /metrics, /healthz, /readyz, the /ui/ console",
		Long: `Run the daemon. On the schedules in the configuration (robfig/cron specs) it
runs reconcile passes (schedule.reconcile), purge passes (schedule.purge) and
alert delivery (schedule.alerts), and it serves /metrics (Prometheus),
/healthz (alive) and /readyz (ledger database writable, schema current) on
http.listen, with the web console at /ui/ (http.console.enabled, default
true; who may sign in and act: the console section). With
alerts.slack.interactive on-call acts from the alert
messages: over Socket Mode (alerts.slack.app_token) and/or POST
/slack/interactions on the same listener (alerts.slack.signing_secret).
Any number of replicas may run at once. SIGTERM or SIGINT stops
it gracefully: no new runs; a running reconcile pass leases no more keys and
its probes in flight get up to 30s to finish, their decisions written, the
pass recorded as stopped (a probe still running then is given back, not
counted as an attempt); purge and alert delivery stop at once.`,
		Args: args(cobra.NoArgs),
		RunE: func(cmd *cobra.Command, _ []string) error {
			// A listen address that cannot work is a usage (or
			// configuration) error, found before anything connects.
			if listen != "" {
				if err := checkListen(listen); err != nil {
					return usagef("--listen: %v", err)
				}
			}
			a.manyLedgers = true
			if err := a.load(); err != nil {
				return err
			}
			if listen == "" {
				if err := checkListen(a.cfg.HTTP.Listen); err != nil {
					return &configError{a.cfg.ErrorAt("http.listen", "%v", err)}
				}
			}
			ctx := cmd.Context()
			if listen != "" {
				a.cfg.HTTP.Listen = listen
				a.all.HTTP.Listen = listen
			}
			if a.all.Fleet() {
				return a.serveFleet(ctx, migrate, runAtStart)
			}
			replica := daemon.ReplicaID()
			logger := a.logger.With("replica", replica)
			reg := prometheus.NewRegistry()
			// The pool follows the writable primary across failovers;
			// health logs each failover once, keeps the database series
			// and answers /readyz's "can the ledger be written now?".
			health := daemon.NewDatabaseHealth(reg, logger.With("component", "database"))
			raw, follower, err := a.followingPool(ctx, health.FollowOptions())
			if err != nil {
				return err
			}
			defer raw.Close()
			health.Watch(raw, follower)
			pool := inLedger(raw, a.cfg.Database.Schema)
			if migrate {
				if err := migrateAtStart(ctx, pool, logger, a.logger); err != nil {
					return err
				}
			}
			if err := checkSchema(ctx, raw, pool.schema); err != nil {
				return fmt.Errorf("%w (or start serve with --migrate)", err)
			}

			reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
			daemon.RegisterBuildInfo(reg) // ledgerkeeper_build_info: which release runs (ledgerkeeper version)
			lp, err := a.buildLedger(ctx, config.Ledger{Config: a.cfg}, pool, reg, replica, logger)
			if err != nil {
				return err
			}
			defer lp.closer.Close()
			// Slack actions (alerts.slack.interactive): nil when off.
			inter, err := daemon.BuildInteractivity(a.cfg, pool, lp.eng.Windows, logger.With("component", "interact"))
			if err != nil {
				return &configError{err}
			}
			if inter != nil {
				logger.Info("slack actions on", inter.LogAttrs(a.cfg)...)
			}
			// The web console at /ui/ (http.console.enabled).
			routes, err := daemon.ConsoleRoutes(a.cfg, pool, lp.eng.Windows, logger.With("component", "console"), inter.Routes(),
				daemon.WithProbePauses(lp.eng.ProbePauses),
				daemon.WithRun(daemon.ConsoleRun(a.cfg, pool, a.registry(), lp.eng, logger.With("component", "console"))))
			if err != nil {
				return &configError{err}
			}
			d, err := daemon.New(daemon.Config{
				Listen:     a.cfg.HTTP.Listen,
				Registry:   reg,
				Logger:     logger,
				RunAtStart: runAtStart,
				Routes:     routes,
				Services:   append([]daemon.Service{health}, inter.Services()...),
				QuietError: health.Quiet,
				Ready: func(ctx context.Context) error {
					return ledgerReady(ctx, health, raw, pool.schema)
				},
				Jobs: lp.jobs,
			})
			return runDaemon(ctx, d, err, logger)
		},
	}
	cmd.Flags().BoolVar(&migrate, "migrate", false, "apply pending schema migrations before starting")
	cmd.Flags().BoolVar(&runAtStart, "run-at-start", true, "run every job once at start-up, then on schedule")
	cmd.Flags().StringVar(&listen, "listen", "", "HTTP listen address (overrides http.listen)")
	return cmd
}

// runDaemon starts d (built by daemon.New with err) and runs it until ctx
// is done, then stops it gracefully.
func runDaemon(ctx context.Context, d *daemon.Daemon, err error, logger *slog.Logger) error {
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

// migrateAtStart is serve --migrate for one ledger.
func migrateAtStart(ctx context.Context, pool *ledgerDB, logger, migrateLogger *slog.Logger) error {
	r, err := migrations.Apply(ctx, pool.raw, migrations.Options{Logger: migrateLogger, Schema: pool.schema})
	if err != nil {
		return err
	}
	for _, m := range r.Applied {
		logger.Info("migration applied", "version", m.Version, "name", m.Name)
	}
	if len(r.Applied) == 0 {
		logger.Info("schema up to date: no migration to apply")
	}
	return nil
}

// ledgerReady is a ledger's /readyz check: its database takes writes (not
// merely answers: a standby or a node turned read-only answers SELECT 1)
// and its schema is current.
func ledgerReady(ctx context.Context, health *daemon.DatabaseHealth, raw *pgxpool.Pool, schema string) error {
	if err := health.Ready(ctx); err != nil {
		if refusedByServer(err) {
			// After a password rotation: the reason, not the TLS attempt.
			return fmt.Errorf("database refused the connection: %s", rootCause(err))
		}
		return fmt.Errorf("database unreachable or not writable: %s", rootCause(err))
	}
	if err := checkSchema(ctx, raw, schema); err != nil {
		return err
	}
	if !engine.Citus() {
		return nil
	}
	// A Citus coordinator that takes writes may still have a worker down:
	// the keys of its shards can be neither claimed nor decided.
	faults, err := store.UnreachableShards(ctx, raw)
	if err != nil {
		// The coordinator takes writes; only the workers' check failed
		// (a managed service's role may not run commands on the workers).
		return &daemon.Degraded{Reason: "cannot ask the Citus workers: " + rootCause(err)}
	}
	if len(faults) > 0 {
		e := &store.ShardsUnreachableError{Op: "shards that cannot be read or written", Faults: faults}
		return &daemon.Degraded{Reason: e.Error()}
	}
	return nil
}

// ledgerParts are one ledger's services in serve.
type ledgerParts struct {
	eng    *reconcile.Engine
	closer io.Closer
	jobs   []daemon.Job
}

// buildLedger builds l's engine, purger, alert dispatcher and gauges, and
// their jobs. l.Name is "" for the one ledger of a configuration without a
// ledgers section: its series and jobs carry no ledger label, as always.
// Otherwise every series of the ledger carries ledger="NAME" and its log
// lines the ledger's name.
func (a *app) buildLedger(ctx context.Context, l config.Ledger, pool *ledgerDB, reg *prometheus.Registry, replica string, logger *slog.Logger) (*ledgerParts, error) {
	var lreg prometheus.Registerer = reg
	if l.Name != "" {
		lreg = prometheus.WrapRegistererWith(prometheus.Labels{"ledger": l.Name}, reg)
		logger = logger.With("ledger", l.Name)
	}
	cfg := l.Config
	eng, closer, err := daemon.BuildEngine(ctx, cfg, pool, a.registry(), replica, logger.With("component", "reconcile"), reconcile.NewMetrics(lreg))
	if err != nil {
		return nil, &configError{err}
	}
	purger := expiry.New(daemon.PurgeConfig(cfg, replica), pool, logger.With("component", "purge"), expiry.NewMetrics(lreg))
	dispatcher, err := newDispatcherFor(cfg, l.Name, pool, alerts.NewMetrics(lreg), logger)
	if err != nil {
		closer.Close()
		return nil, err
	}
	ledgerGauges := daemon.NewLedgerMetrics(lreg)
	ledgerGauges.SetSampleLogger(logger.With("component", "observe"))
	idleRuns := &idleRecorder{every: idleAlertsRunEvery}
	reconcileJob := daemon.ReconcileJob(cfg.Schedule.Reconcile, eng, logger.With("component", "reconcile"))
	jobs := []daemon.Job{
		reconcileJob,
		{Name: "purge", Spec: cfg.Schedule.Purge, Timeout: cfg.Retention.MaxDuration + cfg.Retention.MaxDuration/2, Run: func(ctx context.Context) error {
			_, err := purger.RunOnce(ctx)
			return err
		}},
		{Name: "alerts", Spec: cfg.Schedule.Alerts, Run: func(ctx context.Context) error {
			start := time.Now()
			rep, err := dispatcher.RunOnce(ctx)
			if idleRuns.due(start, rep.Claimed == 0 && err == nil) {
				recordAlertsRun(ctx, logger, pool, replica, start, rep, err)
			}
			return err
		}},
		{Name: "observe", Spec: "@every 1m", Run: func(ctx context.Context) error {
			return ledgerGauges.Update(ctx, pool, eng.Windows, cfg.ToolNames())
		}},
	}
	for i := range jobs {
		jobs[i].Ledger = l.Name
	}
	return &ledgerParts{eng: eng, closer: closer, jobs: jobs}, nil
}

// checkListen refuses an HTTP listen address net.Listen could never use:
// HOST:PORT or :PORT, PORT a number from 0 to 65535 or a service name.
func checkListen(addr string) error {
	host, port, err := net.SplitHostPort(addr)
	if err != nil {
		return fmt.Errorf("%q is not HOST:PORT or :PORT (%w)", addr, err)
	}
	if strings.Contains(host, ":") && net.ParseIP(host) == nil {
		return fmt.Errorf("%q: host %q is not an IP address or name", addr, host)
	}
	if _, err := net.LookupPort("tcp", port); err != nil { //nolint:noctx // a number or an /etc/services name: nothing on the network to cancel
		return fmt.Errorf("%q: port %q is not a port number (0-65535) or service name", addr, port)
	}
	return nil
}

// idleAlertsRunEvery is how often serve records a delivery pass that had
// nothing to deliver: `status`'s alerts run is never older than this while
// serve runs, without a row every 15 seconds.
const idleAlertsRunEvery = time.Minute

// idleRecorder decides which delivery passes serve records: every pass
// that delivered something or failed, and an idle one when none was
// recorded for every.
type idleRecorder struct {
	every time.Duration
	mu    sync.Mutex
	last  time.Time
}

func (r *idleRecorder) due(now time.Time, idle bool) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	if idle && !r.last.IsZero() && now.Sub(r.last) < r.every {
		return false
	}
	r.last = now
	return true
}

// recordAlertsRun notes a delivery pass in ledgerkeeper_runs for `status`.
func recordAlertsRun(ctx context.Context, logger *slog.Logger, pool store.Pool, actor string, start time.Time, rep alerts.Report, err error) {
	stats, _ := json.Marshal(rep)
	run := store.Run{Kind: "alerts", Actor: actor, StartedAt: start, Stats: stats}
	if err != nil {
		run.Error = err.Error()
	} else if rep.LastError != "" {
		run.Error = rep.LastError
	}
	rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
	defer cancel()
	if rerr := store.RecordRun(rctx, pool, run); rerr != nil {
		logger.Warn("record alert delivery run", "replica", actor, "err", rerr)
	}
}
