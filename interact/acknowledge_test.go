package interact

import (
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/slack-go/slack"

	"github.com/ledgerkeeper/ledgerkeeper/alerts"
	"github.com/ledgerkeeper/ledgerkeeper/internal/slacktest"
	"github.com/ledgerkeeper/ledgerkeeper/ledger"
	"github.com/ledgerkeeper/ledgerkeeper/ledger/ledgertest/testwait"
	"github.com/ledgerkeeper/ledgerkeeper/store"
)

// slowSlack is how long the stand-in Slack takes to answer every call in
// these tests: half of the 3 s Slack waits for an acknowledgement, so an
// acknowledgement that waited on even one Slack call would take longer.
const slowSlack = 1500 * time.Millisecond

// ackDeadline is how long Slack waits for an acknowledgement.
// https://docs.slack.dev/tools/bolt-js/concepts/acknowledge
const ackDeadline = 3 * time.Second

// transport delivers one interaction as Slack does and returns the
// acknowledgement's body (nil when empty) and how long it took to come
// back, from the moment the interaction was sent.
type transport func(t *testing.T, cb slack.InteractionCallback) (map[string]any, time.Duration)

// overHTTP posts cb to the rig's /slack/interactions, signed.
func overHTTP(r *rig) transport {
	return func(t *testing.T, cb slack.InteractionCallback) (map[string]any, time.Duration) {
		t.Helper()
		req := slacktest.SignedRequest(t, r.http.URL, hSecret, time.Now(), slacktest.Body(t, cb))
		start := time.Now()
		resp, err := r.http.Client().Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		body, _ := io.ReadAll(resp.Body)
		took := time.Since(start)
		if resp.StatusCode != http.StatusOK {
			t.Fatalf("HTTP %d %s", resp.StatusCode, body)
		}
		return decodeAck(t, body), took
	}
}

// overSocketMode delivers cb in an envelope on a Socket Mode connection of
// the rig's Handler; the time is the acknowledgement's arrival at Slack.
func overSocketMode(t *testing.T, r *rig) transport {
	t.Helper()
	sock := r.srv.SocketMode(t, smAppToken)
	sm, err := NewSocketMode(r.h, SocketModeConfig{AppToken: smAppToken, APIURL: r.srv.APIURL(), Logger: slog.New(slog.NewTextHandler(r.logs, nil))})
	if err != nil {
		t.Fatal(err)
	}
	if err := sm.Start(bg); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(sm.Stop) // before the Handler's Stop
	conn := sock.WaitConns(t, 1, testwait.Timeout)[0]
	n := 0
	return func(t *testing.T, cb slack.InteractionCallback) (map[string]any, time.Duration) {
		t.Helper()
		n++
		env := fmt.Sprintf("env-%d", n)
		start := time.Now()
		sock.Deliver(t, conn, env, cb)
		ack := sock.WaitAcks(t, env, 1, testwait.Timeout)[0]
		return decodeAck(t, ack.Payload), ack.At.Sub(start)
	}
}

func decodeAck(t *testing.T, body []byte) map[string]any {
	t.Helper()
	if s := strings.TrimSpace(string(body)); s == "" || s == "null" {
		return nil
	}
	var ack map[string]any
	if err := json.Unmarshal(body, &ack); err != nil {
		t.Fatalf("acknowledgement is not JSON: %v: %s", err, body)
	}
	return ack
}

