package alerts

import (
	"context"
	"encoding/json"
	"fmt"

	"github.com/ledgerkeeper/ledgerkeeper/internal/safetext"
)

// KeyResolution says how one key's alerts were resolved, for ResolveKeys.
type KeyResolution struct {
	Tool string
	Key  string
	// How is the resolution the notices carry, as for ResolveKey.
	How string
}

// ResolveKeys is ResolveKey for many keys in one statement, whatever their
// number: every open alert of each key is resolved and gets one resolved
// notice in the outbox, in the caller's transaction. A key given twice
// counts once (the first How wins). It returns how many alerts it
// resolved.
func ResolveKeys(ctx context.Context, db DBTX, rs []KeyResolution) (int, error) {
	tools := make([]string, 0, len(rs))
	keys := make([]string, 0, len(rs))
	details := make([]string, 0, len(rs))
	seen := make(map[string]bool, len(rs))
	for _, r := range rs {
		if r.Key == "" {
			panic("alerts: ResolveKeys needs a key")
		}
		if seen[r.Key] {
			continue
		}
		seen[r.Key] = true
		// The notice ResolveKey would enqueue: cleaned as enqueue cleans.
		d, err := json.Marshal(Details{Resolution: safetext.Clean(r.How)})
		if err != nil {
			return 0, fmt.Errorf("encode alert details: %w", err)
		}
		tools, keys, details = append(tools, r.Tool), append(keys, r.Key), append(details, string(d))
	}
	if len(keys) == 0 {
		return 0, nil
	}
	// Served by alert_state_open_idx (one lookup per subject). The notices
	// are inserted in the order of the keys given, then by reason.
	var n int
	err := db.QueryRow(ctx, `WITH r AS (
	SELECT * FROM unnest($1::text[], $2::text[], $3::jsonb[]) WITH ORDINALITY AS r(tool, key, details, ord)
), done AS (
	UPDATE alert_state s SET resolved_at = now()
	FROM r
	WHERE s.subject = 'key:' || r.key AND s.resolved_at IS NULL
	RETURNING s.reason, r.tool, r.key, r.details, r.ord
), notices AS (
	INSERT INTO alert_outbox (reason, kind, tool, key, details)
	SELECT reason, $4, tool, key, details FROM done ORDER BY ord, reason
	RETURNING 1
)
SELECT count(*) FROM notices`, tools, keys, details, string(KindResolved)).Scan(&n)
	if err != nil {
		return 0, fmt.Errorf("resolve alerts of %d key(s): %w", len(keys), err)
	}
	return n, nil
}
