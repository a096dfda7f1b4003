package alerts

import (
	"bytes"
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"regexp"
	"strconv"
	"strings"
	"time"

	"github.com/slack-go/slack"

	"github.com/ledgerkeeper/ledgerkeeper/internal/retryafter"
	"github.com/ledgerkeeper/ledgerkeeper/internal/secret"
)

// DefaultSlackTimeout bounds one call to Slack when SlackConfig.Timeout is 0.
const DefaultSlackTimeout = 10 * time.Second

// SlackConfig says where alerts go: an incoming webhook, or a bot token and
// a channel (chat.postMessage). WebhookURL wins when both are set.
type SlackConfig struct {
	// WebhookURL is an incoming webhook. It is a secret: whoever has it can
	// post to the channel, so it never appears in an error or a log.
	WebhookURL string
	// Token is a bot token with chat:write; Channel is a channel name
	// ("#oncall") or ID.
	Token   string
	Channel string
	// APIURL points the Web API client elsewhere (a proxy, a test server).
	// It ends in "/": slack-go appends the method name. Default
	// https://slack.com/api/.
	APIURL string
	// Timeout bounds one HTTP call to Slack. Default DefaultSlackTimeout.
	Timeout time.Duration
	// Transport carries the requests. Default: a clone of
	// http.DefaultTransport (one connection pool per notifier).
	Transport http.RoundTripper
	// Redactor, the configuration's, also goes over every delivery error
	// (after the notifier's own redaction of its webhook URL or token).
	// Nil: the notifier's own redaction only.
	Redactor *secret.Redactor
}

// NewSlack returns the Slack notifier cfg describes, or ErrNoSlack.
func NewSlack(cfg SlackConfig) (Notifier, error) {
	base := cfg.Transport
	if base == nil {
		base = http.DefaultTransport.(*http.Transport).Clone()
	}
	client := &http.Client{
		Timeout:   cmp.Or(cfg.Timeout, DefaultSlackTimeout),
		Transport: retryAfterTransport{base: base},
		// A webhook that redirects is misconfigured; following it would
		// send the payload somewhere nobody chose.
		CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse },
	}
	switch {
	case cfg.WebhookURL != "":
		u, err := url.Parse(cfg.WebhookURL)
		if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
			return nil, errors.New("alerts.slack.webhook_url must be an http(s) URL")
		}
		return &webhookNotifier{
			url:    cfg.WebhookURL,
			client: client,
			red:    newRedactor("the Slack webhook at "+u.Host, cfg.WebhookURL, u.Path, u.RawQuery).also(cfg.Redactor),
		}, nil
	case cfg.Token != "":
		if cfg.Channel == "" {
			return nil, errors.New("alerts.slack.channel is required with alerts.slack.token")
		}
		api := cmp.Or(cfg.APIURL, slack.APIURL)
		if !strings.HasSuffix(api, "/") {
			return nil, errors.New(`alerts.slack.api_url must end in "/" (slack-go appends the method name)`)
		}
		where := "Slack API"
		if u, err := url.Parse(api); err == nil {
			where = "Slack API at " + u.Redacted()
		}
		return &botNotifier{
			client:  slack.New(cfg.Token, slack.OptionAPIURL(api), slack.OptionHTTPClient(client)),
			channel: cfg.Channel,
			red:     newRedactor(where, cfg.Token).also(cfg.Redactor),
		}, nil
	}
	return nil, ErrNoSlack
}

// webhookNotifier posts to an incoming webhook. It does the POST itself,
// building the payload with slack-go's WebhookMessage, because
// slack.PostWebhookCustomHTTPContext discards the response body, which is
// where Slack names the error (no_service, channel_is_archived,
// invalid_payload), and fails on a Retry-After given as an HTTP date.
// Webhook errors: https://api.slack.com/messaging/webhooks#handling_errors
type webhookNotifier struct {
	url    string
	client *http.Client
	red    redactor
}

func (n *webhookNotifier) Notify(ctx context.Context, m Message) (bool, error) {
	no := false
	payload := slack.WebhookMessage{
		Text:        m.Text,
		Blocks:      &slack.Blocks{BlockSet: m.Blocks},
		Parse:       "none",
		UnfurlLinks: &no,
		UnfurlMedia: &no,
	}
	body, err := json.Marshal(&payload)
	if err != nil {
		return false, &DeliveryError{Class: ClassPermanent, Code: "encode", PerMessage: true, Err: fmt.Errorf("encode message: %w", err)}
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, n.url, bytes.NewReader(body))
	if err != nil {
		return false, &DeliveryError{Class: ClassPermanent, Code: "bad_webhook_url", Err: n.red.redact(err)}
	}
	req.Header.Set("Content-Type", "application/json")
	resp, err := n.client.Do(req)
	if err != nil {
		return true, &DeliveryError{Class: ClassRetryable, Err: n.red.redact(err)}
	}
	defer resp.Body.Close()
	// Slack answers "ok" or a short error code; a proxy may answer a page.
	text, _ := io.ReadAll(io.LimitReader(resp.Body, 1024))
	_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, 64<<10))
	return classifyHTTP(resp.StatusCode, resp.Header, errorCode(string(text)))
}

