package daemon

import (
	"context"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/ledgerkeeper/ledgerkeeper/internal/pgtest"
	"github.com/ledgerkeeper/ledgerkeeper/store"
)

// The observe job records each tool's stuck and in-flight keys for the
// console's chart once per 5-minute bucket (a second refresh in the bucket
// writes nothing), every seen tool included (0 when idle), and prunes
// samples past 25 hours; when the table cannot be written the refresh still
// succeeds, the failure is logged and the bucket is tried again.
func TestObserveRecordsStuckSamplesOncePerBucket(t *testing.T) {
	db := pgtest.New(t)
	ctx := context.Background()
	stuckKeys := func(from, to int) {
		t.Helper()
		db.Exec(t, `INSERT INTO idempotency_keys (key, tool, request_hash, claimed_at, expires_at)
			SELECT 's' || g, 'create_ticket', 'h', now() - interval '1 hour', now() + interval '1 day' FROM generate_series($1::int, $2::int) g`, from, to)
	}
	stuckKeys(1, 2)
	db.Exec(t, `INSERT INTO idempotency_keys (key, tool, request_hash, claimed_at, expires_at) VALUES ('fresh', 'create_ticket', 'h', now(), now() + interval '1 day')`)
	var logs strings.Builder // written by Update, on this goroutine
	m := NewLedgerMetrics(prometheus.NewRegistry())
	m.SetSampleLogger(slog.New(slog.NewTextHandler(&logs, nil)))
	now := time.Date(2026, 12, 1, 10, 2, 0, 0, time.UTC)
	m.clock = func() time.Time { return now }
	windows := func(string) (time.Duration, time.Duration) { return time.Minute, time.Minute }
	update := func() {
		t.Helper()
		if err := m.Update(ctx, db.Pool, windows, []string{"create_ticket", "idle_tool"}); err != nil {
			t.Fatal(err)
		}
	}
	sample := func(tool string, at time.Time) (stuck, inFlight int) {
		t.Helper()
		stuck, inFlight = -1, -1
		rows, err := store.StuckSamplesSince(ctx, db.Pool, at)
		if err != nil {
			t.Fatal(err)
		}
		for _, s := range rows {
			if s.Tool == tool && s.At.Equal(at) {
				return s.Stuck, s.InFlight
			}
		}
		return
	}
	b0 := time.Date(2026, 12, 1, 10, 0, 0, 0, time.UTC)
	b1 := b0.Add(5 * time.Minute)
	db.Exec(t, `INSERT INTO stuck_samples (tool, at, stuck, in_flight) VALUES ('create_ticket', $1, 1, 0), ('create_ticket', $2, 1, 0)`,
		b1.Add(-25*time.Hour-time.Second), b1.Add(-24*time.Hour))

	update()
	if s, f := sample("create_ticket", b0); s != 2 || f != 1 {
		t.Fatalf("10:00 bucket of create_ticket: stuck %d, in flight %d; want 2, 1", s, f)
	}
	if s, f := sample("idle_tool", b0); s != 0 || f != 0 {
		t.Fatalf("10:00 bucket of the idle tool: stuck %d, in flight %d; want 0, 0", s, f)
	}
	// Later in the same bucket: the gauge moves, the sample is not
	// written again.
	stuckKeys(3, 3)
	now = now.Add(2 * time.Minute)
	update()
	if g := testutil.ToFloat64(m.stuck.WithLabelValues("create_ticket")); g != 3 {
		t.Fatalf("stuck gauge %v, want 3", g)
	}
	if s, _ := sample("create_ticket", b0); s != 2 {
		t.Fatalf("10:00 bucket written again in the bucket: stuck %d", s)
	}
	// The next bucket: a new row, and the 25-hour-old one pruned.
	now = b1.Add(time.Second)
	update()
	if s, _ := sample("create_ticket", b1); s != 3 {
		t.Fatalf("10:05 bucket: stuck %d, want 3", s)
	}
	if n := db.Count(t, `stuck_samples WHERE at < $1`, b1.Add(-25*time.Hour)); n != 0 {
		t.Errorf("%d sample(s) older than 25 h kept", n)
	}
	if n := db.Count(t, `stuck_samples WHERE at = $1`, b1.Add(-24*time.Hour)); n != 1 {
		t.Errorf("the sample of 24 h ago was pruned")
	}
	if n := db.Count(t, `stuck_samples`); n != 5 {
		t.Errorf("%d samples, want 2 tools × 2 buckets + the 24 h one", n)
	}

	// The table cannot be written: the refresh succeeds, says so in the
	// log, and the bucket is written at the next refresh.
	db.Exec(t, `ALTER TABLE stuck_samples RENAME TO stuck_samples_away`)
	now = b1.Add(5 * time.Minute)
	update()
	if up := testutil.ToFloat64(m.up); up != 1 {
		t.Errorf("ledger_up %v after a failed sample write", up)
	}
	if !strings.Contains(logs.String(), "stuck-keys samples failed") {
		t.Errorf("the failed write is not logged:\n%s", logs.String())
	}
	db.Exec(t, `ALTER TABLE stuck_samples_away RENAME TO stuck_samples`)
	now = now.Add(time.Minute)
	update()
	if s, _ := sample("create_ticket", b1.Add(5*time.Minute)); s != 3 {
		t.Errorf("the bucket of the failed write was not written at the next refresh: stuck %d", s)
	}
}
