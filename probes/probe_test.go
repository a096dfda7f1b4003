package probes_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/ledgerkeeper/ledgerkeeper/ledger/ledgertest/testwait"
	"github.com/ledgerkeeper/ledgerkeeper/probes"
)

func returns(res probes.Result) probes.Probe {
	return probes.ProbeFunc(func(context.Context, probes.Key) probes.Result { return res })
}

func TestGuardPassesWellFormedResults(t *testing.T) {
	t.Parallel()
	body := json.RawMessage(`{"id":"t-1"}`)
	for _, res := range []probes.Result{
		{Verdict: probes.Found, Outcome: &probes.Outcome{Code: 201, Body: body}, Evidence: json.RawMessage(`{"matches":1}`)},
		{Verdict: probes.Found, Outcome: &probes.Outcome{Code: 200, Body: json.RawMessage(`[1,"two"]`)}},
		{Verdict: probes.NotFound, Evidence: json.RawMessage(`{"rows":0}`)},
		{Verdict: probes.Duplicate, Err: errors.New("2 charges")},
		{Verdict: probes.Duplicate},
		{Verdict: probes.Unknown, Err: errors.New("boom")},
	} {
		got := probes.Guard(returns(res), time.Second).Probe(context.Background(), testKey)
		if got.Verdict != res.Verdict || string(got.Evidence) != string(res.Evidence) || got.Err != res.Err { //nolint:errorlint // identity: Guard passes the result through unchanged
			t.Errorf("Guard changed %+v into %+v", res, got)
		}
		if res.Outcome != nil && (got.Outcome.Code != res.Outcome.Code || string(got.Outcome.Body) != string(res.Outcome.Body)) {
			t.Errorf("outcome %+v became %+v", res.Outcome, got.Outcome)
		}
	}
}

func TestGuardCopiesTheOutcome(t *testing.T) {
	t.Parallel()
	body := []byte(`{"id":"t-1"}`)
	got := probes.Guard(returns(probes.Result{Verdict: probes.Found, Outcome: &probes.Outcome{Code: 200, Body: body}}), 0).Probe(context.Background(), testKey)
	copy(body, `{"id":"XXX"}`) // the probe reuses its buffer
	if string(got.Outcome.Body) != `{"id":"t-1"}` {
		t.Errorf("outcome body changed under the engine: %s", got.Outcome.Body)
	}
}

func TestGuardTurnsGarbageIntoUnknown(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name   string
		res    probes.Result
		errHas string
	}{
		{"found without outcome", probes.Result{Verdict: probes.Found}, "without an outcome"},
		{"found with invalid JSON", probes.Result{Verdict: probes.Found, Outcome: &probes.Outcome{Code: 200, Body: json.RawMessage(`{"id":`)}}, "not valid JSON"},
		{"found with empty body", probes.Result{Verdict: probes.Found, Outcome: &probes.Outcome{Code: 200}}, "not valid JSON"},
		{"found with zero code", probes.Result{Verdict: probes.Found, Outcome: &probes.Outcome{Body: json.RawMessage(`{}`)}}, "response code 0"},
		{"found with code 1000", probes.Result{Verdict: probes.Found, Outcome: &probes.Outcome{Code: 1000, Body: json.RawMessage(`{}`)}}, "response code 1000"},
		{"found with error", probes.Result{Verdict: probes.Found, Outcome: &probes.Outcome{Code: 200, Body: json.RawMessage(`{}`)}, Err: errors.New("partial")}, "partial"},
		{"not_found with error", probes.Result{Verdict: probes.NotFound, Err: errors.New("connection reset")}, "connection reset"},
		{"not_found with outcome", probes.Result{Verdict: probes.NotFound, Outcome: &probes.Outcome{Code: 200, Body: json.RawMessage(`{}`)}}, "with an outcome"},
		{"unknown verdict string", probes.Result{Verdict: "maybe"}, `"maybe"`},
		{"empty verdict", probes.Result{}, `""`},
		{"uppercase verdict", probes.Result{Verdict: "FOUND", Outcome: &probes.Outcome{Code: 200, Body: json.RawMessage(`{}`)}}, `"FOUND"`},
		{"invalid evidence", probes.Result{Verdict: probes.NotFound, Evidence: json.RawMessage(`{rows:0}`)}, "evidence"},
		{"unknown without error", probes.Result{Verdict: probes.Unknown}, "without a reason"},
	}
	for _, tt := range tests {
		got := probes.Guard(returns(tt.res), time.Second).Probe(context.Background(), testKey)
		if got.Verdict != probes.Unknown || got.Err == nil || got.Outcome != nil {
			t.Errorf("%s: got %+v, want unknown with an error", tt.name, got)
			continue
		}
		if !strings.Contains(got.Err.Error(), tt.errHas) {
			t.Errorf("%s: err = %q, want it to mention %q", tt.name, got.Err, tt.errHas)
		}
	}
}

