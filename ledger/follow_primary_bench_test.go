package ledger

import (
	"context"
	"encoding/json"
	"testing"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/ledgerkeeper/ledgerkeeper/ledger/ledgertest"
)

// BenchmarkClaimOnFollowingPool compares, side by side on one database, a
// replayed claim (one statement) on a plain pool and on a pool made by
// FollowPrimary: the Go-side cost of following the primary (a tracer call
// per statement, a generation check per acquire and release), in CPU per
// claim, which the round trip's wall time hides:
//
//	go test -run '^$' -bench ClaimOnFollowingPool -benchmem -count 5 ./ledger/
func BenchmarkClaimOnFollowingPool(b *testing.B) {
	db := ledgertest.New(b)
	ctx := context.Background()
	body := json.RawMessage(`{"account_id":"A-7","title":"Printer on fire"}`)
	hash, err := Fingerprint(body)
	if err != nil {
		b.Fatal(err)
	}
	p := ClaimParams{Key: "bench:replay", Tool: "t", RequestHash: hash, RequestBody: body}
	if _, err := Claim(ctx, db.Pool, p); err != nil {
		b.Fatal(err)
	}
	if err := Complete(ctx, db.Pool, p.Key, mustGet(b, db, p.Key).ClaimedAt, 201, json.RawMessage(`{"ticket":"T-1"}`)); err != nil {
		b.Fatal(err)
	}
	plain := db.Pool
	pc, err := pgxpool.ParseConfig(db.URL)
	if err != nil {
		b.Fatal(err)
	}
	FollowPrimary(pc, FollowOptions{})
	following, err := pgxpool.NewWithConfig(ctx, pc)
	if err != nil {
		b.Fatal(err)
	}
	defer following.Close()
	for _, v := range []struct {
		name string
		pool *pgxpool.Pool
	}{{"plain", plain}, {"following", following}} {
		b.Run(v.name, func(b *testing.B) {
			defer reportCPU(b)()
			for b.Loop() {
				res, err := claimAs(ctx, v.pool, p, claimSlim)
				if err != nil || res.Outcome != Replay {
					b.Fatalf("claim: %v %v", res.Outcome, err)
				}
			}
		})
	}
}
