package interact

import (
	"context"
	"errors"
	"net/http"
	"slices"
	"strconv"
	"sync"
	"time"

	"github.com/slack-go/slack"

	"github.com/ledgerkeeper/ledgerkeeper/internal/backoff"
)

// Defaults of the follow-ups (Config).
const (
	// DefaultFollowUpTimeout bounds one attempt of a follow-up: one Slack
	// call, or a read-back and an update. It runs after the
	// acknowledgement, so Slack's 3 seconds do not bound it.
	DefaultFollowUpTimeout = 10 * time.Second
	// DefaultFollowUpAttempts is how many times a follow-up is tried.
	DefaultFollowUpAttempts = 5
	// DefaultFollowUpBackoffBase and DefaultFollowUpBackoffMax shape the
	// wait between attempts: base·2^n, capped, ±10%.
	DefaultFollowUpBackoffBase = time.Second
	DefaultFollowUpBackoffMax  = 30 * time.Second
	// DefaultStopGrace is how long Stop lets the follow-ups in hand finish
	// before it cancels them.
	DefaultStopGrace = 10 * time.Second
	// DefaultDecideTimeout bounds the database work an interaction does
	// before it is acknowledged (normally milliseconds).
	DefaultDecideTimeout = 10 * time.Second
)

// TriggerTTL is how long a trigger_id can open a form: Slack expects
// views.open within 3 seconds of the interaction that carried it.
// https://docs.slack.dev/tools/bolt-js/concepts/creating-modals
const TriggerTTL = 3 * time.Second

// ErrStopped is Handle's answer after Stop: the interaction was neither
// handled nor acknowledged (HTTP answers 503; Socket Mode leaves the
// envelope for Slack to deliver again, to a replica still running).
var ErrStopped = errors.New("interact: the handler is stopping: interaction not taken")

// followUps owns the goroutines that talk to Slack after an interaction is
// acknowledged, and counts the interactions in hand, so that Stop waits
// for both and Settle can tell when everything started so far is done.
type followUps struct {
	mu      sync.Mutex
	stopped bool
	done    chan struct{} // closed when Stop has finished
	wg      sync.WaitGroup
	busy    int             // interactions in hand + follow-ups running
	idle    []chan struct{} // Settle's waiters, closed when busy drops to 0
	// ctx is the follow-ups' context: cancelled when Stop's grace runs out.
	ctx    context.Context
	cancel context.CancelFunc
}

// enter counts an interaction in hand; false once Stop was called.
func (f *followUps) enter() bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.stopped {
		return false
	}
	f.busy++
	f.wg.Add(1)
	return true
}

// accepting reports whether the handler still takes interactions.
func (f *followUps) accepting() bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	return !f.stopped
}

func (f *followUps) leave() {
	f.mu.Lock()
	f.busy--
	if f.busy == 0 {
		for _, ch := range f.idle {
			close(ch)
		}
		f.idle = nil
	}
	f.mu.Unlock()
	f.wg.Done()
}

// goFollowUp runs fn on a goroutine the handler owns. It is called only
// by an interaction in hand (entered), so Stop, which waits for that
// interaction, waits for fn too.
func (h *Handler) goFollowUp(fn func()) {
	f := &h.fu
	f.mu.Lock()
	f.busy++
	f.wg.Add(1)
	f.mu.Unlock()
	go func() {
		defer f.leave()
		fn()
	}()
}

// Start makes the Handler one of serve's services, so that Stop is
// called at shutdown (after the transports stopped). The Handler takes
// interactions before Start too (serve's listener starts first). Its
// follow-ups end at Stop, not when ctx ends: serve cancels ctx at
// shutdown before the transports finish the interactions in hand, whose
// answers must still go out.
func (h *Handler) Start(context.Context) error {
	if !h.fu.accepting() {
		return errors.New("interact: handler already stopped")
	}
	return nil
}

// Stop refuses new interactions (ErrStopped), waits for the interactions
// in hand and their follow-ups up to Config.StopGrace, then cancels the
// follow-ups still running (each logs what it gave up) and waits for them
// to return. Safe before Start and twice.
func (h *Handler) Stop() {
	f := &h.fu
	f.mu.Lock()
	if f.stopped {
		done := f.done
		f.mu.Unlock()
		<-done
		return
	}
	f.stopped = true
	f.done = make(chan struct{})
	f.mu.Unlock()
	defer close(f.done)
	finished := make(chan struct{})
	go func() {
		f.wg.Wait()
		close(finished)
	}()
	grace := time.NewTimer(h.cfg.StopGrace)
	defer grace.Stop()
	select {
	case <-finished:
	case <-grace.C:
		h.log.Warn("slack follow-ups still running at the end of the stop grace: cancelling them", "stop_grace", h.cfg.StopGrace)
		f.cancel()
		<-finished
	}
	f.cancel()
}

