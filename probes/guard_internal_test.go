package probes

import (
	"context"
	"encoding/json"
	"errors"
	"testing"
)

// A verdict reached after the context ended is Unknown, whatever it says.
// Through Guard.Probe the outcome is a race (its select may take
// ctx.Done() first and say unknown anyway), so this calls run, the part
// that owns the rule, with a context that has already ended: the probe
// sees it end and then answers.
func TestGuardRunDistrustsVerdictsAfterTheContextEnded(t *testing.T) {
	t.Parallel()
	cause := errors.New("probe deadline of 3s exceeded")
	for _, v := range []Verdict{Found, NotFound, Duplicate} {
		ctx, cancel := context.WithCancelCause(context.Background())
		cancel(cause)
		late := ProbeFunc(func(ctx context.Context, _ Key) Result {
			<-ctx.Done() // already done: never blocks
			return Result{Verdict: v, Outcome: &Outcome{Code: 200, Body: json.RawMessage(`{}`)}, Evidence: json.RawMessage(`{"late":true}`)}
		})
		got := (&guarded{p: late}).run(ctx, Key{Key: "k", Tool: "t"})
		if got.Verdict != Unknown || !errors.Is(got.Err, cause) || got.Outcome != nil {
			t.Errorf("%s answered after the context ended: got %+v, want unknown wrapping the cause and no outcome", v, got)
		}
		if string(got.Evidence) != `{"late":true}` {
			t.Errorf("%s: evidence %s, want the probe's own kept for the audit", v, got.Evidence)
		}
	}
	// Before the context ends, the verdict stands.
	on := ProbeFunc(func(context.Context, Key) Result { return Result{Verdict: NotFound} })
	if got := (&guarded{p: on}).run(context.Background(), Key{Key: "k"}); got.Verdict != NotFound {
		t.Errorf("in-time verdict became %+v", got)
	}
}
