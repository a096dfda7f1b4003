package alerts

import (
	"context"
	"fmt"
	"testing"

	"github.com/ledgerkeeper/ledgerkeeper/internal/pgtest"
)

// ResolveKeys does, in one statement, what ResolveKey does key by key: the
// same alert_state and the same resolved notices (texts cleaned the same
// way), and it leaves other keys' alerts open.
func TestResolveKeysMatchesResolveKey(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	one, many := pgtest.New(t), pgtest.New(t)
	for _, db := range []*pgtest.DB{one, many} {
		for _, a := range []Alert{
			{Reason: ReasonProbeFailing, Tool: "t", Key: "a"},
			{Reason: ReasonNoProbe, Tool: "t", Key: "a"},
			{Reason: ReasonProbeFailing, Tool: "u", Key: "b"},
			{Reason: ReasonProbeFailing, Tool: "t", Key: "open"},
		} {
			if _, err := Raise(ctx, db.Pool, a, 0); err != nil {
				t.Fatal(err)
			}
		}
	}
	rs := []KeyResolution{
		{Tool: "t", Key: "a", How: "completed (by the original attempt or an operator)"},
		{Tool: "u", Key: "b", How: "odd\x00text \xff"},
		{Tool: "t", Key: "a", How: "a second resolution of a is ignored"},
		{Tool: "t", Key: "never-alerted", How: "nothing to resolve"},
	}
	want := 0
	for _, r := range rs[:2] {
		n, err := ResolveKey(ctx, one.Pool, r.Tool, r.Key, r.How)
		if err != nil {
			t.Fatal(err)
		}
		want += n
	}
	got, err := ResolveKeys(ctx, many.Pool, rs)
	if err != nil {
		t.Fatal(err)
	}
	if got != want || got != 3 {
		t.Fatalf("ResolveKeys resolved %d, ResolveKey %d; want 3", got, want)
	}
	dump := func(db *pgtest.DB) string {
		rows, err := db.Pool.Query(ctx, `SELECT reason, kind, coalesce(tool, '-'), coalesce(key, '-'), details::text, status FROM alert_outbox ORDER BY key, kind, reason`)
		if err != nil {
			t.Fatal(err)
		}
		defer rows.Close()
		var out string
		for rows.Next() {
			v, err := rows.Values()
			if err != nil {
				t.Fatal(err)
			}
			out += fmt.Sprintln(v...)
		}
		var state []string
		srows, err := db.Pool.Query(ctx, `SELECT reason || ' ' || subject || ' ' || (resolved_at IS NULL)::text FROM alert_state ORDER BY 1`)
		if err != nil {
			t.Fatal(err)
		}
		defer srows.Close()
		for srows.Next() {
			var s string
			if err := srows.Scan(&s); err != nil {
				t.Fatal(err)
			}
			state = append(state, s)
		}
		return out + fmt.Sprint(state)
	}
	if a, b := dump(one), dump(many); a != b {
		t.Fatalf("ResolveKey left\n%s\nResolveKeys left\n%s", a, b)
	}
	if n := many.Count(t, "alert_state WHERE subject = 'key:open' AND resolved_at IS NULL"); n != 1 {
		t.Fatal("an alert of a key not given was resolved")
	}
	if n, err := ResolveKeys(ctx, many.Pool, nil); n != 0 || err != nil {
		t.Fatalf("ResolveKeys(nil) = %d, %v", n, err)
	}
}