// classifyHTTP classifies a webhook's answer by status code.
func classifyHTTP(status int, h http.Header, code string) (bool, error) {
	switch {
	case status >= 200 && status < 300:
		return false, nil
	case status == http.StatusTooManyRequests:
		ra, _ := parseRetryAfter(h.Get("Retry-After"), time.Now())
		return true, &DeliveryError{Class: ClassRateLimited, RetryAfter: ra, Code: cmp.Or(code, "http_429"), Err: errors.New("rate limited")}
	case status >= 500 || status == http.StatusRequestTimeout:
		return true, &DeliveryError{Class: ClassRetryable, Code: cmp.Or(code, "http_"+strconv.Itoa(status)), Err: fmt.Errorf("HTTP %d", status)}
	case status >= 300 && status < 400:
		return false, &DeliveryError{Class: ClassPermanent, Code: "http_" + strconv.Itoa(status), Err: fmt.Errorf("HTTP %d: the webhook URL redirects; set the URL Slack gave you", status)}
	default:
		return false, &DeliveryError{Class: ClassPermanent, Code: cmp.Or(code, "http_"+strconv.Itoa(status)), PerMessage: perMessageCodes[code], Err: fmt.Errorf("HTTP %d", status)}
	}
}

var codeRE = regexp.MustCompile(`^[a-z0-9_]{1,64}$`)

// errorCode keeps a Slack error code from a response body, and nothing
// else: a proxy's HTML page has no place in an error or a log.
func errorCode(body string) string {
	body = strings.TrimSpace(body)
	if codeRE.MatchString(body) {
		return body
	}
	return ""
}

// botNotifier posts with chat.postMessage through slack-go's Web API
// client, whose own retry stays off: the dispatcher owns retries.
type botNotifier struct {
	client  *slack.Client
	channel string
	red     redactor
}

func (n *botNotifier) Notify(ctx context.Context, m Message) (bool, error) {
	_, _, err := n.client.PostMessageContext(ctx, n.channel,
		slack.MsgOptionText(m.Text, false), // already escaped by the renderer
		slack.MsgOptionBlocks(m.Blocks...),
		slack.MsgOptionParse(false), // parse=none: no automatic linking of names
		slack.MsgOptionLinkNames(false),
		slack.MsgOptionDisableLinkUnfurl(),
		slack.MsgOptionDisableMediaUnfurl(),
	)
	if err == nil {
		return false, nil
	}
	de := classifyAPIError(err)
	de.Err = n.red.redact(de.Err)
	return de.Class != ClassPermanent, de
}

// Web API error codes. Retryable ones are transient on Slack's side;
// per-message ones reject this message only; every other code is about the
// token or the channel and needs a human.
// https://api.slack.com/methods/chat.postMessage#errors
var (
	retryableCodes = map[string]bool{
		"ratelimited": true, "rate_limited": true, "request_timeout": true,
		"service_unavailable": true, "fatal_error": true, "internal_error": true,
	}
	perMessageCodes = map[string]bool{
		"invalid_blocks": true, "invalid_blocks_format": true, "msg_too_long": true,
		"msg_blocks_too_long": true, "no_text": true, "too_many_attachments": true,
		"invalid_arguments": true, "invalid_arg_name": true, "invalid_charset": true,
		"invalid_form_data": true, "invalid_json": true, "json_not_object": true,
		"invalid_payload": true, "markdown_text_conflict": true,
	}
)

