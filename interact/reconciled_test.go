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
	r.putKey(t, key, ledger.StatusProcessing, time.Hour)
	ts := r.alert(t, key)
	r.click(t, hAlice, ts, r.control(t, ts, alerts.ActionIDRetryable, key))
	view := slacktest.OpenedView(r.lastView(t))

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
