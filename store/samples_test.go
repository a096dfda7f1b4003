package store_test

import (
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/ledgerkeeper/ledgerkeeper/internal/pgtest"
	"github.com/ledgerkeeper/ledgerkeeper/ledger"
	"github.com/ledgerkeeper/ledgerkeeper/store"
)

// A bucket written again (by this process later, or by another replica at
// once) keeps one row per tool with the latest counts; samples older than
// the cutoff go; the read gives them back by tool, oldest first.
func TestStuckSamplesUpsertPerBucketAndPrune(t *testing.T) {
	db := pgtest.New(t)
	b := store.SampleBucket(time.Date(2026, 12, 1, 10, 7, 31, 0, time.UTC))
	if want := time.Date(2026, 12, 1, 10, 5, 0, 0, time.UTC); !b.Equal(want) {
		t.Fatalf("bucket of 10:07:31 = %v, want %v", b, want)
	}
	record := func(samples []store.StuckSample, prune time.Time) {
		t.Helper()
		if err := store.RecordStuckSamples(ctx, db.Pool, samples, prune); err != nil {
			t.Fatal(err)
		}
	}
	old := b.Add(-26 * time.Hour)
	kept := b.Add(-24 * time.Hour)
	record([]store.StuckSample{{Tool: "create_ticket", At: old, Stuck: 9}, {Tool: "create_ticket", At: kept, Stuck: 7, InFlight: 1}}, time.Time{})
	record([]store.StuckSample{{Tool: "refund", At: b, Stuck: 1, InFlight: 2}, {Tool: "create_ticket", At: b, Stuck: 3, InFlight: 4}}, time.Time{})
	// Two replicas write the same bucket at once, many times: no error,
	// one row per tool.
	var wg sync.WaitGroup
	errs := make(chan error, 40)
	for i := range 40 {
		wg.Go(func() {
			errs <- store.RecordStuckSamples(ctx, db.Pool, []store.StuckSample{
				{Tool: "create_ticket", At: b, Stuck: 5, InFlight: i % 2}, {Tool: "refund", At: b, Stuck: 6}}, b.Add(-store.SampleRetention))
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		if err != nil {
			t.Fatalf("replicas writing one bucket: %v", err)
		}
	}
	if n := db.Count(t, `stuck_samples WHERE at = $1`, b); n != 2 {
		t.Fatalf("rows of the bucket: %d, want one per tool (2)", n)
	}
	if n := db.Count(t, `stuck_samples WHERE at = $1`, old); n != 0 {
		t.Errorf("a sample 26 h old was not pruned")
	}
	got, err := store.StuckSamplesSince(ctx, db.Pool, b.Add(-25*time.Hour))
	if err != nil {
		t.Fatal(err)
	}
	want := []store.StuckSample{
		{Tool: "create_ticket", At: kept, Stuck: 7, InFlight: 1},
		{Tool: "create_ticket", At: b, Stuck: 5}, // in flight 0 or 1: the last replica's
		{Tool: "refund", At: b, Stuck: 6},
	}
	if len(got) != len(want) {
		t.Fatalf("samples %+v, want %+v", got, want)
	}
	for i := range want {
		g := got[i]
		if g.Tool != want[i].Tool || !g.At.Equal(want[i].At) || g.Stuck != want[i].Stuck || (i != 1 && g.InFlight != want[i].InFlight) {
			t.Errorf("sample %d: %+v, want %+v", i, g, want[i])
		}
	}
	if since, err := store.StuckSamplesSince(ctx, db.Pool, b); err != nil || len(since) != 2 {
		t.Errorf("since the bucket: %+v, %v; want its 2 rows", since, err)
	}
}

// A sample without a tool or time, or with a negative count, is refused
// and nothing of its batch is written.
func TestStuckSamplesRefuseNonsense(t *testing.T) {
	db := pgtest.New(t)
	now := store.SampleBucket(time.Now())
	for _, bad := range []store.StuckSample{{At: now}, {Tool: "t"}, {Tool: "t", At: now, Stuck: -1}, {Tool: "t", At: now, InFlight: -1}} {
		err := store.RecordStuckSamples(ctx, db.Pool, []store.StuckSample{{Tool: "a", At: now}, bad}, time.Time{})
		if !errors.Is(err, ledger.ErrInvalid) {
			t.Errorf("%+v: %v, want ErrInvalid", bad, err)
		}
	}
	if n := db.Count(t, `stuck_samples`); n != 0 {
		t.Errorf("%d rows written by refused batches", n)
	}
}
