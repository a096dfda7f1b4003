package alerts

import (
	"context"
	"net/url"
	"strings"
	"testing"
	"unicode/utf8"

	"github.com/ledgerkeeper/ledgerkeeper/internal/secret"
)

// A last_error of 3,000 bytes of "é", NUL bytes and invalid UTF-8 is stored
// (jsonb refuses \u0000), rendered valid and bounded, and reaches Slack,
// through both notifiers.
func TestHostileLastErrorReachesSlackValidAndBounded(t *testing.T) {
	t.Parallel()
	for _, via := range []string{"bot", "webhook"} {
		t.Run(via, func(t *testing.T) {
			t.Parallel()
			b := setup(t)
			f := newFakeSlack(t, nil)
			n := f.botNotifier(t)
			if via == "webhook" {
				n = f.webhookNotifier(t)
			}
			a := keyAlert(ReasonProbeFailing, "create_ticket", "wf-utf8")
			a.Details.LastError = "probe: " + strings.Repeat("é", 1500) + "\x00nul\x00 bad\xff\xfe\xc3 end"
			a.Details.Note = "note\x00 with NUL and \xff"
			b.raise(t, a)
			rep := b.run(t, b.dispatcher(n, nil))
			if rep.Delivered != 1 || rep.Pending != 0 {
				t.Fatalf("report %+v", rep)
			}
			got := f.accepted()
			if len(got) != 1 {
				t.Fatalf("%d messages accepted", len(got))
			}
			if !utf8.Valid(got[0].Raw) {
				t.Fatal("request body is not valid UTF-8")
			}
			for _, s := range got[0].texts(t) {
				if !utf8.ValidString(s) || strings.ContainsRune(s, 0) {
					t.Errorf("unsafe text %q", s)
				}
				if n := utf8.RuneCountInString(s); n > maxTextObject {
					t.Errorf("text of %d characters", n)
				}
				if strings.Contains(s, "Last probe error") && !strings.Contains(s, "éé…") {
					t.Errorf("last error not cut, marked, by characters: %q", s)
				}
			}
		})
	}
}

// The configuration's secrets never reach Slack: not in a probe error
// (raw, percent-encoded in a query, inside a DSN or a header), not in a
// note, and not in a delivery error stored or logged.
func TestRegisteredSecretsNeverReachSlack(t *testing.T) {
	t.Parallel()
	const (
		queryToken = "tickets-token/42+x"
		headerTok  = "hdr-token-7777"
		dbPass     = "db-pass-8888"
	)
	red := secret.New()
	red.Register(queryToken, "Bearer "+headerTok, "postgres://app:"+dbPass+"@db/x")
	b := setup(t)
	f := newFakeSlack(t, nil)
	notifier, err := NewSlack(SlackConfig{Token: testToken, Channel: "#oncall", APIURL: f.URL + "/api/", Redactor: red})
	if err != nil {
		t.Fatal(err)
	}
	a := keyAlert(ReasonProbeFailing, "create_ticket", "wf-secret")
	a.Details.LastError = "GET http://tickets.internal/v1/tickets?key=wf-secret&api=" + url.QueryEscape(queryToken) +
		": 401 {\"echo\":\"Bearer " + headerTok + "\"} (sql: dial postgres://app:" + dbPass + "@db/x; password " + dbPass + ")"
	a.Details.Note = "raw " + queryToken
	b.raise(t, a)
	b.run(t, b.dispatcher(notifier, nil, func(c *Config) { c.Redactor = red }))
	got := f.accepted()
	if len(got) != 1 {
		t.Fatalf("%d messages accepted", len(got))
	}
	body := string(got[0].Raw)
	if u, err := url.QueryUnescape(body); err == nil {
		body += u // the bot notifier posts a form
	}
	for _, s := range []string{"tickets-token", headerTok, dbPass} {
		if strings.Contains(body, s) {
			t.Errorf("Slack received %q:\n%s", s, body)
		}
	}
	if !strings.Contains(body, secret.Mask) {
		t.Errorf("no mask in the message: %s", body)
	}
	// The rest of the error is still there for on-call.
	if !strings.Contains(body, "401") || !strings.Contains(body, "tickets.internal") {
		t.Errorf("redaction took more than the secrets: %s", body)
	}
}

// A delivery error that quotes a registered secret is stored, logged and
// reported without it.
func TestDeliveryErrorsLoseRegisteredSecrets(t *testing.T) {
	t.Parallel()
	const proxyPass = "proxy-pass-5555"
	red := secret.New()
	red.Register(proxyPass)
	b := setup(t)
	failing := notifierFunc(func(Message) (bool, error) {
		return true, &DeliveryError{Class: ClassRetryable, Err: errString("proxy at http://u:" + proxyPass + "@proxy refused " + proxyPass)}
	})
	b.raise(t, keyAlert(ReasonProbeFailing, "create_ticket", "wf-1"))
	rep := b.run(t, b.dispatcher(failing, nil, func(c *Config) { c.Redactor = red }))
	var stored string
	if err := b.db.Pool.QueryRow(b.ctx, `SELECT coalesce(string_agg(last_error, ' '), '') FROM alert_outbox`).Scan(&stored); err != nil {
		t.Fatal(err)
	}
	for what, s := range map[string]string{"report": rep.LastError, "outbox": stored, "logs": b.logs.String()} {
		if strings.Contains(s, proxyPass) {
			t.Errorf("%s shows the secret: %s", what, s)
		}
	}
	if rep.LastError == "" {
		t.Fatal("no delivery error reported")
	}
}

type notifierFunc func(Message) (bool, error)

func (f notifierFunc) Notify(_ context.Context, m Message) (bool, error) { return f(m) }

type errString string

func (e errString) Error() string { return string(e) }
