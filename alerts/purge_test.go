package alerts

import (
	"context"
	"testing"
	"time"

	"github.com/ledgerkeeper/ledgerkeeper/internal/pgtest"
)

// Sent outbox rows past the max age go, oldest first and at most limit per
// batch; pending rows never go, whatever their age (invariant 8).
func TestPurgeSent(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := pgtest.New(t)
	const day = 24 * time.Hour
	for i := range 5 { // old sent, 40..44 days
		db.Exec(t, `INSERT INTO alert_outbox (reason, tool, key, status, created_at) VALUES ('probe_failing', 't', 'old-sent', 'sent', now() - $1::interval)`, time.Duration(40+i)*day)
	}
	db.Exec(t, `INSERT INTO alert_outbox (reason, tool, key, status, created_at) VALUES ('probe_failing', 't', 'old-pending', 'pending', now() - interval '90 days')`)
	db.Exec(t, `INSERT INTO alert_outbox (reason, tool, key, status, created_at) VALUES ('probe_failing', 't', 'young-sent', 'sent', now() - interval '1 day')`)

	if n, err := CountPurgeableSent(ctx, db.Pool, 30*day); err != nil || n != 5 {
		t.Fatalf("CountPurgeableSent = %d, %v; want 5", n, err)
	}
	n, err := PurgeSent(ctx, db.Pool, 30*day, 2)
	if err != nil || n != 2 {
		t.Fatalf("first batch deleted %d, %v; want 2 (the limit)", n, err)
	}
	// Oldest first: the two oldest (44 and 43 days) are gone.
	if got := db.Count(t, "alert_outbox WHERE key = 'old-sent' AND created_at < now() - interval '42 days 12 hours'"); got != 0 {
		t.Fatalf("%d of the oldest sent rows left after the first batch; want 0", got)
	}
	if n, err = PurgeSent(ctx, db.Pool, 30*day, 10); err != nil || n != 3 {
		t.Fatalf("second batch deleted %d, %v; want the last 3", n, err)
	}
	if n, err = PurgeSent(ctx, db.Pool, 30*day, 10); err != nil || n != 0 {
		t.Fatalf("third batch deleted %d, %v; want 0", n, err)
	}
	for key, want := range map[string]int{"old-sent": 0, "old-pending": 1, "young-sent": 1} {
		if got := db.Count(t, "alert_outbox WHERE key = $1", key); got != want {
			t.Errorf("%s: %d rows; want %d", key, got, want)
		}
	}
}

// Resolved alert state past the max age goes; open state (it drives
// renotify_after) and recently resolved state stay.
func TestTrimState(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := pgtest.New(t)
	const day = 24 * time.Hour
	db.Exec(t, `INSERT INTO alert_state (reason, subject, key, resolved_at) VALUES
		('probe_failing', 'key:a', 'a', now() - interval '40 days'),
		('no_probe', 'key:a', 'a', now() - interval '41 days'),
		('probe_failing', 'key:b', 'b', now() - interval '50 days'),
		('probe_failing', 'key:young', 'young', now() - interval '1 day'),
		('probe_failing', 'key:open', 'open', NULL)`)
	db.Exec(t, `UPDATE alert_state SET first_raised_at = now() - interval '100 days', last_raised_at = now() - interval '100 days' WHERE key = 'open'`)

	if n, err := CountTrimmableState(ctx, db.Pool, 30*day); err != nil || n != 3 {
		t.Fatalf("CountTrimmableState = %d, %v; want 3", n, err)
	}
	total := int64(0)
	for range 3 {
		n, err := TrimState(ctx, db.Pool, 30*day, 2)
		if err != nil || n > 2 {
			t.Fatalf("batch deleted %d, %v; want at most 2", n, err)
		}
		total += n
	}
	if total != 3 {
		t.Fatalf("deleted %d in all; want 3", total)
	}
	if got := db.Count(t, "alert_state"); got != 2 {
		t.Fatalf("%d alert_state rows left; want the young and the open one", got)
	}
	if got := db.Count(t, "alert_state WHERE key IN ('young', 'open')"); got != 2 {
		t.Fatalf("young or open state deleted")
	}
}

// A batch without bounds is a programming error.
func TestPurgeNeedsBounds(t *testing.T) {
	for name, f := range map[string]func(){
		"PurgeSent limit":  func() { _, _ = PurgeSent(context.Background(), nil, time.Hour, 0) },
		"PurgeSent age":    func() { _, _ = PurgeSent(context.Background(), nil, 0, 1) },
		"TrimState limit":  func() { _, _ = TrimState(context.Background(), nil, time.Hour, 0) },
		"TrimState maxAge": func() { _, _ = TrimState(context.Background(), nil, -time.Hour, 1) },
	} {
		func() {
			defer func() {
				if recover() == nil {
					t.Errorf("%s: no panic", name)
				}
			}()
			f()
		}()
	}
}
