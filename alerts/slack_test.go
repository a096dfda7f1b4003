package alerts

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/slack-go/slack"
)

func TestClassifyAPIError(t *testing.T) {
	for _, tc := range []struct {
		err        error
		class      FailureClass
		retryAfter time.Duration
		perMessage bool
		code       string
	}{
		{&slack.RateLimitedError{RetryAfter: 30 * time.Second}, ClassRateLimited, 30 * time.Second, false, "http_429"},
		{slack.StatusCodeError{Code: 429, Status: "429 Too Many Requests"}, ClassRateLimited, 0, false, "http_429"},
		{slack.StatusCodeError{Code: 500, Status: "500"}, ClassRetryable, 0, false, "http_500"},
		{slack.StatusCodeError{Code: 503, Status: "503"}, ClassRetryable, 0, false, "http_503"},
		{slack.StatusCodeError{Code: 404, Status: "404"}, ClassPermanent, 0, false, "http_404"},
		{slack.SlackErrorResponse{Err: "invalid_auth"}, ClassPermanent, 0, false, "invalid_auth"},
		{slack.SlackErrorResponse{Err: "channel_not_found"}, ClassPermanent, 0, false, "channel_not_found"},
		{slack.SlackErrorResponse{Err: "not_in_channel"}, ClassPermanent, 0, false, "not_in_channel"},
		{slack.SlackErrorResponse{Err: "account_inactive"}, ClassPermanent, 0, false, "account_inactive"},
		{slack.SlackErrorResponse{Err: "token_revoked"}, ClassPermanent, 0, false, "token_revoked"},
		{slack.SlackErrorResponse{Err: "internal_error"}, ClassRetryable, 0, false, "internal_error"},
		{slack.SlackErrorResponse{Err: "msg_too_long"}, ClassPermanent, 0, true, "msg_too_long"},
		{slack.SlackErrorResponse{Err: "<!channel> weird"}, ClassPermanent, 0, false, "slack_error"},
		{&url.Error{Op: "Post", URL: "https://slack.com/api/chat.postMessage", Err: errors.New("connection reset")}, ClassRetryable, 0, false, ""},
	} {
		t.Run(fmt.Sprintf("%T %v", tc.err, tc.err), func(t *testing.T) {
			de := classifyAPIError(tc.err)
			if de.Class != tc.class || de.RetryAfter != tc.retryAfter || de.PerMessage != tc.perMessage || de.Code != tc.code {
				t.Errorf("got %+v", de)
			}
			class, ra, _ := classify(de.Class != ClassPermanent, de)
			if class != tc.class || ra != tc.retryAfter {
				t.Errorf("dispatcher reads %s, %s", class, ra)
			}
		})
	}
}

func TestClassifyWebhookAnswer(t *testing.T) {
	date := func(d time.Duration) http.Header {
		return http.Header{"Retry-After": {time.Now().Add(d).UTC().Format(http.TimeFormat)}}
	}
	for _, tc := range []struct {
		status     int
		header     http.Header
		body       string
		retry      bool
		class      FailureClass
		perMessage bool
		code       string
	}{
		{200, nil, "ok", false, "", false, ""},
		{404, nil, "no_service", false, ClassPermanent, false, "no_service"},
		{403, nil, "action_prohibited", false, ClassPermanent, false, "action_prohibited"},
		{410, nil, "channel_is_archived", false, ClassPermanent, false, "channel_is_archived"},
		{400, nil, "invalid_payload", false, ClassPermanent, true, "invalid_payload"},
		{400, nil, "<html>bad</html>", false, ClassPermanent, false, "http_400"},
		{500, nil, "rollup_error", true, ClassRetryable, false, "rollup_error"},
		{502, nil, "<html>", true, ClassRetryable, false, "http_502"},
		{429, http.Header{"Retry-After": {"7"}}, "", true, ClassRateLimited, false, "http_429"},
		{429, date(30 * time.Second), "", true, ClassRateLimited, false, "http_429"},
		{302, nil, "", false, ClassPermanent, false, "http_302"},
	} {
		retry, err := classifyHTTP(tc.status, tc.header, errorCode(tc.body))
		if tc.class == "" {
			if err != nil {
				t.Errorf("%d: %v", tc.status, err)
			}
			continue
		}
		var de *DeliveryError
		if !errors.As(err, &de) || retry != tc.retry || de.Class != tc.class || de.PerMessage != tc.perMessage || de.Code != tc.code {
			t.Errorf("%d %q: retry %v, %+v", tc.status, tc.body, retry, de)
			continue
		}
		if strings.Contains(err.Error(), "<html>") {
			t.Errorf("%d: body in error: %v", tc.status, err)
		}
		if tc.status == 429 && (de.RetryAfter < 7*time.Second || de.RetryAfter > 30*time.Second) {
			t.Errorf("429 Retry-After read as %s", de.RetryAfter)
		}
	}
}

