package main

import (
	"context"
	"encoding/json"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/spf13/cobra"

	"github.com/ledgerkeeper/ledgerkeeper/alerts"
	"github.com/ledgerkeeper/ledgerkeeper/expiry"
	"github.com/ledgerkeeper/ledgerkeeper/internal/daemon"
	"github.com/ledgerkeeper/ledgerkeeper/ledger/store"
	"github.com/ledgerkeeper/ledgerkeeper/migrations"
	"github.com/ledgerkeeper/ledgerkeeper/reconcile"
)

func newServeCmd(a *app) *cobra.Command {
	var migrate, runAtStart bool
	var listen string
	cmd := &cobra.Command{
		Use:   "serve",
		Short: "Run the daemon: scheduled reconcile, purge and alert delivery; /metrics, /healthz, /readyz",
		Long: `Run the daemon. On the schedules in the configuration (robfig/cron specs) it
runs reconcile passes (schedule.reconcile), purge passes (schedule.purge) and
alert delivery (schedule.alerts), and it serves /metrics (Prometheus),
/healthz (alive) and /readyz (database reachable, schema current) on
http.listen. Any number of replicas may run at once. SIGTERM or SIGINT stops
it gracefully: no new runs, running ones wind down, decisions whose probe
finished are still written.`,
		Args: args(cobra.NoArgs),
		RunE: func(cmd *cobra.Command, _ []string) error {
			ctx := cmd.Context()
			pool, err := a.pool(ctx)
			if err != nil {
				return err
			}
			defer pool.Close()
			if migrate {
				if _, err := migrations.Up(ctx, pool, a.logger); err != nil {
					return err
				}
			}
			if err := checkSchema(ctx, pool); err != nil {
				return fmt.Errorf("%w (or start serve with --migrate)", err)
			}
			if listen != "" {
				a.cfg.HTTP.Listen = listen
			}
			replica := daemon.ReplicaID()
			logger := a.logger.With("replica", replica)

			reg := prometheus.NewRegistry()
			reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
			daemon.RegisterBuildInfo(reg) // ledgerkeeper_build_info: which release runs (ledgerkeeper version)
			eng, closer, err := daemon.BuildEngine(ctx, a.cfg, pool, a.registry(), replica, logger.With("component", "reconcile"), reconcile.NewMetrics(reg))
			if err != nil {
				return &configError{err}
			}
			defer closer.Close()
			purger := expiry.New(daemon.PurgeConfig(a.cfg, replica), pool, logger.With("component", "purge"), expiry.NewMetrics(reg))
			dispatcher, err := newDispatcherWithMetrics(a, pool, alerts.NewMetrics(reg))
			if err != nil {
				return err
			}
			ledgerGauges := daemon.NewLedgerMetrics(reg)

			d, err := daemon.New(daemon.Config{
				Listen:     a.cfg.HTTP.Listen,
				Registry:   reg,
				Logger:     logger,
				RunAtStart: runAtStart,
				Ready: func(ctx context.Context) error {
					if err := pool.Ping(ctx); err != nil {
						if refusedByServer(err) {
							// After a password rotation: the reason, not the TLS attempt.
							return fmt.Errorf("database refused the connection: %s", rootCause(err))
						}
						return fmt.Errorf("database unreachable: %s", rootCause(err))
					}
					return checkSchema(ctx, pool)
				},
				Jobs: []daemon.Job{
					{Name: "reconcile", Spec: a.cfg.Schedule.Reconcile, Run: func(ctx context.Context) error {
						rep, err := eng.Run(ctx, reconcile.Options{})
						if rep.Decided > 0 || rep.OutOfTime {
							logger.Info("reconcile pass", "keys", rep.Decided, "actions", rep.Actions, "alerts_raised", rep.AlertsRaised,
								"duration", rep.Duration, "out_of_time", rep.OutOfTime)
						}
						return err
					}},
					{Name: "purge", Spec: a.cfg.Schedule.Purge, Timeout: a.cfg.Retention.MaxDuration.D() + a.cfg.Retention.MaxDuration.D()/2, Run: func(ctx context.Context) error {
						_, err := purger.RunOnce(ctx)
						return err
					}},
					{Name: "alerts", Spec: a.cfg.Schedule.Alerts, Run: func(ctx context.Context) error {
						start := time.Now()
						rep, err := dispatcher.RunOnce(ctx)
						recordAlertsRun(ctx, a, pool, replica, start, rep, err)
						return err
					}},
					{Name: "observe", Spec: "@every 1m", Run: func(ctx context.Context) error {
						return ledgerGauges.Update(ctx, pool, eng.Windows, a.cfg.ToolNames())
					}},
				},
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
		},
	}
	cmd.Flags().BoolVar(&migrate, "migrate", false, "apply pending schema migrations before starting")
	cmd.Flags().BoolVar(&runAtStart, "run-at-start", true, "run every job once at start-up, then on schedule")
	cmd.Flags().StringVar(&listen, "listen", "", "HTTP listen address (overrides http.listen)")
	return cmd
}

// recordAlertsRun notes a delivery pass in ledgerkeeper_runs for `status`,
// only when it did something or failed (not a row every 15 seconds).
func recordAlertsRun(ctx context.Context, a *app, pool *pgxpool.Pool, actor string, start time.Time, rep alerts.Report, err error) {
	if rep.Claimed == 0 && err == nil {
		return
	}
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
		a.logger.Warn("record alert delivery run", "err", rerr)
	}
}