// classifyAPIError classifies what slack-go's Web API client returned.
func classifyAPIError(err error) *DeliveryError {
	var rl *slack.RateLimitedError
	var sc slack.StatusCodeError
	var se slack.SlackErrorResponse
	switch {
	case errors.As(err, &rl):
		return &DeliveryError{Class: ClassRateLimited, RetryAfter: rl.RetryAfter, Code: "http_429", Err: errors.New("rate limited")}
	case errors.As(err, &sc):
		code := "http_" + strconv.Itoa(sc.Code)
		switch {
		case sc.Code == http.StatusTooManyRequests:
			return &DeliveryError{Class: ClassRateLimited, Code: code, Err: errors.New("rate limited")}
		case sc.Code >= 500 || sc.Code == http.StatusRequestTimeout:
			return &DeliveryError{Class: ClassRetryable, Code: code, Err: fmt.Errorf("HTTP %d", sc.Code)}
		default:
			// 404: wrong api_url; 401/403: a proxy refusing us.
			return &DeliveryError{Class: ClassPermanent, Code: code, Err: fmt.Errorf("HTTP %d: check alerts.slack.api_url", sc.Code)}
		}
	case errors.As(err, &se):
		code := se.Err
		if !codeRE.MatchString(code) {
			code = "slack_error"
		}
		e := &DeliveryError{Code: code, Err: errors.New("chat.postMessage refused the message")}
		switch {
		case retryableCodes[code]:
			e.Class = ClassRetryable
		case perMessageCodes[code]:
			e.Class, e.PerMessage = ClassPermanent, true
		default:
			e.Class = ClassPermanent
		}
		return e
	default:
		// Transport errors, timeouts, a garbled answer: Slack or the way
		// to it is having a bad moment.
		return &DeliveryError{Class: ClassRetryable, Err: err}
	}
}

// retryAfterTransport rewrites a Retry-After given as an HTTP date into
// seconds, the only form slack-go parses (it fails on a date), so a 429 is
// honoured whichever form Slack or a proxy uses.
type retryAfterTransport struct{ base http.RoundTripper }

func (t retryAfterTransport) RoundTrip(req *http.Request) (*http.Response, error) {
	resp, err := t.base.RoundTrip(req)
	if err != nil || resp.StatusCode != http.StatusTooManyRequests {
		return resp, err
	}
	// Plain digits are left to slack-go as they are; any other value, which
	// slack-go would misread ("+5") or fail on (a date), becomes our reading.
	if v := resp.Header.Get("Retry-After"); v != "" {
		if strings.Trim(v, "0123456789") != "" {
			d, ok := parseRetryAfter(v, time.Now())
			if ok {
				resp.Header.Set("Retry-After", strconv.FormatInt(int64(d/time.Second), 10))
			} else {
				resp.Header.Del("Retry-After")
			}
		}
	}
	return resp, nil
}

// maxSlackRetryAfter is the longest Retry-After parseRetryAfter returns: a
// mistaken header must not hold the outbox back for more than a week.
const maxSlackRetryAfter = 7 * 24 * time.Hour

// parseRetryAfter reads a Retry-After value (package retryafter:
// delay-seconds or an HTTP date, relative to now) as Slack's notifiers
// honour it: at most maxSlackRetryAfter, rounded up to whole seconds; a date
// already past is 0. Anything else (signed, fractional, garbage) is no
// Retry-After: ok is false.
func parseRetryAfter(v string, now time.Time) (time.Duration, bool) {
	d, ok := retryafter.Parse(v, now)
	if !ok {
		return 0, false
	}
	d = min(d, maxSlackRetryAfter)
	return ((d + time.Second - 1) / time.Second) * time.Second, true //nolint:durationcheck // rounds up to whole seconds: a count times time.Second
}

// redactor strips secrets from errors. slack-go and net/http quote the
// request URL (*url.Error), which for a webhook is the secret itself.
type redactor struct {
	where string
	// own knows the notifier's webhook URL or token (and masks what looks
	// like a credential); cfg is the configuration's, nil when not given.
	own, cfg *secret.Redactor
}

func newRedactor(where string, secrets ...string) redactor {
	r := redactor{where: where, own: secret.New()}
	for _, s := range secrets {
		// Short fragments (a path "/") would redact everything.
		if len(s) >= 8 {
			r.own.Register(s)
		}
	}
	return r
}

// also returns r going over its text with red too.
func (r redactor) also(red *secret.Redactor) redactor {
	r.cfg = red
	return r
}

// redact returns err's text without any secret, keeping only the
// context.Canceled / DeadlineExceeded identity for errors.Is.
func (r redactor) redact(err error) error {
	if err == nil {
		return nil
	}
	var msg string
	var ue *url.Error
	if errors.As(err, &ue) {
		msg = fmt.Sprintf("%s %s: %v", ue.Op, r.where, ue.Err)
		if ue.Timeout() {
			msg += " (timeout)"
		}
	} else {
		msg = err.Error()
	}
	if r.cfg != nil {
		msg = r.cfg.String(msg)
	}
	msg = r.own.String(msg)
	var cause error
	switch {
	case errors.Is(err, context.Canceled):
		cause = context.Canceled
	case errors.Is(err, context.DeadlineExceeded):
		cause = context.DeadlineExceeded
	}
	return &redactedError{msg: msg, cause: cause}
}

type redactedError struct {
	msg   string
	cause error
}

func (e *redactedError) Error() string { return e.msg }
func (e *redactedError) Unwrap() error { return e.cause }
