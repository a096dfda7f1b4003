package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"time"

	"github.com/spf13/cobra"

	"github.com/ledgerkeeper/ledgerkeeper/console"
	"github.com/ledgerkeeper/ledgerkeeper/internal/daemon"
	"github.com/ledgerkeeper/ledgerkeeper/reconcile"
)

func newConsoleCmd(a *app) *cobra.Command {
	var listen string
	cmd := &cobra.Command{
		Use:   "console",
		Short: "Serve the web console alone (no reconcile, no purge), on 127.0.0.1:9465 by default",
		Long: `Serve the web console at /ui/ on console.listen (127.0.0.1:9465 unless
set), and nothing else: no reconcile passes, no purge, no alert delivery.
For a laptop with access to the ledger's database; serve mounts the same
console on http.listen (http.console.enabled). Users, grants and auth are
the console section's (console.auth none only on a loopback listener).
SIGTERM or SIGINT stops it.`,
		Args: args(cobra.NoArgs),
		RunE: func(cmd *cobra.Command, _ []string) error {
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
				if err := checkListen(a.cfg.Console.Listen); err != nil {
					return &configError{a.cfg.ErrorAt("console.listen", "%v", err)}
				}
				listen = a.cfg.Console.Listen
			}
			ctx := cmd.Context()
			logger := a.logger.With("component", "console")
			var h http.Handler
			if a.all.Fleet() && a.cfg == a.all {
				fleet, closeAll, err := a.fleetConsole(ctx, listen, logger)
				if err != nil {
					return err
				}
				defer closeAll()
				h = fleet
			} else {
				pool, err := a.pool(ctx)
				if err != nil {
					return err
				}
				defer pool.Close()
				if err := checkSchema(ctx, pool.raw, pool.schema); err != nil {
					return err
				}
				// The probes and the reconciler, built as `probe run` and
				// `reconcile` build them: "probe now" and "reconcile this
				// key now" on a key's page. This engine only probes; each
				// "reconcile now" builds its own, with the user as its
				// actor.
				eng, closer, err := a.probeEngine(ctx, pool)
				if err != nil {
					return err
				}
				defer closer.Close()
				one, err := daemon.BuildConsole(a.cfg, pool, a.windows, listen, logger, daemon.WithRun(daemon.ConsoleRun(a.cfg, pool, a.registry(), eng, logger)))
				if err != nil {
					return &configError{err}
				}
				h = one
			}
			ln, err := net.Listen("tcp", listen)
			if err != nil {
				return fmt.Errorf("listen on %s: %w", listen, err)
			}
			mux := http.NewServeMux()
			mux.Handle(console.Path, h)
			mux.Handle("GET /{$}", http.RedirectHandler(console.Path, http.StatusFound))
			srv := &http.Server{Handler: mux, ReadHeaderTimeout: 10 * time.Second}
			logger.Info("console listening", "summary", daemon.ConsoleSummary(a.cfg, ln.Addr().String()))
			done := make(chan error, 1)
			go func() { done <- srv.Serve(ln) }()
			select {
			case err := <-done:
				return err
			case <-ctx.Done():
			}
			stop, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			defer cancel()
			if err := srv.Shutdown(stop); err != nil {
				return err
			}
			if err := <-done; !errors.Is(err, http.ErrServerClosed) {
				return err
			}
			return nil
		},
	}
	cmd.Flags().StringVar(&listen, "listen", "", "HTTP listen address (overrides console.listen)")
	return cmd
}

// fleetConsole is the console of every ledger (a ledgers section, no
// --ledger): /ui/ lists them, /ui/ledgers/NAME/ is each one's. A ledger
// whose database cannot be reached or whose schema is behind is left out,
// said in the log; the others are served.
func (a *app) fleetConsole(ctx context.Context, listen string, logger *slog.Logger) (http.Handler, func(), error) {
	var closers []func()
	closeAll := func() {
		for _, c := range closers {
			c()
		}
	}
	var targets []daemon.LedgerTarget
	engines := map[string]*reconcile.Engine{}
	all := a.cfg
	defer func() { a.cfg = all }()
	for _, l := range a.all.Ledgers() {
		pool, err := connectLedger(ctx, l)
		if err == nil {
			if err = checkSchema(ctx, pool.raw, pool.schema); err != nil {
				pool.Close()
			}
		}
		if err != nil {
			logger.Error("ledger left out of the console", "ledger", l.Name, "err", a.redactor().String(err.Error()))
			continue
		}
		closers = append(closers, pool.Close)
		a.cfg = l.Config // probeEngine builds the ledger's probes
		eng, closer, err := a.probeEngine(ctx, pool)
		if err != nil {
			closeAll()
			return nil, nil, fmt.Errorf("ledger %s: %w", l.Name, err)
		}
		closers = append(closers, func() { closer.Close() })
		engines[l.Name] = eng
		cfg := l.Config
		targets = append(targets, daemon.LedgerTarget{Name: l.Name, Config: cfg, Pool: pool, Windows: func(tool string) (time.Duration, time.Duration) {
			p := cfg.Policy(tool)
			return p.ProcessingWindow + cfg.Reconcile.Grace, p.HeartbeatTimeout
		}})
	}
	if len(targets) == 0 {
		return nil, nil, errors.New("no ledger could be opened: see the errors above")
	}
	byName := map[string]daemon.LedgerTarget{}
	for _, t := range targets {
		byName[t.Name] = t
	}
	h, err := daemon.BuildFleetConsole(a.all, targets, listen, logger, func(name string) []daemon.ConsoleOption {
		t := byName[name]
		return []daemon.ConsoleOption{daemon.WithRun(daemon.ConsoleRun(t.Config, t.Pool, a.registry(), engines[name], logger.With("ledger", name)))}
	})
	if err != nil {
		closeAll()
		return nil, nil, &configError{err}
	}
	return h, closeAll, nil
}
