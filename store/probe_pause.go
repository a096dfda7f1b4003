package store

import (
	"context"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/ledgerkeeper/ledgerkeeper/ledger"
)

// PauseProbing records, for every replica, that tool's downstream asked to
// wait for d from now (the database's clock). A shorter pause never cuts a
// longer one short: the later end stays. The breaker's counts are
// untouched (a pause counts nothing).
func PauseProbing(ctx context.Context, db ledger.DBTX, tool string, d time.Duration) error {
	_, err := db.Exec(ctx, `INSERT INTO tool_breakers AS b (tool, probe_paused_until) VALUES ($1, now() + $2::interval)
		ON CONFLICT (tool) DO UPDATE SET probe_paused_until = GREATEST(b.probe_paused_until, EXCLUDED.probe_paused_until)`, tool, d)
	return wrap("record a probe pause", err)
}

// ProbePausedFor is how much longer tool's probing stays paused by a
// downstream's answer to any replica (0: not paused), by the database's
// clock.
func ProbePausedFor(ctx context.Context, db ledger.DBTX, tool string) (time.Duration, error) {
	var secs float64
	err := db.QueryRow(ctx, `SELECT coalesce(extract(epoch FROM greatest(b.probe_paused_until - now(), interval '0')), 0)::float8
		FROM (SELECT 1) one LEFT JOIN tool_breakers b ON b.tool = $1`, tool).Scan(&secs)
	if err != nil {
		return 0, wrap("read a probe pause", err)
	}
	return time.Duration(secs * float64(time.Second)), nil
}

// ProbePauses lists the tools whose probing a downstream has paused and
// when each pause ends, for the console.
func ProbePauses(ctx context.Context, db ledger.DBTX) (map[string]time.Time, error) {
	rows, err := db.Query(ctx, `SELECT tool, probe_paused_until FROM tool_breakers WHERE probe_paused_until > now() ORDER BY tool`)
	if err != nil {
		return nil, wrap("list probe pauses", err)
	}
	out := map[string]time.Time{}
	var tool string
	var until time.Time
	_, err = pgx.ForEachRow(rows, []any{&tool, &until}, func() error {
		out[tool] = until
		return nil
	})
	return out, wrap("list probe pauses", err)
}
