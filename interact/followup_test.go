package interact

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/slack-go/slack"

	"github.com/ledgerkeeper/ledgerkeeper/alerts"
	"github.com/ledgerkeeper/ledgerkeeper/internal/slacktest"
	"github.com/ledgerkeeper/ledgerkeeper/ledger"
	"github.com/ledgerkeeper/ledgerkeeper/ledger/ledgertest/testwait"
)

// fastRetries makes follow-ups retry at once, three attempts at most.
func fastRetries(c *Config) {
	c.FollowUpAttempts = 3
	c.FollowUpBackoffBase = 5 * time.Millisecond
	c.FollowUpBackoffMax = 20 * time.Millisecond
}

// logLines are the lines of the rig's log containing every one of parts.
func (r *rig) logLines(parts ...string) []string {
	var out []string
	for _, l := range strings.Split(r.logs.String(), "\n") {
		all := l != ""
		for _, p := range parts {
			all = all && strings.Contains(l, p)
		}
		if all {
			out = append(out, l)
		}
	}
	return out
}

// A follow-up Slack fails with a 503 is retried with back-off until it
// goes through, each failed attempt logged (redacted: no token, no
// response_url); the acknowledgement never waited for any of it.
func TestFollowUpFailuresAreRetriedAndLogged(t *testing.T) {
	t.Parallel()
	r := newRig(t, fastRetries)
	const key = "wf-fu:step-1"
	r.putKey(t, key, ledger.StatusProcessing, time.Hour)
	r.hold(t, key, "x")
	ts := r.alert(t, key)
	// The alert's update fails twice; the answer fails once both ways
	// (response_url, then chat.postEphemeral).
	r.srv.FailNext("chat.update", 2)
	r.srv.FailNext("response_url", 1)
	r.srv.FailNext("chat.postEphemeral", 1)
	r.click(t, hAlice, ts, r.control(t, ts, alerts.ActionIDRelease, key))

	m, _ := r.srv.Message(hChannel, ts)
	if !strings.Contains(string(m.Blocks), "alice released `"+key+"`") {
		t.Errorf("alert not updated after the retries: %s", m.Blocks)
	}
	eq(t, "chat.update calls (2 failed, 1 through)", len(r.srv.Calls("chat.update")), 3)
	if reply := r.lastReply(t); !strings.Contains(reply, "Released") {
		t.Errorf("answer after the retry = %s", reply)
	}
	eq(t, "alert update retries logged", len(r.logLines("slack follow-up failed; retrying", `follow_up="alert update"`, "503")), 2)
	eq(t, "answer retries logged", len(r.logLines("slack follow-up failed; retrying", "follow_up=reply", "503")), 1)
	eq(t, "alert update sent after retrying", len(r.logLines("slack follow-up sent after retrying", `follow_up="alert update"`, "attempts=3")), 1)
	eq(t, "answer sent after retrying", len(r.logLines("slack follow-up sent after retrying", "follow_up=reply", "attempts=2")), 1)
	eq(t, "release audit rows", r.db.Count(t, "reconcile_audit WHERE key = $1 AND action = 'release'", key), 1)
	if logs := r.logs.String(); strings.Contains(logs, "/response/") {
		t.Errorf("a response_url was logged:\n%s", logs)
	}
}

// A follow-up that keeps failing is given up after its attempts, logged
// at error; one Slack refuses for good (expired_trigger_id) is not
// retried, and the user is told the form did not open.
func TestFollowUpsGiveUpAndSaySo(t *testing.T) {
	t.Parallel()
	r := newRig(t, fastRetries)
	const key = "wf-fu:step-2"
	r.putKey(t, key, ledger.StatusProcessing, time.Hour)
	r.hold(t, key, "x")
	ts := r.alert(t, key)

	r.srv.FailNext("chat.update", 100)
	r.click(t, hAlice, ts, r.control(t, ts, alerts.ActionIDRelease, key))
	eq(t, "chat.update attempts", len(r.srv.Calls("chat.update")), 3)
	eq(t, "given up, logged", len(r.logLines("level=ERROR", "slack follow-up failed; given up", `follow_up="alert update"`, "attempts=3")), 1)
	eq(t, "the release stands", r.state(t, key).Held, false)

	r.srv.Fail("views.open", "expired_trigger_id")
	// The message was never updated (chat.update gave up): it still
	// offers Release; the Hold comes from the key picker's answer.
	r.click(t, hAlice, ts, button(alerts.ActionIDHold, key))
	eq(t, "views.open attempts (a refusal is not retried)", len(r.srv.Calls("views.open")), 1)
	eq(t, "given up, logged", len(r.logLines("slack follow-up failed; given up", "follow_up=views.open", "attempts=1", "expired_trigger_id")), 1)
	if reply := r.lastReply(t); !strings.Contains(reply, "Slack would not open the form") {
		t.Errorf("answer = %s, want that the form did not open", reply)
	}
}

