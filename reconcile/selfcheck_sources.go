package reconcile

import (
	"context"
	"errors"

	"github.com/ledgerkeeper/ledgerkeeper/ledger"
	"github.com/ledgerkeeper/ledgerkeeper/probes"
	"github.com/ledgerkeeper/ledgerkeeper/store"
)

// canaries lists tool's canaries: the configuration's first, then those
// operators marked (`ledgerkeeper probe canary add`), newest first.
func (e *Engine) canaries(ctx context.Context, tool string, pol Policy) ([]Canary, error) {
	marked, err := store.Canaries(ctx, e.pool, tool)
	if err != nil {
		return nil, err
	}
	out := make([]Canary, 0, len(pol.Canaries)+len(marked))
	out = append(out, pol.Canaries...)
	for _, c := range marked {
		out = append(out, Canary{Key: c.Key, Request: c.RequestBody})
	}
	return out, nil
}

// newestGroundTruth is the tool's newest key completed by its tool server,
// at any age still in the ledger, other than exclude.
func (e *Engine) newestGroundTruth(ctx context.Context, tool string, exclude []string) (ledger.Key, bool, error) {
	return store.NewestGroundTruth(ctx, e.pool, tool, exclude)
}

// notRendered reports whether the probe could not even be built for the
// key (a request field the key's body lacks): the downstream was never
// asked, so the answer says nothing of it.
func notRendered(r probes.Result) bool {
	return r.Err != nil && errors.Is(r.Err, probes.ErrNotRendered)
}