// Every kind of interaction, over HTTP and over Socket Mode, is
// acknowledged within Slack's 3 s while the stand-in Slack takes 1.5 s to
// answer any call: faster than one Slack call, so nothing before the
// acknowledgement waits on Slack. The acknowledgement comes after the
// decision is in the ledger (the hold, the release, the resolve and their
// audit rows are there when it arrives: asserted without waiting); the
// follow-ups arrive after it (answers, the alert's update: polled), and a
// form opens within 3 s of its click, as its trigger_id requires.
func TestEveryInteractionIsAcknowledgedWhileSlackIsSlow(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name string
		via  func(t *testing.T, r *rig) transport
	}{
		{"http", func(_ *testing.T, r *rig) transport { return overHTTP(r) }},
		{"socket mode", overSocketMode},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			r := newRig(t)
			const k1, k2 = "wf-ack:step-1", "wf-ack:step-2"
			r.putKey(t, k1, ledger.StatusProcessing, time.Hour)
			r.putKey(t, k2, ledger.StatusProcessing, time.Hour)
			ts1, ts2 := r.alert(t, k1), r.alert(t, k2)
			send := tc.via(t, r)
			r.srv.SetLatency(slowSlack)

			var slowest time.Duration
			// step sends cb and checks its acknowledgement's latency.
			step := func(what string, cb slack.InteractionCallback) (map[string]any, time.Time) {
				t.Helper()
				sent := time.Now()
				ack, took := send(t, cb)
				t.Logf("%s: %-32s acknowledged in %s", tc.name, what, took.Round(time.Millisecond))
				slowest = max(slowest, took)
				if took >= ackDeadline {
					t.Errorf("%s: acknowledged in %s, past Slack's %s", what, took, ackDeadline)
				}
				if took >= slowSlack {
					t.Errorf("%s: acknowledged in %s, no sooner than one Slack call (%s): the acknowledgement waited on Slack", what, took, slowSlack)
				}
				return ack, sent
			}
			click := func(user, ts, actionID, key string) slack.InteractionCallback {
				return r.srv.BlockActions(t, user, hChannel, ts, r.control(t, ts, actionID, key))
			}
			replied := func(what, text string) {
				t.Helper()
				testwait.Eventually(t, func() bool {
					for _, c := range r.srv.Calls("response_url") {
						if c.JSON["response_type"] == "ephemeral" && strings.Contains(c.Field("text")+c.Field("blocks"), text) {
							return true
						}
					}
					return false
				}, testwait.Timeout, what+": an answer saying "+text)
			}
			updated := func(what, ts, line string) {
				t.Helper()
				testwait.Eventually(t, func() bool {
					m, _ := r.srv.Message(hChannel, ts)
					return strings.Contains(string(m.Blocks), line)
				}, testwait.Timeout, what+": the alert updated with "+line)
			}
			opened := func(what string, n int, clicked time.Time) slacktest.Call {
				t.Helper()
				views := r.srv.WaitCalls(t, "views.open", n, testwait.Timeout)
				v := views[n-1]
				if late := v.At.Sub(clicked); late >= TriggerTTL {
					t.Errorf("%s: views.open reached Slack %s after the click, past the trigger's %s", what, late, TriggerTTL)
				}
				return v
			}
			audits := func(key, action string) int {
				return r.db.Count(t, "reconcile_audit WHERE key = $1 AND action = $2", key, action)
			}

			step("click inspect", click(hBob, ts1, alerts.ActionIDInspect, k1))
			replied("inspect", "*Last decisions*")

			step("click refused (lacks hold)", click(hBob, ts1, alerts.ActionIDHold, k1))
			eq(t, "refusal audited before the ack", audits(k1, ActionSlackRefused), 1)
			replied("refusal", "you may inspect, and hold is not among your actions")

			_, at := step("click hold (opens a form)", click(hAlice, ts1, alerts.ActionIDHold, k1))
			form := opened("hold", 1, at)
			if ack, _ := step("submit hold", slacktest.ViewSubmission(t, form, hAlice, vals(inReason, "checking the ticket system"))); ack != nil {
				t.Errorf("hold submission ack = %v, want empty (the form closes)", ack)
			}
			eq(t, "hold written before the ack", r.state(t, k1).Held, true)
			eq(t, "hold audited before the ack", audits(k1, "hold"), 1)
			updated("hold", ts1, "alice put `"+k1+"` on hold")
			replied("hold", "is on hold")

			step("click release", click(hAlice, ts1, alerts.ActionIDRelease, k1))
			eq(t, "release written before the ack", r.state(t, k1).Held, false)
			eq(t, "release audited before the ack", audits(k1, "release"), 1)
			updated("release", ts1, "alice released `"+k1+"`")

			_, at = step("click mark retryable (form)", click(hAlice, ts1, alerts.ActionIDRetryable, k1))
			form = opened("mark retryable", 2, at)
			ack, _ := step("submit with a missing reason", slacktest.ViewSubmission(t, form, hAlice, vals(inReason, " ")))
			if errs, _ := ack["errors"].(map[string]any); ack["response_action"] != "errors" || errs[inReason] == nil {
				t.Errorf("incomplete form ack = %v, want the reason's error", ack)
			}
			step("submit mark retryable", slacktest.ViewSubmission(t, form, hAlice, vals(inReason, "no ticket downstream")))
			eq(t, "status written before the ack", r.key(t, k1).Status, ledger.StatusFailedRetryable)
			eq(t, "decision audited before the ack", audits(k1, store.ActionOperatorMarkedRetryable), 1)
			updated("mark retryable", ts1, "alice marked `"+k1+"` retryable")

			_, at = step("click store outcome (form)", click(hAlice, ts2, alerts.ActionIDStoreOutcome, k2))
			form = opened("store outcome", 3, at)
			ack, _ = step("submit outcome (review pushed)", slacktest.ViewSubmission(t, form, hAlice, vals(inCode, "201", inBody, `{"id":"T-9"}`, inReason, "ticket T-9 exists")))
			if ack["response_action"] != "push" {
				t.Fatalf("outcome ack = %v, want the pushed confirmation", ack)
			}
			ack, _ = step("submit confirmation", slacktest.ViewSubmission(t, ack["view"], hAlice, nil))
			if ack["response_action"] != "clear" {
				t.Errorf("confirmation ack = %v, want clear", ack)
			}
			eq(t, "outcome written before the ack", r.key(t, k2).Status, ledger.StatusCompleted)
			updated("store outcome", ts2, "alice stored the outcome of `"+k2+"` (HTTP 201)")

			step("pick a key", r.srv.BlockActions(t, hAlice, hChannel, ts2, slack.BlockAction{ActionID: alerts.ActionIDPick, Type: "static_select", SelectedOption: slack.OptionBlockObject{Value: k2}}))
			replied("pick", "Actions on `"+k2+"`")

			t.Logf("%s: slowest acknowledgement %s with Slack answering in %s", tc.name, slowest.Round(time.Millisecond), slowSlack)
			// Everything the follow-ups sent went through once: no answer
			// or update was lost to the slow Slack.
			settle(t, r.h)
			for _, line := range []string{"put `" + k1 + "` on hold", "released `" + k1 + "`", "marked `" + k1 + "` retryable"} {
				if m, _ := r.srv.Message(hChannel, ts1); strings.Count(string(m.Blocks), line) != 1 {
					t.Errorf("alert line %q appears %d times: %s", line, strings.Count(string(m.Blocks), line), m.Blocks)
				}
			}
			if strings.Contains(r.logs.String(), "follow-up failed") {
				t.Errorf("a follow-up failed against a slow Slack:\n%s", r.logs.String())
			}
		})
	}
}