// A form is retried only while its trigger lives (TriggerTTL after the
// click): a Slack answering 503 for longer than that gets no call after
// the trigger expired.
func TestFormIsNotRetriedPastItsTrigger(t *testing.T) {
	t.Parallel()
	r := newRig(t, func(c *Config) {
		c.FollowUpAttempts = 100
		c.FollowUpBackoffBase = 200 * time.Millisecond
		c.FollowUpBackoffMax = time.Second
	})
	const key = "wf-fu:step-3"
	r.putKey(t, key, ledger.StatusProcessing, time.Hour)
	ts := r.alert(t, key)
	r.srv.FailNext("views.open", 1000)
	clicked := time.Now()
	r.click(t, hAlice, ts, r.control(t, ts, alerts.ActionIDHold, key))
	calls := r.srv.Calls("views.open")
	if len(calls) < 2 {
		t.Errorf("views.open tried %d times, want retries within the trigger's life", len(calls))
	}
	for _, c := range calls {
		if late := c.At.Sub(clicked); late >= TriggerTTL {
			t.Errorf("views.open sent %s after the click, past the trigger's %s", late, TriggerTTL)
		}
	}
	if reply := r.lastReply(t); !strings.Contains(reply, "Slack would not open the form") {
		t.Errorf("answer = %s, want that the form did not open", reply)
	}
}

// Stop sends the follow-ups of the interactions already acknowledged
// (answers and updates are not lost at shutdown), then refuses new
// interactions with 503 before anything is written.
func TestStopSendsWhatIsInHandThenRefuses(t *testing.T) {
	t.Parallel()
	r := newRig(t)
	const key = "wf-fu:step-4"
	r.putKey(t, key, ledger.StatusProcessing, time.Hour)
	r.hold(t, key, "x")
	ts := r.alert(t, key)
	r.srv.SetLatency(300 * time.Millisecond)
	cb := r.srv.BlockActions(t, hAlice, hChannel, ts, r.control(t, ts, alerts.ActionIDRelease, key))
	req := slacktest.SignedRequest(t, r.http.URL, hSecret, time.Now(), slacktest.Body(t, cb))
	resp, err := r.http.Client().Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	eq(t, "release ack", resp.StatusCode, http.StatusOK)
	r.h.Stop() // no Settle: Stop itself waits for what is in hand
	m, _ := r.srv.Message(hChannel, ts)
	if !strings.Contains(string(m.Blocks), "alice released `"+key+"`") {
		t.Errorf("alert not updated by the time Stop returned: %s", m.Blocks)
	}
	eq(t, "answers sent", len(r.srv.Calls("response_url")), 1)

	audit := r.db.Count(t, "reconcile_audit WHERE key = $1", key)
	r.hold(t, key, "again") // by hand: the message still offers Hold
	cb = r.srv.BlockActions(t, hAlice, hChannel, ts, button(alerts.ActionIDRelease, key))
	req = slacktest.SignedRequest(t, r.http.URL, hSecret, time.Now(), slacktest.Body(t, cb))
	resp, err = r.http.Client().Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	eq(t, "after Stop: status", resp.StatusCode, http.StatusServiceUnavailable)
	eq(t, "after Stop: still held", r.state(t, key).Held, true)
	eq(t, "after Stop: audit rows (the hold only)", r.db.Count(t, "reconcile_audit WHERE key = $1", key), audit+1)
	eq(t, "after Stop: seen-set rows", r.db.Count(t, "slack_seen WHERE id LIKE 'act:%'"), 1)
	if _, err := r.h.Handle(bg, cb); !errors.Is(err, ErrStopped) {
		t.Errorf("Handle after Stop: %v, want ErrStopped", err)
	}
	r.h.Stop() // twice is fine
}

// A follow-up still failing when Stop's grace runs out is cancelled and
// logged; Stop returns within the grace plus one attempt's end.
func TestStopCancelsFollowUpsPastItsGrace(t *testing.T) {
	t.Parallel()
	r := newRig(t, func(c *Config) {
		c.StopGrace = 100 * time.Millisecond
		c.FollowUpBackoffBase, c.FollowUpBackoffMax = time.Minute, time.Minute
	})
	const key = "wf-fu:step-5"
	r.putKey(t, key, ledger.StatusProcessing, time.Hour)
	r.hold(t, key, "x")
	ts := r.alert(t, key)
	r.srv.FailNext("chat.update", 1) // then a minute's back-off
	cb := r.srv.BlockActions(t, hAlice, hChannel, ts, r.control(t, ts, alerts.ActionIDRelease, key))
	if _, err := r.h.Handle(bg, cb); err != nil {
		t.Fatal(err)
	}
	testwait.Eventually(t, func() bool {
		return len(r.logLines("slack follow-up failed; retrying", `follow_up="alert update"`)) == 1
	}, testwait.Timeout, "the update's first failure")
	stopped := make(chan time.Duration)
	go func() {
		start := time.Now()
		r.h.Stop()
		stopped <- time.Since(start)
	}()
	if took := testwait.Recv(t, stopped, testwait.Timeout); took > 5*time.Second {
		t.Errorf("Stop took %s with a 100ms grace", took)
	}
	eq(t, "cancel logged", len(r.logLines("slack follow-ups still running at the end of the stop grace")), 1)
	eq(t, "given up logged", len(r.logLines("slack follow-up given up: the handler stopped", `follow_up="alert update"`)), 1)
	eq(t, "the release stands", r.state(t, key).Held, false)
}

