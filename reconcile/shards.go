package reconcile

import (
	"context"
	"slices"
	"sync"

	"github.com/ledgerkeeper/ledgerkeeper/alerts"
	"github.com/ledgerkeeper/ledgerkeeper/internal/engine"
	"github.com/ledgerkeeper/ledgerkeeper/store"
)

// On Citus, a worker that cannot be reached leaves its shards' keys as
// they are: the pass's reads that find work skip those shards
// (store.ShardsUnreachableError comes with the rest), the pass works on
// the other shards, and at its end one alert per unreachable worker is
// raised (alerts.RaiseNode), not one per key. A pass that read every shard
// resolves those alerts.

// shardFaults collects the shards a pass could not read.
type shardFaults struct {
	mu     sync.Mutex
	faults map[int64]store.ShardFault
}

type shardFaultsKey struct{}

// withShardFaults returns ctx carrying a collector for the pass's reads.
func withShardFaults(ctx context.Context) (context.Context, *shardFaults) {
	f := &shardFaults{faults: map[int64]store.ShardFault{}}
	return context.WithValue(ctx, shardFaultsKey{}, f), f
}

// skipUnreachable returns nil for a read that came back without some
// shards (recording them in ctx's collector, if any: a read outside a pass,
// `probe check`, has none and goes on with what it read), and err
// otherwise.
func skipUnreachable(ctx context.Context, err error) error {
	e, ok := store.AsShardsUnreachable(err)
	if !ok {
		return err
	}
	if f, _ := ctx.Value(shardFaultsKey{}).(*shardFaults); f != nil {
		f.mu.Lock()
		for _, x := range e.Faults {
			f.faults[x.Shard] = x
		}
		f.mu.Unlock()
	}
	return nil
}

// list returns the collected faults as one error (nil if none).
func (f *shardFaults) list() *store.ShardsUnreachableError {
	f.mu.Lock()
	defer f.mu.Unlock()
	if len(f.faults) == 0 {
		return nil
	}
	e := &store.ShardsUnreachableError{Op: "reconcile"}
	for _, x := range f.faults {
		e.Faults = append(e.Faults, x)
	}
	return e
}

// settleNodeAlerts raises one alert per worker the pass could not reach
// and, when the pass listed the tools of every shard that answers
// (listed), resolves the alerts of the workers that answered: a worker
// back while another is still down has its alert resolved. Only on Citus,
// and never in a dry run.
func (p *pass) settleNodeAlerts(ctx context.Context, listed bool) {
	e := p.e
	if p.opts.DryRun || !engine.Citus() {
		return
	}
	unreached := p.shards.list()
	e.metrics.observeShards(unreached)
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), writeTimeout)
	defer cancel()
	var down []string
	if unreached != nil {
		down = unreached.Nodes()
		for _, node := range down {
			shards := unreached.ShardsOn(node)
			e.logger.Warn("Citus worker unreachable: its shards' keys wait for it; the other shards are reconciled",
				"node", node, "shards", shards, "err", unreached.NodeError(node))
			raised, err := alerts.RaiseNode(ctx, e.pool, alerts.NodeAlert{Node: node, Shards: shards, Error: unreached.NodeError(node)}, e.cfg.RenotifyAfter)
			if err != nil {
				e.logger.Warn("raise the alert of an unreachable Citus worker", "node", node, "err", err)
				continue
			}
			if raised {
				p.mu.Lock()
				p.report.AlertsRaised++
				p.mu.Unlock()
			}
		}
		p.report.UnreachableShards = unreached.Faults
	}
	if !listed {
		return
	}
	open, err := alerts.OpenNodeAlerts(ctx, e.pool)
	if err != nil {
		e.logger.Warn("list the alerts of unreachable Citus workers", "err", err)
		return
	}
	for _, node := range open {
		if slices.Contains(down, node) {
			continue
		}
		n, err := alerts.ResolveNode(ctx, e.pool, node, "a reconcile pass read its shards again")
		if err != nil {
			e.logger.Warn("resolve the alert of a Citus worker", "node", node, "err", err)
			continue
		}
		e.logger.Info("Citus worker reachable again; its shards' keys are reconciled", "node", node)
		p.mu.Lock()
		p.report.ResolvedAlerts += n
		p.mu.Unlock()
	}
}
