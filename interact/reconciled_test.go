package interact

import (
	"context"
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/ledgerkeeper/ledgerkeeper/alerts"
	"github.com/ledgerkeeper/ledgerkeeper/internal/slacktest"
	"github.com/ledgerkeeper/ledgerkeeper/ledger"
	"github.com/ledgerkeeper/ledgerkeeper/probes"
	"github.com/ledgerkeeper/ledgerkeeper/reconcile"
)

// The reconciler decides the key between the alert and the operator's
// submission: a real pass (its probe finds the effect) completes it with
// the downstream's outcome, and the Slack action that follows is refused
// and writes nothing, not even an operator audit row.
func TestKeyDecidedByTheReconcilerAfterTheAlertIsRefused(t *testing.T) {
	t.Parallel()
	r := newRig(t)
	const key = "wf-9:step-1"
	view := slacktest.OpenedView(r.openForm(t, key, alerts.ActionIDRetryable))

	found := probes.ProbeFunc(func(_ context.Context, _ probes.Key) probes.Result {
		return probes.Result{Verdict: probes.Found, Outcome: &probes.Outcome{Code: 201, Body: json.RawMessage(`{"ticket":"T-77"}`)},
			Evidence: json.RawMessage(`{"tickets":1}`)}
	})
	eng := reconcile.New(reconcile.Config{Actor: "test-replica", Tools: map[string]reconcile.Policy{
		hTool: {ProcessingWindow: time.Second, Probe: found, SelfCheckDisabled: true},
	}}, r.db.Pool, nil, nil)
	rep, err := eng.Run(bg, reconcile.Options{})
	if err != nil {
		t.Fatal(err)
	}
	eq(t, "keys the pass completed", rep.Actions[reconcile.ActionCompleted], 1)
	before, audit := r.state(t, key), r.db.Count(t, "reconcile_audit WHERE key = $1", key)

	r.submit(t, hAlice, view, vals(inReason, "never happened"))
	if reply := r.lastReply(t); !strings.Contains(reply, "Refused") || !strings.Contains(reply, "completed") {
		t.Errorf("submission answer = %s", reply)
	}
	eq(t, "key state", r.state(t, key), before)
	eq(t, "audit rows", r.db.Count(t, "reconcile_audit WHERE key = $1", key), audit)
	eq(t, "operator audit rows", r.db.Count(t, "reconcile_audit WHERE key = $1 AND actor LIKE 'slack:%'", key), 0)
	k := r.key(t, key)
	if k.Status != ledger.StatusCompleted || k.ResponseCode == nil || *k.ResponseCode != 201 || !strings.Contains(string(k.ResponseBody), "T-77") {
		t.Errorf("after the refused action: status %s code %v body %s, want the reconciler's outcome", k.Status, k.ResponseCode, k.ResponseBody)
	}
}

// A form judges the attempt it was opened on. The key goes
// failed_retryable and a retry re-claims it while the form is open, then
// that attempt gets stuck too: the submission is refused and writes
// nothing, because the operator's check downstream was about the earlier
// attempt, and marking the new one retryable could redo an effect it had.
func TestReclaimedWhileTheFormIsOpenIsRefused(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name    string
		control string
		submit  func(t *testing.T, r *rig, view any)
	}{
		{"mark retryable", alerts.ActionIDRetryable, func(t *testing.T, r *rig, view any) {
			r.submit(t, hAlice, view, vals(inReason, "checked downstream: never happened"))
		}},
		{"store outcome", alerts.ActionIDStoreOutcome, func(t *testing.T, r *rig, view any) {
			ack := r.submit(t, hAlice, view, vals(inCode, "201", inBody, `{"id":"T-1"}`, inReason, "checked downstream: it happened"))
			if ack["response_action"] != "push" {
				t.Fatalf("outcome ack = %v, want the confirmation", ack)
			}
			r.submit(t, hAlice, ack["view"], nil)
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			r := newRig(t)
			const key = "wf-10:step-1"
			v := r.openForm(t, key, tc.control)
			if !strings.Contains(string(v.Raw), "attempt claimed at") {
				t.Errorf("the form does not name the attempt it judges: %s", v.Raw)
			}
			view := slacktest.OpenedView(v)

			// Meanwhile: the attempt is abandoned, a retry re-claims the key
			// (same request) and gets stuck past its window as well.
			first := r.key(t, key)
			if err := ledger.Abandon(bg, r.db.Pool, key, first.ClaimedAt); err != nil {
				t.Fatal(err)
			}
			res, err := ledger.Claim(bg, r.db.Pool, ledger.ClaimParams{Key: key, Tool: hTool, RequestHash: first.RequestHash})
			if err != nil || res.Outcome != ledger.New {
				t.Fatalf("re-claim: %v %v", res.Outcome, err)
			}
			r.db.Exec(t, `UPDATE idempotency_keys SET claimed_at = now() - interval '2 hours' WHERE key = $1`, key)
			before, audit := r.state(t, key), r.db.Count(t, "reconcile_audit WHERE key = $1", key)

			tc.submit(t, r, view)
			if reply := r.lastReply(t); !strings.Contains(reply, "Refused") || !strings.Contains(reply, "claimed again") {
				t.Errorf("submission answer = %s, want a refusal saying the key was claimed again", reply)
			}
			eq(t, "key state", r.state(t, key), before)
			eq(t, "audit rows", r.db.Count(t, "reconcile_audit WHERE key = $1", key), audit)
			if k := r.key(t, key); k.Status != ledger.StatusProcessing || k.ResponseCode != nil {
				t.Errorf("after the refused submission: status %s code %v, want processing with no outcome", k.Status, k.ResponseCode)
			}
		})
	}
}

// openForm puts key stuck in processing for an hour, alerts on it, and
// has alice click control on the alert: the form it opens.
func (r *rig) openForm(t *testing.T, key, control string) slacktest.Call {
	t.Helper()
	r.putKey(t, key, ledger.StatusProcessing, time.Hour)
	ts := r.alert(t, key)
	r.click(t, hAlice, ts, r.control(t, ts, control, key))
	return r.lastView(t)
}
