package hatest

import (
	"context"
	"testing"
	"time"
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
}
