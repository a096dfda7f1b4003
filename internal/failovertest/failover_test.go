package failovertest

import (
	"context"
	"testing"

	"github.com/ledgerkeeper/ledgerkeeper/internal/hatest"
)

// One pg_auto_failover formation for the planned switchover and then the
// kill -9 of the new primary (each on its own database, with its own serve
// and tool server); a streaming pair for the role flip, at the same time.
func TestServeAndToolServerSurviveFailovers(t *testing.T) {
	t.Run("formation", func(t *testing.T) {
		t.Parallel()
		f := hatest.Start(t)
		t.Run("planned switchover", func(t *testing.T) {
			createDB(t, f.URL("postgres"), "ledger_planned")
			scenario{name: "planned switchover (pg_autoctl perform failover)", url: f.URL("ledger_planned"),
				failover: f.PerformFailover}.run(t)
		})
		t.Run("kill -9 of the primary", func(t *testing.T) {
			createDB(t, f.URL("postgres"), "ledger_killed")
			scenario{name: "kill -9 of the primary", url: f.URL("ledger_killed"), failover: func(ctx context.Context) error {
				killed, err := f.KillPrimary(ctx)
				if err != nil {
					return err
				}
				return f.WaitWritable(ctx, 1-killed)
			}}.run(t)
		})
	})
	t.Run("role flip without closed sockets", func(t *testing.T) {
		t.Parallel()
		p := hatest.StartFlipPair(t)
		createDB(t, p.PrimaryURL("postgres"), "ledger_flip")
		url := p.URL("ledger_flip")
		scenario{name: "role flip (old primary read-only in place, standby promoted)", url: url, failover: func(ctx context.Context) error {
			if err := p.WaitReplayed(ctx); err != nil {
				return err
			}
			return p.Flip(ctx)
		}}.run(t)
	})
}