func TestParseRetryAfter(t *testing.T) {
	now := time.Date(2026, 11, 30, 4, 0, 0, 0, time.UTC)
	for in, want := range map[string]time.Duration{
		"120":                           120 * time.Second,
		" 5 ":                           5 * time.Second,
		"0":                             0,
		"Mon, 30 Nov 2026 04:01:30 GMT": 90 * time.Second,
		"Mon, 30 Nov 2026 03:59:00 GMT": 0,
		"604801":                        7 * 24 * time.Hour,
		"99999999999999999999999":       7 * 24 * time.Hour,
	} {
		if got, ok := parseRetryAfter(in, now); !ok || got != want {
			t.Errorf("parseRetryAfter(%q) = %s, %v; want %s", in, got, ok, want)
		}
	}
	for _, bad := range []string{"", "-1", "+5", "soon", "1.5"} {
		if _, ok := parseRetryAfter(bad, now); ok {
			t.Errorf("parseRetryAfter(%q) accepted", bad)
		}
	}
}

func TestRetryAfterTransportNormalisesDates(t *testing.T) {
	at := time.Now().Add(45 * time.Second).UTC().Format(http.TimeFormat)
	base := roundTripFunc(func(*http.Request) (*http.Response, error) {
		return &http.Response{StatusCode: http.StatusTooManyRequests, Header: http.Header{"Retry-After": {at}}, Body: http.NoBody}, nil
	})
	req, _ := http.NewRequest(http.MethodPost, "http://x/api/chat.postMessage", nil)
	resp, err := retryAfterTransport{base: base}.RoundTrip(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if v := resp.Header.Get("Retry-After"); v != "44" && v != "45" {
		t.Errorf("Retry-After %q, want seconds", v)
	}
}

// A Retry-After slack-go would misread ("+5" as five seconds) or fail on is
// no Retry-After at all: the header is dropped, plain digits left as they are.
func TestRetryAfterTransportDropsWhatIsNotDelaySecondsOrADate(t *testing.T) {
	for in, want := range map[string]string{"+5": "", "-1": "", "soon": "", "1.5": "", "30": "30"} {
		base := roundTripFunc(func(*http.Request) (*http.Response, error) {
			return &http.Response{StatusCode: http.StatusTooManyRequests, Header: http.Header{"Retry-After": {in}}, Body: http.NoBody}, nil
		})
		req, _ := http.NewRequest(http.MethodPost, "http://x/api/chat.postMessage", nil)
		resp, err := retryAfterTransport{base: base}.RoundTrip(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if got := resp.Header.Get("Retry-After"); got != want {
			t.Errorf("Retry-After %q became %q, want %q", in, got, want)
		}
	}
}

type roundTripFunc func(*http.Request) (*http.Response, error)

func (f roundTripFunc) RoundTrip(r *http.Request) (*http.Response, error) { return f(r) }

func TestRedactor(t *testing.T) {
	hook := "https://hooks.slack.com/services/T000/B000/XXXXSECRETXXXX"
	r := newRedactor("the Slack webhook at hooks.slack.com", hook, "/services/T000/B000/XXXXSECRETXXXX")
	err := r.redact(&url.Error{Op: "Post", URL: hook, Err: context.DeadlineExceeded})
	if strings.Contains(err.Error(), "XXXXSECRET") || !strings.Contains(err.Error(), "the Slack webhook at hooks.slack.com") {
		t.Errorf("redacted: %v", err)
	}
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Error("lost the deadline identity")
	}
	// Defence in depth: secrets it was not told about.
	other := r.redact(errors.New("posting with xoxb-123-456-abcdef to https://hooks.slack.com/services/T1/B1/zzz failed"))
	if strings.Contains(other.Error(), "abcdef") || strings.Contains(other.Error(), "zzz") {
		t.Errorf("redacted: %v", other)
	}
	if r.redact(nil) != nil {
		t.Error("redact(nil) != nil")
	}
}

func TestNewSlackRejectsBadConfig(t *testing.T) {
	for _, cfg := range []SlackConfig{
		{WebhookURL: "ftp://x"},
		{Token: "xoxb-1"},
		{Token: "xoxb-1", Channel: "#c", APIURL: "http://127.0.0.1:1/api"},
	} {
		if _, err := NewSlack(cfg); err == nil || strings.Contains(err.Error(), "xoxb") {
			t.Errorf("NewSlack(%+v) = %v", cfg, err)
		}
	}
}