// Settle waits until every interaction taken so far is handled and its
// follow-ups (answers, message updates, forms) are sent or given up: for
// the demo and tests, which read what Slack was sent.
func (h *Handler) Settle(ctx context.Context) error {
	f := &h.fu
	f.mu.Lock()
	if f.busy == 0 {
		f.mu.Unlock()
		return nil
	}
	ch := make(chan struct{})
	f.idle = append(f.idle, ch)
	f.mu.Unlock()
	select {
	case <-ch:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// retry runs call until it succeeds, fails for good (a refusal Slack will
// repeat), has been tried Config.FollowUpAttempts times, or a retry would
// start after deadline (zero: none); each attempt is bounded by
// FollowUpTimeout (not by deadline: a call that reached Slack in time may
// be answered late, and cutting it short would report a failure that was
// not) and the waits between them back off (a rate limit's Retry-After is
// waited instead, up to FollowUpBackoffMax). Every failed attempt is
// logged, redacted; the last error is returned.
func (h *Handler) retry(what string, deadline time.Time, call func(context.Context) error, attrs ...any) error {
	for n := 1; ; n++ {
		ctx, cancel := context.WithTimeout(h.fu.ctx, h.cfg.FollowUpTimeout)
		err := call(ctx)
		cancel()
		if err == nil {
			if n > 1 {
				h.log.Info("slack follow-up sent after retrying", append([]any{"follow_up", what, "attempts", n}, attrs...)...)
			}
			return nil
		}
		if h.fu.ctx.Err() != nil {
			h.log.Warn("slack follow-up given up: the handler stopped", append([]any{"follow_up", what, "attempts", n}, attrs...)...)
			return err
		}
		wait, again := h.retryWait(err, n)
		if !again || n >= h.cfg.FollowUpAttempts || (!deadline.IsZero() && time.Now().Add(wait).After(deadline)) {
			h.log.Error("slack follow-up failed; given up", append([]any{"follow_up", what, "attempts", n, "err", h.red.Error(err)}, attrs...)...)
			return err
		}
		h.log.Warn("slack follow-up failed; retrying", append([]any{"follow_up", what, "attempt", n, "retry_in", wait.Round(time.Millisecond), "err", h.red.Error(err)}, attrs...)...)
		t := time.NewTimer(wait)
		select {
		case <-t.C:
		case <-h.fu.ctx.Done():
			t.Stop()
		}
	}
}

// retryWait says whether a failed attempt is worth another, and after how
// long.
func (h *Handler) retryWait(err error, n int) (time.Duration, bool) {
	var rl *slack.RateLimitedError
	if errors.As(err, &rl) {
		return min(max(rl.RetryAfter, h.cfg.FollowUpBackoffBase), h.cfg.FollowUpBackoffMax), true
	}
	if !transient(err) {
		return 0, false
	}
	return backoff.Delay(h.cfg.FollowUpBackoffBase, h.cfg.FollowUpBackoffMax, n-1, backoff.Jitter(0.9, 1.1)), true
}

// transientSlackErrors are the Web API's error codes that a later call may
// not get: https://docs.slack.dev/reference/methods/chat.update (errors).
var transientSlackErrors = []string{"internal_error", "fatal_error", "service_unavailable", "request_timeout", "ratelimited"}

// transient reports whether err may go away by itself: Slack in trouble
// (5xx, 429, the codes above), the network, an attempt that timed out.
// Slack's refusals (expired_trigger_id, message_not_found, invalid_auth,
// channel_not_found, …) and ours (permanentError) would be repeated.
func transient(err error) bool {
	if joined, ok := err.(interface{ Unwrap() []error }); ok {
		return slices.ContainsFunc(joined.Unwrap(), transient)
	}
	var (
		slackErr slack.SlackErrorResponse
		status   slack.StatusCodeError
		resp     *responseStatusError
		perm     permanentError
	)
	switch {
	case errors.As(err, &perm):
		return false
	case errors.As(err, &slackErr):
		return slices.Contains(transientSlackErrors, slackErr.Err)
	case errors.As(err, &status):
		return status.Retryable()
	case errors.As(err, &resp):
		return resp.code >= http.StatusInternalServerError || resp.code == http.StatusTooManyRequests
	case errors.Is(err, context.Canceled):
		return false
	}
	// The network, a timed-out attempt, an answer cut short.
	return true
}

// permanentError is a follow-up failure of ours that no retry changes
// (the alert message is gone, a message has no room left).
type permanentError struct{ msg string }

func (e permanentError) Error() string { return e.msg }

// responseStatusError is a response_url post answered with a non-2xx
// status.
type responseStatusError struct{ code int }

func (e *responseStatusError) Error() string {
	return "post to response_url: HTTP " + strconv.Itoa(e.code)
}