// The acknowledgement follows the decision's write: while the release
// cannot be written (the test holds the hold's row lock), no
// acknowledgement comes; once it can, the acknowledgement comes with the
// release written and audited. So Slack's 200 means "done or refused",
// never "will be done".
func TestAcknowledgementFollowsTheWrite(t *testing.T) {
	t.Parallel()
	r := newRig(t)
	const key = "wf-ack:step-3"
	r.putKey(t, key, ledger.StatusProcessing, time.Hour)
	r.hold(t, key, "x")
	ts := r.alert(t, key)
	cb := r.srv.BlockActions(t, hAlice, hChannel, ts, r.control(t, ts, alerts.ActionIDRelease, key))

	tx, err := r.db.Pool.Begin(bg)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = tx.Rollback(bg) }()
	if _, err := tx.Exec(bg, `SELECT 1 FROM key_holds WHERE key = $1 FOR UPDATE`, key); err != nil {
		t.Fatal(err)
	}
	acked := make(chan int, 1)
	req := slacktest.SignedRequest(t, r.http.URL, hSecret, time.Now(), slacktest.Body(t, cb))
	go func() {
		resp, err := r.http.Client().Do(req)
		if err != nil {
			acked <- 0
			return
		}
		resp.Body.Close()
		acked <- resp.StatusCode
	}()
	// Until the release waits on the lock (or, wrongly, is acknowledged).
	testwait.Eventually(t, func() bool {
		return len(acked) > 0 || r.db.Count(t, "pg_stat_activity WHERE datname = current_database() AND wait_event_type = 'Lock'") > 0
	}, testwait.Timeout, "the release to wait on the hold's row lock")
	select {
	case code := <-acked:
		t.Fatalf("acknowledged (HTTP %d) while the release could not be written", code)
	case <-time.After(300 * time.Millisecond): // a bounded check that nothing comes
	}
	if err := tx.Rollback(bg); err != nil {
		t.Fatal(err)
	}
	eq(t, "ack", testwait.Recv(t, acked, testwait.Timeout), http.StatusOK)
	eq(t, "released when acknowledged", r.state(t, key).Held, false)
	eq(t, "audited when acknowledged", r.db.Count(t, "reconcile_audit WHERE key = $1 AND action = 'release'", key), 1)
	settle(t, r.h)
}
