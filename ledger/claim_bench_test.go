package ledger

import (
	"context"
	"encoding/json"
	"fmt"
	"syscall"
	"testing"
	"time"

	"github.com/ledgerkeeper/ledgerkeeper/ledger/ledgertest"
)

// BenchmarkClaimShape compares, side by side on one database, the Go-side
// cost of a claim reading back the whole row (Claim) and the middleware's
// slim claim, for a replay (the common retry) and a new key:
//
//	go test -run '^$' -bench ClaimShape -benchmem -count 5 ./ledger/
func BenchmarkClaimShape(b *testing.B) {
	db := ledgertest.New(b)
	ctx := context.Background()
	body := json.RawMessage(`{"account_id":"A-7","title":"Printer on fire"}`)
	hash, err := Fingerprint(body)
	if err != nil {
		b.Fatal(err)
	}
	if _, err := Claim(ctx, db.Pool, ClaimParams{Key: "bench:replay", Tool: "t", RequestHash: hash, RequestBody: body}); err != nil {
		b.Fatal(err)
	}
	if err := Complete(ctx, db.Pool, "bench:replay", mustGet(b, db, "bench:replay").ClaimedAt, 201, json.RawMessage(`{"ticket":"T-1"}`)); err != nil {
		b.Fatal(err)
	}
	seq := 0 // new keys stay new across the sub-benchmarks' reruns
	for _, shape := range []struct {
		name  string
		shape claimShape
	}{{"full", claimFull}, {"slim", claimSlim}} {
		b.Run("replay/"+shape.name, func(b *testing.B) {
			p := ClaimParams{Key: "bench:replay", Tool: "t", RequestHash: hash, RequestBody: body}
			defer reportCPU(b)()
			for b.Loop() {
				res, err := claimAs(ctx, db.Pool, p, shape.shape)
				if err != nil || res.Outcome != Replay {
					b.Fatalf("claim: %v %v", res.Outcome, err)
				}
			}
		})
		b.Run("new/"+shape.name, func(b *testing.B) {
			defer reportCPU(b)()
			for b.Loop() {
				seq++
				p := ClaimParams{Key: fmt.Sprintf("bench:new:%d", seq), Tool: "t", RequestHash: hash, RequestBody: body}
				res, err := claimAs(ctx, db.Pool, p, shape.shape)
				if err != nil || res.Outcome != New {
					b.Fatalf("claim: %v %v", res.Outcome, err)
				}
			}
		})
	}
}

// reportCPU reports this process's CPU time (user+sys) per operation:
// the Go side's cost, which wall time per op (mostly the round trip to
// PostgreSQL) hides.
func reportCPU(b *testing.B) func() {
	start := cpuTime(b)
	return func() {
		b.ReportMetric(float64((cpuTime(b)-start).Nanoseconds())/float64(b.N), "cpu-ns/op")
	}
}

func cpuTime(b *testing.B) time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		b.Fatal(err)
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

func mustGet(b *testing.B, db *ledgertest.DB, key string) Key {
	b.Helper()
	k, err := Get(context.Background(), db.Pool, key)
	if err != nil {
		b.Fatal(err)
	}
	return k
}