func TestGuardDropsOutcomeOfNonFound(t *testing.T) {
	t.Parallel()
	got := probes.Guard(returns(probes.Result{Verdict: probes.Duplicate, Outcome: &probes.Outcome{Code: 200, Body: json.RawMessage(`{}`)}}), 0).Probe(context.Background(), testKey)
	if got.Verdict != probes.Duplicate || got.Outcome != nil {
		t.Errorf("got %+v", got)
	}
}

func TestGuardTruncatesLargeEvidence(t *testing.T) {
	t.Parallel()
	big, _ := json.Marshal(map[string]string{"dump": strings.Repeat("x", probes.MaxEvidenceBytes)})
	got := probes.Guard(returns(probes.Result{Verdict: probes.NotFound, Evidence: big}), 0).Probe(context.Background(), testKey)
	if got.Verdict != probes.NotFound || len(got.Evidence) > 100 || !json.Valid(got.Evidence) {
		t.Errorf("got %+v", got)
	}
}

func TestGuardRecoversPanics(t *testing.T) {
	t.Parallel()
	sentinel := errors.New("nil map")
	for _, v := range []any{"oops", sentinel, 42, nil} {
		p := probes.ProbeFunc(func(context.Context, probes.Key) probes.Result { panic(v) })
		got := probes.Guard(p, time.Second).Probe(context.Background(), testKey)
		if got.Verdict != probes.Unknown || got.Err == nil || !strings.Contains(got.Err.Error(), "panicked") {
			t.Errorf("panic(%v): got %+v", v, got)
		}
		if v == sentinel && !errors.Is(got.Err, sentinel) { //nolint:errorlint // v is the panic value: was it this very error
			t.Errorf("panic(err): err %v does not wrap it", got.Err)
		}
	}
}

func TestGuardEnforcesDeadline(t *testing.T) {
	t.Parallel()
	release := make(chan struct{})
	t.Cleanup(func() { close(release) })
	started := make(chan struct{})
	// This probe ignores its context: only Guard can stop waiting for it.
	stubborn := probes.ProbeFunc(func(context.Context, probes.Key) probes.Result {
		close(started)
		<-release
		return probes.Result{Verdict: probes.NotFound}
	})
	start := time.Now()
	got := probe(t, probes.Guard(stubborn, 50*time.Millisecond))
	testwait.Recv(t, started, testwait.Timeout)
	if got.Verdict != probes.Unknown || !errors.Is(got.Err, context.DeadlineExceeded) {
		t.Fatalf("got %+v, want unknown wrapping DeadlineExceeded", got)
	}
	if !strings.Contains(got.Err.Error(), "50ms") {
		t.Errorf("err = %q, want it to name the deadline", got.Err)
	}
	if d := time.Since(start); d > 5*time.Second {
		t.Errorf("Guard returned after %s", d)
	}
}

// Whichever branch of Guard's select wins, a probe that reports absence
// when it was merely cut short is unknown. The rule itself is tested
// deterministically on run (TestGuardRunDistrustsVerdictsAfterTheContextEnded).
func TestGuardDistrustsLateVerdicts(t *testing.T) {
	t.Parallel()
	buggy := probes.ProbeFunc(func(ctx context.Context, _ probes.Key) probes.Result {
		<-ctx.Done() // Guard's deadline ends it; probe() bounds the wait
		return probes.Result{Verdict: probes.NotFound}
	})
	if got := probe(t, probes.Guard(buggy, time.Millisecond)); got.Verdict != probes.Unknown {
		t.Fatalf("got %+v", got)
	}
}

// probe runs p on testKey, failing the test if it has not returned within
// testwait.Timeout: a Guard that lost its deadline fails here, at once.
func probe(t *testing.T, p probes.Probe) probes.Result {
	t.Helper()
	res := make(chan probes.Result, 1)
	go func() { res <- p.Probe(context.Background(), testKey) }()
	return testwait.Recv(t, res, testwait.Timeout)
}

func TestGuardCallerCancelled(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	called := false
	p := probes.ProbeFunc(func(context.Context, probes.Key) probes.Result {
		called = true
		return probes.Result{Verdict: probes.NotFound}
	})
	got := probes.Guard(p, time.Second).Probe(ctx, testKey)
	if got.Verdict != probes.Unknown || !errors.Is(got.Err, context.Canceled) || called {
		t.Errorf("got %+v (called %v)", got, called)
	}
}

