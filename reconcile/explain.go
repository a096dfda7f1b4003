package reconcile

import (
	"context"
	"fmt"

	"github.com/ledgerkeeper/ledgerkeeper/ledger"
	"github.com/ledgerkeeper/ledgerkeeper/store"
)

// explainUntouched reports, for each --key the pass did not decide, why:
// an operator asking for a key deserves more than "no due keys".
func (p *pass) explainUntouched(ctx context.Context) {
	done := map[string]bool{}
	for _, k := range p.report.Keys {
		done[k.Key] = true
	}
	for _, k := range p.report.Skipped {
		done[k.Key] = true
	}
	for _, key := range p.opts.Keys {
		if done[key] {
			continue
		}
		k, err := ledger.Get(ctx, p.e.pool, key)
		if err != nil {
			continue
		}
		win, hb := p.e.Windows(k.Tool)
		why := "not due"
		st, err := store.KeyStanding(ctx, p.e.pool, key, win, hb)
		switch {
		case err != nil:
		case k.Status != ledger.StatusProcessing:
			why = "status is " + k.Status + ": nothing to reconcile"
		case st.Held:
			why = "on hold: release it first"
		case st.InWindow:
			why = fmt.Sprintf("in flight: claimed less than its window + grace (%s) ago", win)
		case st.Beating:
			why = "in flight: heartbeating"
		case st.Leased:
			why = "leased by another reconciler right now"
		case p.toolReport(k.Tool).BreakerOpen:
			why = "its tool's circuit breaker is open"
		case p.toolReport(k.Tool).Untrusted:
			why = "its tool's probe is not trusted (self-check failed or inconclusive): no key of the tool changes until it passes; run 'ledgerkeeper probe check'"
		}
		p.report.Skipped = append(p.report.Skipped, KeyResult{Key: key, Tool: k.Tool, Action: why})
	}
}

// toolReport is the report of tool in this pass (zero if not visited).
func (p *pass) toolReport(tool string) ToolReport {
	for _, t := range p.report.Tools {
		if t.Tool == tool {
			return t
		}
	}
	return ToolReport{}
}
