package store

import (
	"cmp"
	"context"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/ledgerkeeper/ledgerkeeper/ledger"
)

// This file holds the SQL of stuck_samples, the console's chart of stuck
// keys over the last day: serve's observe job records each tool's stuck and
// in-flight counts once per SampleEvery bucket (RecordStuckSamples) and the
// console reads them back (StuckSamplesSince). The bucket and the pruning
// cutoff are computed by the caller and bound as parameters: no statement
// here does arithmetic on the database's clock.

// SampleEvery is the width of a sample's bucket: one row per tool per
// bucket, 288 a day.
const SampleEvery = 5 * time.Minute

// SampleRetention is how long samples are kept: the chart's 24 hours and a
// bucket or so of slack.
const SampleRetention = 25 * time.Hour

// StuckSample is one tool's processing keys at a bucket.
type StuckSample struct {
	Tool string
	// At is the bucket's start (SampleBucket).
	At time.Time
	// Stuck and InFlight are as StuckStats counts them (held keys in
	// neither).
	Stuck    int
	InFlight int
}

// SampleBucket is the start of the bucket t falls in, in UTC.
func SampleBucket(t time.Time) time.Time { return t.UTC().Truncate(SampleEvery) }

// RecordStuckSamples upserts samples, one statement for all of them (a
// replica writing the same bucket replaces the counts with its own, which
// are the ledger's too), then deletes the samples older than prune (zero:
// none). Rows are written in tool order, so replicas writing at once lock
// them in the same order.
func RecordStuckSamples(ctx context.Context, db ledger.DBTX, samples []StuckSample, prune time.Time) error {
	if len(samples) > 0 {
		samples = slices.Clone(samples)
		slices.SortFunc(samples, func(a, b StuckSample) int {
			return cmp.Or(strings.Compare(a.Tool, b.Tool), a.At.Compare(b.At))
		})
		samples = slices.CompactFunc(samples, func(a, b StuckSample) bool { return a.Tool == b.Tool && a.At.Equal(b.At) })
		var sql strings.Builder
		sql.WriteString(`INSERT INTO stuck_samples (tool, at, stuck, in_flight) VALUES `)
		args := make([]any, 0, 4*len(samples))
		for i, s := range samples {
			if s.Tool == "" || s.At.IsZero() || s.Stuck < 0 || s.InFlight < 0 {
				return fmt.Errorf("record stuck samples: %+v: %w", s, ledger.ErrInvalid)
			}
			if i > 0 {
				sql.WriteString(", ")
			}
			n := len(args)
			fmt.Fprintf(&sql, "($%d::text, $%d::timestamptz, $%d::integer, $%d::integer)", n+1, n+2, n+3, n+4)
			args = append(args, s.Tool, s.At, s.Stuck, s.InFlight)
		}
		sql.WriteString(` ON CONFLICT (tool, at) DO UPDATE SET stuck = EXCLUDED.stuck, in_flight = EXCLUDED.in_flight`)
		if _, err := db.Exec(ctx, sql.String(), args...); err != nil {
			return wrap("record stuck samples", err)
		}
	}
	if prune.IsZero() {
		return nil
	}
	_, err := db.Exec(ctx, `DELETE FROM stuck_samples WHERE at < $1`, prune)
	return wrap("prune stuck samples", err)
}

// StuckSamplesSince returns the samples at or after since, by tool, oldest
// first.
func StuckSamplesSince(ctx context.Context, db ledger.DBTX, since time.Time) ([]StuckSample, error) {
	rows, err := db.Query(ctx, `SELECT tool, at, stuck, in_flight FROM stuck_samples WHERE at >= $1 ORDER BY tool, at`, since)
	if err != nil {
		return nil, wrap("read stuck samples", err)
	}
	out, err := pgx.CollectRows(rows, func(row pgx.CollectableRow) (StuckSample, error) {
		var s StuckSample
		err := row.Scan(&s.Tool, &s.At, &s.Stuck, &s.InFlight)
		return s, err
	})
	return out, wrap("read stuck samples", err)
}
