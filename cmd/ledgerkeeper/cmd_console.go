package main

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"time"

	"github.com/spf13/cobra"

	"github.com/ledgerkeeper/ledgerkeeper/console"
	"github.com/ledgerkeeper/ledgerkeeper/internal/daemon"
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
			pool, err := a.pool(ctx)
			if err != nil {
				return err
			}
			defer pool.Close()
			if err := checkSchema(ctx, pool.raw, pool.schema); err != nil {
				return err
			}
			logger := a.logger.With("component", "console")
			// The probes and the reconciler, built as `probe run` and
			// `reconcile` build them: "probe now" and "reconcile this key
			// now" on a key's page. This engine only probes; each
			// "reconcile now" builds its own, with the user as its actor.
			eng, closer, err := a.probeEngine(ctx, pool)
			if err != nil {
				return err
			}
			defer closer.Close()
			h, err := daemon.BuildConsole(a.cfg, pool, a.windows, listen, logger, daemon.WithRun(daemon.ConsoleRun(a.cfg, pool, a.registry(), eng, logger)))
			if err != nil {
				return &configError{err}
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
