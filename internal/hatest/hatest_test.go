package hatest

import (
	"context"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
)

// The pair's flip turns the primary read-only and the standby writable,
// with what was written before on both. (The formation is exercised by
// internal/failovertest's scenarios, which need it for half a minute
// already: not started twice in CI.)
func TestPairFlipsRoles(t *testing.T) {
	t.Run("pair", func(t *testing.T) {
		t.Parallel()
		ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
		defer cancel()
		p := StartFlipPair(t)
		if err := query(ctx, p.PrimaryURL("postgres"), "CREATE TABLE before_flip (x int)"); err != nil {
			t.Fatal(err)
		}
		if err := p.WaitReplayed(ctx); err != nil {
			t.Fatal(err)
		}
		if err := p.Flip(ctx); err != nil {
			t.Fatal(err)
		}
		if err := query(ctx, p.PrimaryURL("postgres"), "INSERT INTO before_flip VALUES (1)"); err == nil {
			t.Error("the old primary still takes writes after the flip")
		}
		if err := query(ctx, p.URL("postgres"), "INSERT INTO before_flip VALUES (1)"); err != nil {
			t.Errorf("the pair's URL does not reach the new primary: %v", err)
		}
	})
	// A write transaction begun on the old primary before the flip (its
	// read-only setting applies to new transactions only) may commit after
	// the standby was promoted: that commit must never be acknowledged,
	// since the new primary does not have it.
	t.Run("a commit after the flip is never acknowledged", func(t *testing.T) {
		t.Parallel()
		ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
		defer cancel()
		p := StartFlipPair(t)
		if err := query(ctx, p.PrimaryURL("postgres"), "CREATE TABLE flip_race (x int)"); err != nil {
			t.Fatal(err)
		}
		conn, err := pgx.Connect(ctx, p.PrimaryURL("postgres"))
		if err != nil {
			t.Fatal(err)
		}
		defer conn.Close(context.Background())
		tx, err := conn.Begin(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := tx.Exec(ctx, "INSERT INTO flip_race VALUES (1)"); err != nil {
			t.Fatal(err)
		}
		if err := p.WaitReplayed(ctx); err != nil {
			t.Fatal(err)
		}
		if err := p.Flip(ctx); err != nil {
			t.Fatal(err)
		}
		cctx, ccancel := context.WithTimeout(ctx, 3*time.Second)
		defer ccancel()
		if err := tx.Commit(cctx); err == nil {
			var n int
			if err := query(ctx, p.URL("postgres"), "SELECT count(*)::int FROM flip_race", &n); err != nil {
				t.Fatal(err)
			}
			t.Errorf("the old primary acknowledged a commit after the flip; the new primary has %d of its rows", n)
		}
	})
}