// transient tells Slack in trouble from Slack's refusals.
func TestTransientFailures(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		err  error
		want bool
	}{
		{slack.StatusCodeError{Code: 503, Status: "503 Service Unavailable"}, true},
		{slack.StatusCodeError{Code: 500}, true},
		{slack.StatusCodeError{Code: 404}, false},
		{&slack.RateLimitedError{RetryAfter: time.Second}, true},
		{slack.SlackErrorResponse{Err: "internal_error"}, true},
		{slack.SlackErrorResponse{Err: "ratelimited"}, true},
		{slack.SlackErrorResponse{Err: "expired_trigger_id"}, false},
		{slack.SlackErrorResponse{Err: "message_not_found"}, false},
		{fmt.Errorf("chat.update: %w", slack.SlackErrorResponse{Err: "cant_update_message"}), false},
		{&responseStatusError{code: 502}, true},
		{&responseStatusError{code: 429}, true},
		{&responseStatusError{code: 404}, false},
		{permanentError{"gone"}, false},
		{context.DeadlineExceeded, true},
		{context.Canceled, false},
		{errors.New("connection reset by peer"), true},
		{errors.Join(slack.SlackErrorResponse{Err: "channel_not_found"}, &responseStatusError{code: 503}), true},
		{errors.Join(slack.SlackErrorResponse{Err: "channel_not_found"}, &responseStatusError{code: 404}), false},
	} {
		if got := transient(tc.err); got != tc.want {
			t.Errorf("transient(%v) = %v, want %v", tc.err, got, tc.want)
		}
	}
}

// A Slack slower than the trigger's life itself: the click is still
// acknowledged at once, and a views.open that reached Slack in time but
// is answered after 3 s is waited for, not cut short and reported as a
// form that did not open.
func TestFormAnsweredLateIsNotReportedFailed(t *testing.T) {
	t.Parallel()
	r := newRig(t)
	const key = "wf-fu:step-6"
	r.putKey(t, key, ledger.StatusProcessing, time.Hour)
	ts := r.alert(t, key)
	r.srv.SetLatency(TriggerTTL + 500*time.Millisecond)
	_, took := overHTTP(r)(t, r.srv.BlockActions(t, hAlice, hChannel, ts, r.control(t, ts, alerts.ActionIDHold, key)))
	if took >= ackDeadline {
		t.Errorf("acknowledged in %s with Slack answering in %s, past Slack's %s", took, TriggerTTL+500*time.Millisecond, ackDeadline)
	}
	settle(t, r.h)
	eq(t, "views.open calls", len(r.srv.Calls("views.open")), 1)
	eq(t, "answers (none: the form opened)", len(r.srv.Calls("response_url", "chat.postEphemeral")), 0)
	eq(t, "failures logged", len(r.logLines("slack follow-up failed")), 0)
}

// Two actions taken in quick succession from one alert (two keys of a
// grouped message released, both clicks carrying the message as it was)
// each add their line: the second update is made on the message as the
// first left it, not on the copy its click carried.
func TestQuickSuccessiveActionsKeepEveryLine(t *testing.T) {
	t.Parallel()
	r := newRig(t)
	const k1, k2 = "wf-fu:step-7a", "wf-fu:step-7b"
	for _, k := range []string{k1, k2} {
		r.putKey(t, k, ledger.StatusProcessing, time.Hour)
		r.hold(t, k, "x")
	}
	ts := r.alert(t, k1, k2)
	first := r.srv.BlockActions(t, hAlice, hChannel, ts, r.control(t, ts, alerts.ActionIDRelease, k1))
	second := r.srv.BlockActions(t, hAlice, hChannel, ts, r.control(t, ts, alerts.ActionIDRelease, k2))
	r.srv.SetLatency(200 * time.Millisecond)
	send := overHTTP(r)
	send(t, first)
	send(t, second) // acknowledged while the first update is still in flight
	settle(t, r.h)
	m, _ := r.srv.Message(hChannel, ts)
	for _, k := range []string{k1, k2} {
		if line := "alice released `" + k + "`"; strings.Count(string(m.Blocks), line) != 1 {
			t.Errorf("alert has %q %d times, want once: %s", line, strings.Count(string(m.Blocks), line), m.Blocks)
		}
	}
}
