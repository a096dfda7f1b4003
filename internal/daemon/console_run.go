package daemon

import (
	"context"
	"io"
	"log/slog"
	"slices"

	"github.com/ledgerkeeper/ledgerkeeper/console"
	"github.com/ledgerkeeper/ledgerkeeper/internal/config"
	"github.com/ledgerkeeper/ledgerkeeper/probes"
	"github.com/ledgerkeeper/ledgerkeeper/reconcile"
	"github.com/ledgerkeeper/ledgerkeeper/store"
)

// ConsoleRun is what the console runs for "probe now" and "reconcile this
// key now", and what its self-checks page knows of each tool: eng's probes
// and policies (serve's engine, or one `ledgerkeeper console` builds as
// `probe run` does, never run), and per "reconcile now" an engine built from
// the configuration as `ledgerkeeper reconcile` builds one, its actor the
// console user, closed after its one pass.
func ConsoleRun(c *config.Config, pool store.Pool, registry *probes.Registry, eng *reconcile.Engine, logger *slog.Logger) console.RunConfig {
	tools := c.ToolNames()
	if registry != nil {
		tools = append(tools, registry.Tools()...)
	}
	slices.Sort(tools)
	return console.RunConfig{
		Probe:             console.ProbeWith(eng),
		Policy:            eng.Policy,
		Tools:             slices.Compact(tools),
		SelfCheckInterval: c.SelfCheck.Interval,
		Reconciler: func(ctx context.Context, actor string) (*reconcile.Engine, io.Closer, error) {
			return BuildEngine(ctx, c, pool, registry, actor, logger, nil)
		},
	}
}

// WithRun gives the console the probes and the reconciler (ConsoleRun):
// without it "probe now" and "reconcile this key now" are absent.
func WithRun(run console.RunConfig) ConsoleOption {
	return func(cc *console.Config) { cc.Run = run }
}
