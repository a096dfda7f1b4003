package ledger_test

import (
	"context"
	"encoding/json"
	"net/http"
	"strconv"
	"sync/atomic"
	"testing"

	"github.com/ledgerkeeper/ledgerkeeper/ledger"
	"github.com/ledgerkeeper/ledgerkeeper/ledger/ledgertest"
)

// runCall is a call of create_ticket with request req (canonical here).
func runCall(key, req string) ledger.Call {
	return ledger.Call{Key: key, Tool: "create_ticket", Request: json.RawMessage(req)}
}

// Run with no transport around it: the handler runs once, with the attempt
// in its context; its definitive response is stored, and the next call with
// the key gets it back as a replay without running the handler; the key
// with other arguments runs nothing.
func TestRunStoresADefinitiveResponseAndReplaysIt(t *testing.T) {
	t.Parallel()
	db := ledgertest.New(t)
	var runs atomic.Int32
	handler := func(ctx context.Context) ledger.Response {
		runs.Add(1)
		a, ok := ledger.AttemptFromContext(ctx)
		if !ok || a.Key != "k" || a.Tool != "create_ticket" || a.ClaimedAt.IsZero() {
			t.Errorf("attempt in the handler's context = %+v, %v", a, ok)
		}
		return ledger.Response{Code: http.StatusCreated, Body: json.RawMessage(`{"ticket":"T-1"}`)}
	}
	first, err := ledger.Run(context.Background(), db.Pool, runCall("k", `{"title":"x"}`), handler)
	if err != nil {
		t.Fatal(err)
	}
	if first.Claim != ledger.New || !first.Stored || first.Response.Code != http.StatusCreated {
		t.Fatalf("first = %+v, want New, stored, 201", first)
	}
	second, err := ledger.Run(context.Background(), db.Pool, runCall("k", `{"title":"x"}`), handler)
	if err != nil {
		t.Fatal(err)
	}
	if second.Claim != ledger.Replay || second.Stored || second.Response.Code != http.StatusCreated ||
		string(second.Response.Body) != `{"ticket": "T-1"}` {
		t.Fatalf("second = %+v (body %s), want the stored 201 replayed", second, second.Response.Body)
	}
	other, err := ledger.Run(context.Background(), db.Pool, runCall("k", `{"title":"y"}`), handler)
	if err != nil {
		t.Fatal(err)
	}
	if other.Claim != ledger.FingerprintMismatch {
		t.Fatalf("other arguments = %+v, want FingerprintMismatch", other)
	}
	if n := runs.Load(); n != 1 {
		t.Fatalf("handler ran %d times, want 1", n)
	}
}

// A response the rule does not store (here a 429) leaves the key processing
// with no outcome, exactly as a 5xx does: the next call with the key is
// told it is in flight, and the handler does not run again.
func TestRunLeavesTheKeyProcessingAfterATooManyRequests(t *testing.T) {
	t.Parallel()
	db := ledgertest.New(t)
	var runs atomic.Int32
	handler := func(context.Context) ledger.Response {
		runs.Add(1)
		return ledger.Response{Code: http.StatusTooManyRequests, Body: json.RawMessage(`{"error":"slow down"}`)}
	}
	first, err := ledger.Run(context.Background(), db.Pool, runCall("k", `{}`), handler)
	if err != nil {
		t.Fatal(err)
	}
	if first.Claim != ledger.New || first.Stored || first.Response.Code != http.StatusTooManyRequests {
		t.Fatalf("first = %v stored=%v code %d, want New, not stored, the handler's 429", first.Claim, first.Stored, first.Response.Code)
	}
	k, err := ledger.Get(context.Background(), db.Pool, "k")
	if err != nil {
		t.Fatal(err)
	}
	if k.Status != ledger.StatusProcessing || k.ResponseCode != nil || k.ResponseBody != nil {
		t.Fatalf("row = %s %v %s, want processing without outcome", k.Status, k.ResponseCode, k.ResponseBody)
	}
	retry, err := ledger.Run(context.Background(), db.Pool, runCall("k", `{}`), handler)
	if err != nil {
		t.Fatal(err)
	}
	if retry.Claim != ledger.InFlight || runs.Load() != 1 {
		t.Fatalf("retry = %+v after %d runs, want InFlight after 1", retry, runs.Load())
	}
}

// Through the HTTP middleware, a tool's 408, 425 or 429 reaches the client
// as it is, but is not stored: the key stays processing for the reconciler
// and the retry gets 409, never the "try again later" replayed forever.
func TestMiddlewareNeverReplaysATryAgainLater(t *testing.T) {
	t.Parallel()
	for _, code := range []int{http.StatusRequestTimeout, http.StatusTooEarly, http.StatusTooManyRequests} {
		t.Run(strconv.Itoa(code), func(t *testing.T) {
			t.Parallel()
			b := mwSetup(t, &mwTool{code: code}, ledger.MiddlewareConfig{})
			first := b.mustCall(t, "later", mwBody)
			if first.code != code || first.env.IdempotentReplay || first.env.OK {
				t.Fatalf("first = %d %s, want the tool's %d, not a replay", first.code, first.raw, code)
			}
			k, err := ledger.Get(context.Background(), b.db.Pool, "later")
			if err != nil {
				t.Fatal(err)
			}
			if k.Status != ledger.StatusProcessing || k.ResponseCode != nil {
				t.Fatalf("row = %s %s, want processing without outcome", k.Status, k.ResponseBody)
			}
			wantProblem(t, "retry", b.mustCall(t, "later", mwBody), http.StatusConflict, ledger.ProblemKeyInFlight)
			if n := b.tool.effectsOf("later"); n != 1 {
				t.Fatalf("effects = %d, want 1", n)
			}
		})
	}
}
