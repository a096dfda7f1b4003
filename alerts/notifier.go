package alerts

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/slack-go/slack"
)

// Kind says whether an outbox row announces a problem or its end; a message
// carries alerts of one kind only.
type Kind string

// The kinds stored in alert_outbox.kind.
const (
	KindFiring   Kind = "firing"
	KindResolved Kind = "resolved"
)

// Message is one rendered Slack message: the alerts of one kind and reason
// claimed in one dispatcher pass. Notifiers send it as it is; everything in
// Text and Blocks is already escaped for Slack.
type Message struct {
	Kind   Kind
	Reason Reason
	// Alerts is how many outbox rows the message reports (listed or
	// counted in "…and N more").
	Alerts int
	// Text is the plain fallback shown in notifications and by clients
	// that cannot render blocks.
	Text   string
	Blocks []slack.Block
}

// Notifier delivers one message. It is the seam between the dispatcher,
// which owns claiming, grouping and the retry policy, and a destination,
// which only sends and classifies (like Alertmanager's notify.Notifier).
//
// Notify never retries by itself. retry reports whether trying the same
// message later may succeed; a non-nil err with retry == false is a
// permanent failure (a revoked token, a missing channel) that needs a human.
// An err that is a *DeliveryError may add a Retry-After floor (HTTP 429) and
// say whether the failure concerns this message only. Errors never carry a
// secret.
type Notifier interface {
	Notify(ctx context.Context, m Message) (retry bool, err error)
}

// NotifierFunc adapts a function to Notifier, for tests and small adapters.
type NotifierFunc func(ctx context.Context, m Message) (bool, error)

// Notify calls f.
func (f NotifierFunc) Notify(ctx context.Context, m Message) (bool, error) { return f(ctx, m) }

// FailureClass is how a failed delivery is retried; it is stored in
// alert_outbox.last_error_class and labels the failure metric.
type FailureClass string

// The failure classes.
const (
	// ClassRetryable: a timeout, a 5xx, a transient Slack error: retried
	// with exponential back-off.
	ClassRetryable FailureClass = "retryable"
	// ClassRateLimited: HTTP 429: retried no sooner than Retry-After.
	ClassRateLimited FailureClass = "rate_limited"
	// ClassPermanent: configuration or authorisation is wrong; retried
	// only after a long back-off (or when a new process starts), and
	// surfaced by Health.
	ClassPermanent FailureClass = "permanent"
)

// DeliveryError is a classified failure to deliver a message. Notifiers
// return it so the dispatcher can honour Retry-After and tell on-call what
// to fix; its text is already free of secrets.
type DeliveryError struct {
	Class FailureClass
	// RetryAfter is the server's Retry-After (HTTP 429); zero if none.
	RetryAfter time.Duration
	// Code is Slack's error code ("channel_not_found", "no_service") or
	// "http_NNN" when Slack gave none.
	Code string
	// PerMessage: the failure concerns this message only (it is malformed
	// or too long), so other messages of the pass may still go out. False
	// for everything about the destination (auth, channel, outage).
	PerMessage bool
	// Err is the redacted cause.
	Err error
}

func (e *DeliveryError) Error() string {
	msg := "slack"
	if e.Code != "" {
		msg += " " + e.Code
	}
	if e.Err != nil {
		msg += ": " + e.Err.Error()
	}
	if hint := codeHints[e.Code]; hint != "" {
		msg += " (" + hint + ")"
	}
	if e.RetryAfter > 0 {
		msg += fmt.Sprintf(" (retry after %s)", e.RetryAfter)
	}
	return msg
}

func (e *DeliveryError) Unwrap() error { return e.Err }

// codeHints tell on-call what a permanent Slack error means.
var codeHints = map[string]string{
	"invalid_auth":        "the token is not valid: set alerts.slack.token",
	"not_authed":          "no token was sent: set alerts.slack.token",
	"account_inactive":    "the token's bot or user was deactivated: issue a new token",
	"token_revoked":       "the token was revoked: issue a new token",
	"token_expired":       "the token expired: issue a new token",
	"missing_scope":       "the token lacks the chat:write scope",
	"channel_not_found":   "check alerts.slack.channel (or the webhook's channel)",
	"not_in_channel":      "invite the bot to the channel (/invite @bot)",
	"is_archived":         "the channel is archived: pick another alerts.slack.channel",
	"channel_is_archived": "the channel is archived: create a webhook for another channel",
	"no_service":          "the webhook was removed or disabled: create a new one and set alerts.slack.webhook_url",
	"action_prohibited":   "a workspace admin restricted this webhook",
	"not_configured":      "set alerts.slack.webhook_url, or alerts.slack.token and alerts.slack.channel",
}

// ErrNoSlack is returned by NewSlack when neither a webhook nor a token is
// configured.
var ErrNoSlack = errors.New("no Slack configured: set alerts.slack.webhook_url, or alerts.slack.token and alerts.slack.channel")

// NotConfigured is the Notifier of a deployment without Slack: every
// delivery fails permanently, so alerts stay in the outbox, are counted
// and show in `ledgerkeeper status` instead of vanishing.
type NotConfigured struct{}

// Notify fails permanently.
func (NotConfigured) Notify(context.Context, Message) (bool, error) {
	return false, &DeliveryError{
		Class: ClassPermanent,
		Code:  "not_configured",
		Err:   errors.New("no Slack configured: alerts stay in the outbox"),
	}
}

// classify turns a notifier's answer into a class and a Retry-After floor.
func classify(retry bool, err error) (FailureClass, time.Duration, bool) {
	var de *DeliveryError
	isDE := errors.As(err, &de)
	perMessage := isDE && de.PerMessage
	if !retry {
		return ClassPermanent, 0, perMessage
	}
	if isDE && (de.RetryAfter > 0 || de.Class == ClassRateLimited) {
		return ClassRateLimited, de.RetryAfter, perMessage
	}
	return ClassRetryable, 0, perMessage
}
