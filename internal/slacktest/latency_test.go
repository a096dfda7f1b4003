package slacktest

import (
	"context"
	"errors"
	"net/http"
	"testing"
	"time"

	"github.com/slack-go/slack"
)

// A slow Slack answers no sooner than its latency, and records the call
// when it answers (At is the arrival); a client that gives up first gets
// nothing applied.
func TestSetLatencyHoldsEveryAnswer(t *testing.T) {
	t.Parallel()
	s := New(t, "xoxb-t")
	ts := s.Post("C1", "hi", nil)
	const d = 300 * time.Millisecond
	s.SetLatency(d)
	c := s.Client("xoxb-t")
	start := time.Now()
	if _, _, _, err := c.UpdateMessage("C1", ts, slack.MsgOptionText("changed", false)); err != nil {
		t.Fatal(err)
	}
	if took := time.Since(start); took < d {
		t.Errorf("chat.update answered in %s, want at least %s", took, d)
	}
	calls := s.Calls("chat.update")
	if len(calls) != 1 || calls[0].At.Before(start) || calls[0].At.After(start.Add(d)) {
		t.Errorf("chat.update calls %+v: want one, arrived before the latency ran", calls)
	}
	ctx, cancel := context.WithTimeout(context.Background(), d/3)
	defer cancel()
	if _, _, _, err := c.UpdateMessageContext(ctx, "C1", ts, slack.MsgOptionText("given up", false)); err == nil {
		t.Error("a call given up before the latency ran succeeded")
	}
	s.SetLatency(0)
	if m, _ := s.Message("C1", ts); m.Text != "changed" {
		t.Errorf("message text %q: a call given up was applied", m.Text)
	}
}

// FailNext answers the next n calls of a method 503 and changes nothing;
// the call after them succeeds.
func TestFailNextAnswers503ThenRecovers(t *testing.T) {
	t.Parallel()
	s := New(t, "")
	ts := s.Post("C1", "hi", nil)
	s.FailNext("chat.update", 2)
	c := s.Client("xoxb-t")
	for i := range 2 {
		_, _, _, err := c.UpdateMessage("C1", ts, slack.MsgOptionText("changed", false))
		var sc slack.StatusCodeError
		if !errors.As(err, &sc) || sc.Code != http.StatusServiceUnavailable {
			t.Fatalf("call %d: err = %v, want HTTP 503", i+1, err)
		}
	}
	if m, _ := s.Message("C1", ts); m.Text != "hi" {
		t.Errorf("a failed call changed the message: %q", m.Text)
	}
	if _, _, _, err := c.UpdateMessage("C1", ts, slack.MsgOptionText("changed", false)); err != nil {
		t.Fatalf("third call: %v", err)
	}
	var statuses []int
	for _, c := range s.Calls("chat.update") {
		statuses = append(statuses, c.Status)
	}
	if len(statuses) != 3 || statuses[0] != 503 || statuses[1] != 503 || statuses[2] != 200 {
		t.Errorf("recorded statuses %v, want [503 503 200]", statuses)
	}
}