func TestGuardPassesTheKeyAndADeadline(t *testing.T) {
	t.Parallel()
	p := probes.ProbeFunc(func(ctx context.Context, k probes.Key) probes.Result {
		dl, ok := ctx.Deadline()
		if !ok || time.Until(dl) > time.Second {
			return probes.Result{Verdict: probes.Unknown, Err: fmt.Errorf("deadline %v %v", dl, ok)}
		}
		if k.Key != testKey.Key || k.Tool != testKey.Tool || string(k.RequestBody) != string(testKey.RequestBody) || !k.ClaimedAt.Equal(testKey.ClaimedAt) {
			return probes.Result{Verdict: probes.Unknown, Err: fmt.Errorf("key %+v", k)}
		}
		return probes.Result{Verdict: probes.NotFound}
	})
	if got := probes.Guard(p, time.Second).Probe(context.Background(), testKey); got.Verdict != probes.NotFound {
		t.Errorf("got %+v", got)
	}
}

func TestGuardNil(t *testing.T) {
	t.Parallel()
	defer func() {
		if recover() == nil {
			t.Error("Guard(nil) did not panic")
		}
	}()
	probes.Guard(nil, time.Second)
}

func TestVerdictValid(t *testing.T) {
	t.Parallel()
	for _, v := range []probes.Verdict{probes.Found, probes.NotFound, probes.Duplicate, probes.Unknown} {
		if !v.Valid() {
			t.Errorf("%q not valid", v)
		}
	}
	for _, v := range []probes.Verdict{"", "FOUND", "notfound", "found "} {
		if v.Valid() {
			t.Errorf("%q valid", v)
		}
	}
}

type closer struct {
	probes.ProbeFunc
	closed int
	err    error
}

func (c *closer) Close() error { c.closed++; return c.err }

func TestRegistry(t *testing.T) {
	t.Parallel()
	r := probes.NewRegistry()
	a := returns(probes.Result{Verdict: probes.NotFound})
	if err := r.Register("create_ticket", a); err != nil {
		t.Fatal(err)
	}
	err := r.Register("create_ticket", returns(probes.Result{Verdict: probes.Unknown}))
	if !errors.Is(err, probes.ErrAlreadyRegistered) || !strings.Contains(err.Error(), "create_ticket") {
		t.Errorf("duplicate registration: %v", err)
	}
	if got, ok := r.Lookup("create_ticket"); !ok || got.Probe(context.Background(), testKey).Verdict != probes.NotFound {
		t.Errorf("Lookup returned %v, %v: the first registration must stay", got, ok)
	}
	if _, ok := r.Lookup("charge_card"); ok {
		t.Error("Lookup of an unregistered tool succeeded")
	}
	if err := r.Register("", a); err == nil {
		t.Error("empty tool accepted")
	}
	if err := r.Register("x", nil); err == nil {
		t.Error("nil probe accepted")
	}

	c1 := &closer{ProbeFunc: a.Probe}
	c2 := &closer{ProbeFunc: a.Probe, err: errors.New("pool busy")}
	_ = r.Register("b_tool", c1)
	_ = r.Register("a_tool", c2)
	if got := r.Tools(); !slices.Equal(got, []string{"a_tool", "b_tool", "create_ticket"}) {
		t.Errorf("Tools() = %v", got)
	}
	err = r.Close()
	if c1.closed != 1 || c2.closed != 1 || err == nil || !strings.Contains(err.Error(), "a_tool") || !strings.Contains(err.Error(), "pool busy") {
		t.Errorf("Close: %v (closed %d, %d)", err, c1.closed, c2.closed)
	}
	var _ io.Closer = (*probes.HTTPProbe)(nil)
	var _ io.Closer = (*probes.SQLProbe)(nil)
}

func TestRegistriesAreIndependent(t *testing.T) {
	t.Parallel()
	a, b := probes.NewRegistry(), probes.NewRegistry()
	_ = a.Register("t", returns(probes.Result{Verdict: probes.NotFound}))
	if _, ok := b.Lookup("t"); ok {
		t.Error("registries share state")
	}
}

func TestRegistryConcurrent(t *testing.T) {
	t.Parallel()
	r := probes.NewRegistry()
	var wg sync.WaitGroup
	var mu sync.Mutex
	wins := 0
	for i := range 8 {
		wg.Go(func() {
			if r.Register("tool", returns(probes.Result{Verdict: probes.NotFound})) == nil {
				mu.Lock()
				wins++
				mu.Unlock()
			}
			_ = r.Register(fmt.Sprintf("tool-%d", i), returns(probes.Result{Verdict: probes.NotFound}))
			r.Lookup("tool")
			r.Tools()
		})
	}
	testwait.Wait(t, &wg, testwait.Timeout)
	if wins != 1 || len(r.Tools()) != 9 {
		t.Errorf("wins = %d, tools = %v", wins, r.Tools())
	}
}
