package mcpkey_test

import (
	"context"
	"encoding/json"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/jsonrpc"

	"github.com/ledgerkeeper/ledgerkeeper/ledger"
	"github.com/ledgerkeeper/ledgerkeeper/ledger/mcpkey"
	"github.com/ledgerkeeper/ledgerkeeper/probes"
	"github.com/ledgerkeeper/ledgerkeeper/reconcile"
)

// The whole crash story with the real reconciler: the handler performs its
// effect at the sink and crashes, so the key stays processing; once the key
// is past its window a reconcile pass probes the sink, finds the effect and
// stores its outcome; the client's retry with the same key, over the
// streamable HTTP transport, gets that outcome as a replay, and the sink
// still counts exactly one effect.
func TestCrashAfterEffectReconciledThenReplayed(t *testing.T) {
	b := setup(t, &sink{afterEffect: func() { panic("crash after the effect") }})
	cs := b.connect(t, "")
	_, err := call(cs, "create_ticket", "k-x", args)
	wantCode(t, err, jsonrpc.CodeInternalError, "crashing handler")
	if k := row(t, b.db, "k-x"); k.Status != ledger.StatusProcessing {
		t.Fatalf("after the crash: status %s, want processing", k.Status)
	}

	// Age the key well past its window (1s + the default grace).
	if _, err := b.db.Pool.Exec(context.Background(),
		`UPDATE idempotency_keys SET claimed_at = now() - interval '10 minutes',
		 created_at = now() - interval '10 minutes' WHERE key = $1`, "k-x"); err != nil {
		t.Fatalf("age the key: %v", err)
	}

	// The tool's probe looks the key up at the sink, as an http or sql probe
	// would at the real downstream.
	probe := probes.ProbeFunc(func(_ context.Context, k probes.Key) probes.Result {
		n := b.sink.of(k.Key)
		if n == 0 {
			return probes.Result{Verdict: probes.NotFound, Evidence: json.RawMessage(`{"effects":0}`)}
		}
		body, err := json.Marshal(map[string]any{"ticket": n, "key": k.Key})
		if err != nil {
			return probes.Result{Verdict: probes.Unknown, Err: err}
		}
		return probes.Result{Verdict: probes.Found, Outcome: &probes.Outcome{Code: 200, Body: body},
			Evidence: json.RawMessage(`{"effects":1}`)}
	})
	eng := reconcile.New(reconcile.Config{
		Actor: "mcpkey-test",
		Tools: map[string]reconcile.Policy{"tickets": {
			ProcessingWindow:  time.Second,
			Probe:             probe,
			SelfCheckDisabled: true,
		}},
	}, b.db.Pool, nil, nil)
	rep, err := eng.Run(context.Background(), reconcile.Options{})
	if err != nil {
		t.Fatalf("reconcile pass: %v", err)
	}
	if rep.Actions[reconcile.ActionCompleted] != 1 {
		t.Fatalf("reconcile actions = %v, want one %s", rep.Actions, reconcile.ActionCompleted)
	}
	k := row(t, b.db, "k-x")
	if k.Status != ledger.StatusCompleted || k.ResponseCode == nil || *k.ResponseCode != 200 {
		t.Fatalf("after reconcile: status %s code %v, want completed 200", k.Status, k.ResponseCode)
	}

	res := mustCall(t, cs, "k-x", args)
	sc, _ := res.StructuredContent.(map[string]any)
	if res.IsError || res.Meta[mcpkey.MetaReplay] != true || sc["ticket"] != float64(1) || sc["key"] != "k-x" {
		t.Fatalf("retry: want the reconciled outcome replayed, got %+v", res)
	}
	if got := b.sink.of("k-x"); got != 1 {
		t.Fatalf("effects = %d, want 1", got)
	}
}
