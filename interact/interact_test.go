package interact

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/slack-go/slack"

	"github.com/ledgerkeeper/ledgerkeeper/alerts"
	"github.com/ledgerkeeper/ledgerkeeper/internal/pgtest"
	"github.com/ledgerkeeper/ledgerkeeper/internal/secret"
	"github.com/ledgerkeeper/ledgerkeeper/internal/slacktest"
	"github.com/ledgerkeeper/ledgerkeeper/ledger"
	"github.com/ledgerkeeper/ledgerkeeper/ledger/ledgertest/testwait"
	"github.com/ledgerkeeper/ledgerkeeper/operator"
	"github.com/ledgerkeeper/ledgerkeeper/store"
)

const (
	hSecret  = "8f1e0c9d2b7a4e6f5c3d1a0b9e8f7c6d"
	hToken   = "xoxb-4242-TESTBOTTOKENSECRET"
	hChannel = "C0ALERTS"
	hAlice   = "U0ALICE" // every action
	hBob     = "U0BOB"   // inspect only
	hMallory = "U0MALLORY"
	hCarol   = "U0CAROL" // inspect and hold
	hTool    = "create_ticket"
)

var bg = context.Background()

// hWindows: a minute of window + grace and of heartbeat timeout.
func hWindows(string) (time.Duration, time.Duration) { return time.Minute, time.Minute }

// rig is one test's world: a ledger, a Slack, a handler behind its HTTP
// endpoint, and a firing alert posted by the real dispatcher.
type rig struct {
	db   *pgtest.DB
	srv  *slacktest.Server
	h    *Handler
	http *httptest.Server
	logs *syncLog
}

// newRig builds a rig; opts change the Handler's configuration.
func newRig(t *testing.T, opts ...func(*Config)) *rig {
	t.Helper()
	r := &rig{db: pgtest.New(t), srv: slacktest.New(t, hToken), logs: &syncLog{}}
	red := secret.New()
	red.Register(hToken)
	cfg := Config{
		Pool:  r.db.Pool,
		Slack: r.srv.Client(hToken),
		Operators: map[string]Operator{
			hAlice: {Name: "alice"},
			hBob:   {Name: "bob", Actions: []Action{ActionInspect}},
			hCarol: {Name: "carol <ops>", Actions: []Action{ActionInspect, ActionHold}},
		},
		Windows:  hWindows,
		Redactor: red,
		Logger:   slog.New(slog.NewTextHandler(r.logs, &slog.HandlerOptions{Level: slog.LevelDebug})),
		Now:      func() time.Time { return time.Date(2026, 12, 1, 13, 2, 0, 0, time.UTC) },
	}
	for _, o := range opts {
		o(&cfg)
	}
	h, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	r.h = h
	r.http = httptest.NewServer(h.HTTPHandler(hSecret))
	t.Cleanup(r.http.Close)
	defer t.Cleanup(h.Stop) // first of the cleanups: the follow-ups end before the checks
	t.Cleanup(func() {
		// Secrets never travel: not in logs, replies or messages.
		var all strings.Builder
		all.WriteString(r.logs.String())
		// (The bot token does go to Slack, as the form's token field.)
		for _, c := range r.srv.Calls("response_url", "chat.postEphemeral", "chat.update", "views.open") {
			all.WriteString(c.Field("text") + c.Field("blocks") + c.Field("view"))
		}
		for _, s := range []string{hSecret, hToken} {
			if strings.Contains(all.String(), s) {
				t.Errorf("a secret travelled: %q found in logs or Slack calls", s)
			}
		}
	})
	return r
}

// putKey inserts key in status st, claimed ago (the database's clock).
func (r *rig) putKey(t *testing.T, key, st string, ago time.Duration) {
	t.Helper()
	r.db.Exec(t, `INSERT INTO idempotency_keys (key, tool, request_hash, status, created_at, claimed_at, expires_at)
		VALUES ($1, $2, 'h', $3, now() - $4::interval, now() - $4::interval, now() + interval '1 day')`, key, hTool, st, ago)
}

// hold puts key on hold by carol, as the CLI does.
func (r *rig) hold(t *testing.T, key, reason string) {
	t.Helper()
	if _, err := operator.Hold(bg, r.db.Pool, operator.HoldRequest{Key: key, Reason: reason, Actor: "carol"}); err != nil {
		t.Fatal(err)
	}
}

func (r *rig) key(t *testing.T, key string) ledger.Key {
	t.Helper()
	k, err := ledger.Get(bg, r.db.Pool, key)
	if err != nil {
		t.Fatalf("get %q: %v", key, err)
	}
	return k
}

// alert raises a no_probe alert for each key and delivers it with the real
// dispatcher (interactive) to the test Slack; it returns the message's ts.
func (r *rig) alert(t *testing.T, keys ...string) string {
	t.Helper()
	for _, k := range keys {
		if _, err := alerts.Raise(bg, r.db.Pool, alerts.Alert{Reason: alerts.ReasonNoProbe, Tool: hTool, Key: k}, time.Hour); err != nil {
			t.Fatal(err)
		}
	}
	n, err := alerts.NewSlack(alerts.SlackConfig{Token: hToken, Channel: hChannel, APIURL: r.srv.APIURL()})
	if err != nil {
		t.Fatal(err)
	}
	before := len(r.srv.Calls("chat.postMessage"))
	d := alerts.New(r.db.Pool, alerts.Config{Owner: "test", Interactive: true,
		Held: func(ctx context.Context, keys []string) (map[string]bool, error) {
			return store.HeldKeys(ctx, r.db.Pool, keys)
		}}, n, nil, nil)
	if _, err := d.RunOnce(bg); err != nil {
		t.Fatal(err)
	}
	posts := r.srv.Calls("chat.postMessage")
	if len(posts) != before+1 {
		t.Fatalf("dispatcher posted %d messages, want 1", len(posts)-before)
	}
	for _, m := range r.srv.Messages() {
		if m.Text == posts[len(posts)-1].Field("text") && m.Channel == hChannel {
			return m.TS
		}
	}
	t.Fatal("posted message not stored")
	return ""
}

// button is the click on actionID for key as another message carries it
// (the key picker's answer, or the alert after an update the test does
// not wait for).
func button(actionID, key string) slack.BlockAction {
	return slack.BlockAction{ActionID: actionID, Value: key, Type: "button"}
}

// control finds the control with actionID in the message (a button, or
// the overflow menu's option for key) and returns the click on it.
func (r *rig) control(t *testing.T, ts, actionID, key string) slack.BlockAction {
	t.Helper()
	m, _ := r.srv.Message(hChannel, ts)
	var blocks []map[string]any
	if err := json.Unmarshal(m.Blocks, &blocks); err != nil {
		t.Fatal(err)
	}
	for _, b := range blocks {
		var els []any
		if e, ok := b["elements"].([]any); ok {
			els = e
		}
		if acc, ok := b["accessory"]; ok {
			els = append(els, acc)
		}
		for _, e := range els {
			el, _ := e.(map[string]any)
			if el["action_id"] == actionID && el["value"] == key {
				return slack.BlockAction{ActionID: actionID, Value: key, Type: slack.ActionType(el["type"].(string))}
			}
			if el["action_id"] == alerts.ActionIDMenu {
				for _, o := range el["options"].([]any) {
					if v := o.(map[string]any)["value"]; v == alerts.MenuValue(actionID, key) {
						return slack.BlockAction{ActionID: alerts.ActionIDMenu, Type: "overflow", SelectedOption: slack.OptionBlockObject{Value: v.(string)}}
					}
				}
			}
		}
	}
	t.Fatalf("no control %s for %q in the message: %s", actionID, key, m.Blocks)
	return slack.BlockAction{}
}

// send posts cb to the endpoint signed with secret at ts and returns the
// status and the acknowledgement body.
func (r *rig) send(t *testing.T, cb slack.InteractionCallback, secret string, at time.Time) (int, string) {
	t.Helper()
	return r.sendBody(t, slacktest.Body(t, cb), secret, at)
}

func (r *rig) sendBody(t *testing.T, body []byte, secret string, at time.Time) (int, string) {
	t.Helper()
	req := slacktest.SignedRequest(t, r.http.URL, secret, at, body)
	return r.do(t, req)
}

// do sends req and returns the status and the acknowledgement body, once
// the interaction's follow-ups (answers, updates, forms) are done.
func (r *rig) do(t *testing.T, req *http.Request) (int, string) {
	t.Helper()
	resp, err := r.http.Client().Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	settle(t, r.h)
	return resp.StatusCode, string(b)
}

// settle waits, up to testwait.Timeout, for h's follow-ups to be done.
func settle(t *testing.T, h *Handler) {
	t.Helper()
	ctx, cancel := context.WithTimeout(bg, testwait.Timeout)
	defer cancel()
	if err := h.Settle(ctx); err != nil {
		t.Fatalf("follow-ups not done within %s: %v", testwait.Timeout, err)
	}
}

// click sends user's click on the control and requires a 200.
func (r *rig) click(t *testing.T, user, ts string, act slack.BlockAction) {
	t.Helper()
	if code, body := r.send(t, r.srv.BlockActions(t, user, hChannel, ts, act), hSecret, time.Now()); code != http.StatusOK {
		t.Fatalf("click: HTTP %d %s", code, body)
	}
}

// submit sends user's submission of view with values and returns the
// acknowledgement (decoded; nil for an empty one).
func (r *rig) submit(t *testing.T, user string, view any, values map[string]map[string]string) map[string]any {
	t.Helper()
	code, body := r.send(t, slacktest.ViewSubmission(t, view, user, values), hSecret, time.Now())
	if code != http.StatusOK {
		t.Fatalf("submit: HTTP %d %s", code, body)
	}
	if strings.TrimSpace(body) == "" {
		return nil
	}
	var ack map[string]any
	if err := json.Unmarshal([]byte(body), &ack); err != nil {
		t.Fatalf("ack is not JSON: %v: %s", err, body)
	}
	return ack
}

func vals(kv ...string) map[string]map[string]string {
	out := map[string]map[string]string{}
	for i := 0; i+1 < len(kv); i += 2 {
		out[kv[i]] = map[string]string{kv[i]: kv[i+1]}
	}
	return out
}

// lastReply is the text of the newest ephemeral answer.
func (r *rig) lastReply(t *testing.T) string {
	t.Helper()
	calls := r.srv.Calls("response_url", "chat.postEphemeral")
	if len(calls) == 0 {
		t.Fatal("no answer to the user")
	}
	c := calls[len(calls)-1]
	if c.Method == "response_url" && c.JSON["response_type"] != "ephemeral" {
		t.Fatalf("answer is not ephemeral: %s", c.Raw)
	}
	return c.Field("text") + " " + c.Field("blocks")
}

func (r *rig) lastView(t *testing.T) slacktest.Call {
	t.Helper()
	calls := r.srv.Calls("views.open")
	if len(calls) == 0 {
		t.Fatal("no form opened")
	}
	return calls[len(calls)-1]
}

// auditRow is an audit entry minus what differs by design between Slack
// and the CLI (the key, the actor, the reason's byline, ids and times).
type auditRow struct {
	Tool, Verdict, Action, Evidence, Text string
	Attempt                               int
}

func (r *rig) audit(t *testing.T, key string) []auditRow {
	t.Helper()
	hist, err := store.History(bg, r.db.Pool, key, 100)
	if err != nil {
		t.Fatal(err)
	}
	var out []auditRow
	for _, e := range hist {
		// Slack's name goes where the CLI writes the reason (a release has
		// none: its note is the name alone).
		text := strings.ReplaceAll(strings.TrimPrefix(e.Error, "released (by alice via Slack)"), " (by alice via Slack)", "")
		evidence := strings.ReplaceAll(string(e.Evidence), " (by alice via Slack)", "")
		out = append(out, auditRow{Tool: e.Tool, Verdict: e.Verdict, Action: e.Action, Evidence: evidence, Text: text, Attempt: e.Attempt})
	}
	return out
}

func (r *rig) actors(t *testing.T, key string) []string {
	t.Helper()
	hist, err := store.History(bg, r.db.Pool, key, 100)
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, e := range hist {
		out = append(out, e.Actor+"|"+e.Error+"|"+string(e.Evidence))
	}
	return out
}

// keyState is what an action may change about a key: its row's outcome,
// its hold and its open alerts.
type keyState struct {
	Status   string
	Code     int
	Body     string
	Held     bool
	HoldText string
	Open     int
}

func (r *rig) state(t *testing.T, key string) keyState {
	t.Helper()
	k := r.key(t, key)
	s := keyState{Status: k.Status, Body: string(k.ResponseBody)}
	if k.ResponseCode != nil {
		s.Code = *k.ResponseCode
	}
	if h, err := store.GetHold(bg, r.db.Pool, key); err == nil {
		s.Held, s.HoldText = true, strings.TrimSuffix(h.Reason, " (by alice via Slack)")
	}
	s.Open = r.db.Count(t, "alert_state WHERE subject = $1 AND resolved_at IS NULL", "key:"+key)
	return s
}

func eq[T comparable](t *testing.T, what string, got, want T) {
	t.Helper()
	if got != want {
		t.Errorf("%s = %+v, want %+v", what, got, want)
	}
}

// Each button, from a firing alert posted by the real dispatcher, changes
// what its CLI twin (the operator call cmd/ledgerkeeper makes, with the
// same reason) changes on a twin key: the same row, hold, open alerts and
// audit rows, the actor being slack:<user id> and the operator's name in
// the reason. The user is answered, and the alert message gains a line
// saying who did what.
func TestEachActionMatchesItsCLITwin(t *testing.T) {
	for _, tc := range []struct {
		name string
		// prepare puts both keys in the state the action starts from.
		prepare func(t *testing.T, r *rig, key string)
		slack   func(t *testing.T, r *rig, ts, key string)
		cli     func(t *testing.T, r *rig, key string)
		line    string
		// settles: the action settles the key, so its buttons other than
		// Inspect leave the alert.
		settles bool
	}{
		{
			name: "hold",
			slack: func(t *testing.T, r *rig, ts, key string) {
				r.click(t, hAlice, ts, r.control(t, ts, alerts.ActionIDHold, key))
				if ack := r.submit(t, hAlice, slacktest.OpenedView(r.lastView(t)), vals(inReason, "checking the ticket system")); ack != nil {
					t.Fatalf("hold ack = %v, want empty (close)", ack)
				}
			},
			cli: func(t *testing.T, r *rig, key string) {
				if _, err := operator.Hold(bg, r.db.Pool, operator.HoldRequest{Key: key, Reason: "checking the ticket system", Actor: "alice"}); err != nil {
					t.Fatal(err)
				}
			},
			line: "alice put `%s` on hold at 13:02 UTC: checking the ticket system",
		},
		{
			name: "release",
			prepare: func(t *testing.T, r *rig, key string) {
				r.hold(t, key, "x")
			},
			slack: func(t *testing.T, r *rig, ts, key string) {
				r.click(t, hAlice, ts, r.control(t, ts, alerts.ActionIDRelease, key))
			},
			cli: func(t *testing.T, r *rig, key string) {
				if err := operator.Release(bg, r.db.Pool, operator.ReleaseRequest{Key: key, Actor: "alice"}); err != nil {
					t.Fatal(err)
				}
			},
			line: "alice released `%s` at 13:02 UTC",
		},
		{
			name: "mark retryable",
			slack: func(t *testing.T, r *rig, ts, key string) {
				r.click(t, hAlice, ts, r.control(t, ts, alerts.ActionIDRetryable, key))
				v := r.lastView(t)
				if !strings.Contains(string(v.Raw), "will run `"+hTool+"` again") {
					t.Errorf("the form does not say what the retry will do: %s", v.Raw)
				}
				r.submit(t, hAlice, slacktest.OpenedView(v), vals(inReason, "no ticket downstream"))
			},
			cli: func(t *testing.T, r *rig, key string) {
				if _, err := operator.Resolve(bg, r.db.Pool, operator.ResolveRequest{Key: key, Mark: operator.MarkRetryable, Reason: "no ticket downstream", Actor: "alice", Windows: hWindows}); err != nil {
					t.Fatal(err)
				}
			},
			line:    "alice marked `%s` retryable at 13:02 UTC",
			settles: true,
		},
		{
			name: "store outcome",
			slack: func(t *testing.T, r *rig, ts, key string) {
				r.click(t, hAlice, ts, r.control(t, ts, alerts.ActionIDStoreOutcome, key))
				ack := r.submit(t, hAlice, slacktest.OpenedView(r.lastView(t)), vals(inCode, "201", inBody, `{"id": "T-9"}`, inReason, "ticket T-9 exists"))
				if ack["response_action"] != "push" {
					t.Fatalf("outcome ack = %v, want a pushed confirmation", ack)
				}
				review, _ := json.Marshal(ack["view"])
				if !strings.Contains(string(review), "will receive *HTTP 201*") || !strings.Contains(string(review), `{\"id\":\"T-9\"}`) {
					t.Errorf("the confirmation does not say what every retry receives: %s", review)
				}
				if ack := r.submit(t, hAlice, ack["view"], nil); ack["response_action"] != "clear" {
					t.Fatalf("confirmation ack = %v, want clear", ack)
				}
			},
			cli: func(t *testing.T, r *rig, key string) {
				if _, err := operator.Resolve(bg, r.db.Pool, operator.ResolveRequest{Key: key, Mark: operator.MarkCompleted, Code: 201, Body: json.RawMessage(`{"id":"T-9"}`),
					Reason: "ticket T-9 exists", Actor: "alice", Windows: hWindows}); err != nil {
					t.Fatal(err)
				}
			},
			line:    "alice stored the outcome of `%s` (HTTP 201) at 13:02 UTC",
			settles: true,
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			r := newRig(t)
			const sk, ck = "wf-1:step-1:slack", "wf-1:step-1:cli"
			for _, k := range []string{sk, ck} {
				r.putKey(t, k, ledger.StatusProcessing, time.Hour)
				if tc.prepare != nil {
					tc.prepare(t, r, k)
				}
			}
			ts := r.alert(t, sk)
			if _, err := alerts.Raise(bg, r.db.Pool, alerts.Alert{Reason: alerts.ReasonNoProbe, Tool: hTool, Key: ck}, time.Hour); err != nil {
				t.Fatal(err)
			}
			tc.slack(t, r, ts, sk)
			tc.cli(t, r, ck)

			eq(t, "key state (slack vs cli)", r.state(t, sk), r.state(t, ck))
			got, want := r.audit(t, sk), r.audit(t, ck)
			if len(got) != len(want) {
				t.Fatalf("audit rows: slack %+v, cli %+v", got, want)
			}
			for i := range got {
				eq(t, "audit row", got[i], want[i])
			}
			acts := r.actors(t, sk)
			last := acts[len(acts)-1]
			if !strings.HasPrefix(last, "slack:"+hAlice+"|") || !strings.Contains(last, "(by alice via Slack)") {
				t.Errorf("audit actor|text = %q, want slack:%s and the operator's name", last, hAlice)
			}
			m, _ := r.srv.Message(hChannel, ts)
			line := strings.ReplaceAll(tc.line, "%s", sk)
			if !strings.Contains(string(m.Blocks), line) {
				t.Errorf("alert message lacks %q: %s", line, m.Blocks)
			}
			if !strings.Contains(string(m.Blocks), alerts.ActionIDInspect) {
				t.Errorf("alert message lost its blocks: %s", m.Blocks)
			}
			// A settled one-key alert reads as resolved, its Next advice gone.
			resolved := strings.Contains(string(m.Blocks), "✅ Resolved: No probe configured (1 key)") && !strings.Contains(string(m.Blocks), "*Next:*")
			if resolved != tc.settles {
				t.Errorf("alert message reads resolved: %v, want %v: %s", resolved, tc.settles, m.Blocks)
			}
			// A settled key keeps Inspect only; a held key offers Release,
			// a released one Hold, never both.
			held := tc.name == "hold"
			for id, want := range map[string]bool{
				alerts.ActionIDHold:         !tc.settles && !held,
				alerts.ActionIDRelease:      !tc.settles && held,
				alerts.ActionIDRetryable:    !tc.settles,
				alerts.ActionIDStoreOutcome: !tc.settles,
			} {
				if got := strings.Contains(string(m.Blocks), `"`+id+`"`); got != want {
					t.Errorf("alert message has the %s button: %v, want %v: %s", id, got, want, m.Blocks)
				}
			}
			if reply := r.lastReply(t); strings.Contains(reply, "Refused") || strings.Contains(reply, "That failed") {
				t.Errorf("answer = %s", reply)
			}
		})
	}
}

// Inspect answers the user alone with the row, the judgement, the hold and
// the last decisions, everything from the ledger escaped; it changes
// nothing.
func TestInspectAnswersEphemerally(t *testing.T) {
	t.Parallel()
	r := newRig(t)
	const key = "wf-2:<!channel>:step"
	r.putKey(t, key, ledger.StatusProcessing, time.Hour)
	r.hold(t, key, "look <@U123>")
	ts := r.alert(t, key)
	audit := r.db.Count(t, "reconcile_audit")
	r.click(t, hBob, ts, r.control(t, ts, alerts.ActionIDInspect, key))
	reply := r.lastReply(t)
	for _, want := range []string{"wf-2:&lt;!channel&gt;:step", "processing (held", "*Hold* by `carol`", "look &lt;@U123&gt;", "*Last decisions*", "`hold`"} {
		if !strings.Contains(reply, want) {
			t.Errorf("inspect answer lacks %q: %s", want, reply)
		}
	}
	if strings.Contains(reply, "<!channel>") || strings.Contains(reply, "<@U123>") {
		t.Errorf("ledger text reached Slack unescaped: %s", reply)
	}
	eq(t, "audit rows", r.db.Count(t, "reconcile_audit"), audit)
	if n := len(r.srv.Calls("chat.update")); n != 0 {
		t.Errorf("inspect updated the alert %d times", n)
	}
}

// A request not signed with the signing secret, or signed more than five
// minutes ago, is refused with 401 before anything happens.
func TestForgedAndStaleRequestsAreRefused(t *testing.T) {
	t.Parallel()
	r := newRig(t)
	const key = "wf-3:step"
	r.putKey(t, key, ledger.StatusProcessing, time.Hour)
	r.hold(t, key, "x")
	ts := r.alert(t, key)
	before := r.state(t, key)
	for _, tc := range []struct {
		name   string
		secret string
		at     time.Time
	}{
		{"forged signature", "not-the-signing-secret", time.Now()},
		{"stale timestamp", hSecret, time.Now().Add(-6 * time.Minute)},
		{"timestamp from the future", hSecret, time.Now().Add(6 * time.Minute)},
	} {
		cb := r.srv.BlockActions(t, hAlice, hChannel, ts, r.control(t, ts, alerts.ActionIDRelease, key))
		code, body := r.send(t, cb, tc.secret, tc.at)
		eq(t, tc.name+": status", code, http.StatusUnauthorized)
		if strings.Contains(body, hSecret) {
			t.Errorf("%s: the answer carries the secret", tc.name)
		}
	}
	// A body changed after signing.
	cb := r.srv.BlockActions(t, hAlice, hChannel, ts, r.control(t, ts, alerts.ActionIDRelease, key))
	req := slacktest.SignedRequest(t, r.http.URL, hSecret, time.Now(), slacktest.Body(t, cb))
	cb.User.ID = hMallory
	req.Body = io.NopCloser(bytes.NewReader(slacktest.Body(t, cb)))
	req.ContentLength = -1
	code, _ := r.do(t, req)
	eq(t, "tampered body: status", code, http.StatusUnauthorized)
	// No signature at all.
	plain, _ := http.NewRequest(http.MethodPost, r.http.URL, bytes.NewReader(slacktest.Body(t, cb)))
	code, _ = r.do(t, plain)
	eq(t, "unsigned: status", code, http.StatusUnauthorized)

	eq(t, "key state", r.state(t, key), before)
	eq(t, "audit rows", r.db.Count(t, "reconcile_audit WHERE key = $1", key), 1)
	eq(t, "seen-set rows", r.db.Count(t, "slack_seen"), 0)
	if n := len(r.srv.Calls("response_url", "chat.postEphemeral", "chat.update", "views.open")); n != 0 {
		t.Errorf("%d Slack calls after refused requests", n)
	}
}

// The same signed request twice: the second is refused (409). The same
// click re-delivered in a new request (a retry, the other transport,
// another replica) is acknowledged and ignored. One release, one audit row.
func TestReplayedRequestIsRefused(t *testing.T) {
	t.Parallel()
	r := newRig(t)
	const key = "wf-4:step"
	r.putKey(t, key, ledger.StatusProcessing, time.Hour)
	r.hold(t, key, "x")
	ts := r.alert(t, key)
	cb := r.srv.BlockActions(t, hAlice, hChannel, ts, r.control(t, ts, alerts.ActionIDRelease, key))
	body, at := slacktest.Body(t, cb), time.Now()
	code, _ := r.sendBody(t, body, hSecret, at)
	eq(t, "first: status", code, http.StatusOK)
	code, _ = r.sendBody(t, body, hSecret, at)
	eq(t, "replayed: status", code, http.StatusConflict)
	// Re-signed a second later: a new request, the same click.
	code, _ = r.sendBody(t, body, hSecret, at.Add(time.Second))
	eq(t, "same click again: status", code, http.StatusOK)
	// And through Handle directly, as Socket Mode delivers, on this
	// replica and on another one (its own Handler on the same ledger).
	other, err := New(r.h.cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(other.Stop)
	for _, h := range []*Handler{r.h, other} {
		if _, err := h.Handle(bg, cb); err != nil {
			t.Fatal(err)
		}
		settle(t, h)
	}
	eq(t, "release audit rows", r.db.Count(t, "reconcile_audit WHERE key = $1 AND action = 'release'", key), 1)
	eq(t, "answers", len(r.srv.Calls("response_url")), 1)

	// A form's submission delivered twice (two transports, two replicas):
	// handled once, the second acknowledged and closed without a word.
	r.click(t, hAlice, ts, r.control(t, ts, alerts.ActionIDHold, key))
	sub := slacktest.ViewSubmission(t, r.lastView(t), hAlice, vals(inReason, "again"))
	r.submit(t, hAlice, r.lastView(t), vals(inReason, "again"))
	if ack, err := other.Handle(bg, sub); err != nil || ack == nil || ack.(*slack.ViewSubmissionResponse).ResponseAction != slack.RAClear {
		t.Fatalf("second delivery: %v, %v", ack, err)
	}
	settle(t, other)
	eq(t, "hold audit rows", r.db.Count(t, "reconcile_audit WHERE key = $1 AND action = 'hold'", key), 2)
	eq(t, "answers", len(r.srv.Calls("response_url")), 2)
}

// A Slack user not in the operators list, or not allowed this action, is
// told exactly what is missing: not listed at all, or listed without this
// action (naming the actions they have); the attempt is audited on the key
// (actor slack:<user id>, saying the same) and nothing else changes: no
// form, no hold, no status.
func TestUnknownUserIsRefusedAndAudited(t *testing.T) {
	t.Parallel()
	r := newRig(t)
	const key = "wf-5:step"
	r.putKey(t, key, ledger.StatusProcessing, time.Hour)
	ts := r.alert(t, key)
	before := r.state(t, key)
	notListed := "is not in alerts.slack.operators, so you may take no action from Slack. Ask for it to be listed."
	for _, tc := range []struct {
		user, actionID string
		says, audit    string
	}{
		{hMallory, alerts.ActionIDRetryable,
			"You are not allowed to mark retryable from Slack: your Slack user ID U0MALLORY " + notListed,
			"Slack user U0MALLORY is not in alerts.slack.operators (tried: mark retryable)"},
		{hMallory, alerts.ActionIDInspect,
			"You are not allowed to inspect from Slack: your Slack user ID U0MALLORY " + notListed,
			"Slack user U0MALLORY is not in alerts.slack.operators (tried: inspect)"},
		{hBob, alerts.ActionIDHold,
			"You are not allowed to hold from Slack: as bob (Slack user ID U0BOB) you may inspect, and hold is not among your actions in alerts.slack.operators. Ask for it to be added.",
			"Slack user U0BOB (bob) lacks hold (has: inspect)"},
		{hCarol, alerts.ActionIDStoreOutcome,
			"You are not allowed to store outcome from Slack: as carol &lt;ops&gt; (Slack user ID U0CAROL) you may inspect or hold, and store outcome is not among your actions in alerts.slack.operators. Ask for it to be added.",
			"Slack user U0CAROL (carol <ops>) lacks store outcome (has: inspect, hold)"},
	} {
		r.click(t, tc.user, ts, r.control(t, ts, tc.actionID, key))
		reply := r.lastReply(t)
		if !strings.Contains(reply, tc.says) || !strings.Contains(reply, "Nothing changed; the attempt is in the key's audit trail.") {
			t.Errorf("%s %s: answer = %s\nwant %s", tc.user, tc.actionID, reply, tc.says)
		}
		eq(t, tc.user+" "+tc.actionID+": audit row", r.db.Count(t, "reconcile_audit WHERE key = $1 AND action = $2 AND actor = $3 AND error = $4",
			key, ActionSlackRefused, "slack:"+tc.user, tc.audit), 1)
	}
	// A form submitted by someone removed from the list since it opened.
	r.click(t, hAlice, ts, r.control(t, ts, alerts.ActionIDRetryable, key))
	cb := slacktest.ViewSubmission(t, slacktest.OpenedView(r.lastView(t)), hMallory, vals(inReason, "trust me"))
	if code, body := r.send(t, cb, hSecret, time.Now()); code != http.StatusOK || !strings.Contains(body, "clear") {
		t.Errorf("refused submission: HTTP %d %s", code, body)
	}
	eq(t, "key state", r.state(t, key), before)
	eq(t, "forms opened", len(r.srv.Calls("views.open")), 1)
	eq(t, "refusals audited", r.db.Count(t, "reconcile_audit WHERE key = $1 AND action = $2 AND verdict = 'operator'", key, ActionSlackRefused), 5)
	eq(t, "mallory's refusals", r.db.Count(t, "reconcile_audit WHERE key = $1 AND actor = $2", key, "slack:"+hMallory), 3)
	eq(t, "audit rows", r.db.Count(t, "reconcile_audit WHERE key = $1", key), 5)
}

// Two operators mark one key retryable at once (two forms submitted
// concurrently): exactly one decision is written, and the other is told
// why nothing happened.
func TestDoubleClickOneWins(t *testing.T) {
	t.Parallel()
	r := newRig(t)
	const key = "wf-6:step"
	r.putKey(t, key, ledger.StatusProcessing, time.Hour)
	ts := r.alert(t, key)
	var views []any
	for range 2 {
		r.click(t, hAlice, ts, r.control(t, ts, alerts.ActionIDRetryable, key))
		views = append(views, slacktest.OpenedView(r.lastView(t)))
	}
	start := make(chan struct{})
	var wg sync.WaitGroup
	for _, v := range views {
		cb := slacktest.ViewSubmission(t, v, hAlice, vals(inReason, "never happened"))
		wg.Add(1)
		go func() {
			defer wg.Done()
			<-start
			req := slacktest.SignedRequest(t, r.http.URL, hSecret, time.Now(), slacktest.Body(t, cb))
			resp, err := r.http.Client().Do(req)
			if err == nil {
				resp.Body.Close()
			}
		}()
	}
	close(start)
	wg.Wait()
	settle(t, r.h) // the answers follow the acknowledgements
	eq(t, "status", r.key(t, key).Status, ledger.StatusFailedRetryable)
	eq(t, "decisions", r.db.Count(t, "reconcile_audit WHERE key = $1 AND action = $2", key, store.ActionOperatorMarkedRetryable), 1)
	var won, told int
	for _, c := range r.srv.Calls("response_url") {
		switch text := c.Field("text"); {
		case strings.HasPrefix(text, "Marked"):
			won++
		case strings.HasPrefix(text, "Refused"):
			told++
		}
	}
	eq(t, "winners told", won, 1)
	eq(t, "losers told", told, 1)
}

// A key settled after the alert (here: the original attempt completed it)
// is refused at the click, and at the form's submission when it settles
// while the form is open; nothing changes.
func TestKeySettledAfterTheAlertIsRefused(t *testing.T) {
	t.Parallel()
	r := newRig(t)
	const key = "wf-7:step"
	r.putKey(t, key, ledger.StatusProcessing, time.Hour)
	ts := r.alert(t, key)
	// Open the form first, then the key settles.
	r.click(t, hAlice, ts, r.control(t, ts, alerts.ActionIDRetryable, key))
	view := slacktest.OpenedView(r.lastView(t))
	if err := ledger.Complete(bg, r.db.Pool, key, r.key(t, key).ClaimedAt, 201, json.RawMessage(`{"id":"T-1"}`)); err != nil {
		t.Fatal(err)
	}
	before, audit := r.state(t, key), r.db.Count(t, "reconcile_audit WHERE key = $1", key)
	r.submit(t, hAlice, view, vals(inReason, "never happened"))
	if reply := r.lastReply(t); !strings.Contains(reply, "Refused") || !strings.Contains(reply, "completed") {
		t.Errorf("submission answer = %s", reply)
	}
	// A new click on the settled key: told at once, no form.
	forms := len(r.srv.Calls("views.open"))
	r.click(t, hAlice, ts, r.control(t, ts, alerts.ActionIDStoreOutcome, key))
	if reply := r.lastReply(t); !strings.Contains(reply, "already completed") {
		t.Errorf("click answer = %s", reply)
	}
	eq(t, "forms opened", len(r.srv.Calls("views.open")), forms)
	eq(t, "key state", r.state(t, key), before)
	eq(t, "audit rows", r.db.Count(t, "reconcile_audit WHERE key = $1", key), audit)
	eq(t, "code", *r.key(t, key).ResponseCode, 201)
}

// The outcome form refuses a 5xx, a body that is not JSON and a missing
// reason inline, each under its field, and stores nothing.
func TestOutcomeFormValidatesInline(t *testing.T) {
	t.Parallel()
	r := newRig(t)
	const key = "wf-8:step"
	r.putKey(t, key, ledger.StatusProcessing, time.Hour)
	ts := r.alert(t, key)
	r.click(t, hAlice, ts, r.control(t, ts, alerts.ActionIDStoreOutcome, key))
	view := slacktest.OpenedView(r.lastView(t))
	for _, tc := range []struct {
		name   string
		values map[string]map[string]string
		field  string
		says   string
	}{
		{"5xx", vals(inCode, "503", inBody, `{}`, inReason, "r"), inCode, "5xx"},
		{"not a number", vals(inCode, "ok", inBody, `{}`, inReason, "r"), inCode, "number"},
		{"not JSON", vals(inCode, "200", inBody, `{id: 1}`, inReason, "r"), inBody, "JSON"},
		{"no reason", vals(inCode, "200", inBody, `{}`, inReason, " "), inReason, "reason"},
	} {
		ack := r.submit(t, hAlice, view, tc.values)
		errs, _ := ack["errors"].(map[string]any)
		if ack["response_action"] != "errors" || !strings.Contains(errs[tc.field].(string), tc.says) {
			t.Errorf("%s: ack = %v", tc.name, ack)
		}
	}
	// A 5xx reaching the confirmation anyway (a forged form) is refused by
	// the operator package, with no Force from Slack.
	m := meta{Key: key, Code: 503, Body: json.RawMessage(`{}`), Reason: "r", where: where{ResponseURL: r.srv.ResponseURL("x")}}
	rv := reviewModal(m)
	r.submit(t, hAlice, rv, nil)
	if reply := r.lastReply(t); !strings.Contains(reply, "5xx") {
		t.Errorf("5xx confirmation answer = %s", reply)
	}
	eq(t, "status", r.key(t, key).Status, ledger.StatusProcessing)
	eq(t, "audit rows", r.db.Count(t, "reconcile_audit WHERE key = $1", key), 0)
}

// The refusals of the CLI, from Slack: a held key, a key in flight.
func TestHeldAndInFlightKeysAreRefused(t *testing.T) {
	t.Parallel()
	r := newRig(t)
	const held, fresh = "wf-9:held", "wf-9:fresh"
	r.putKey(t, held, ledger.StatusProcessing, time.Hour)
	r.putKey(t, fresh, ledger.StatusProcessing, time.Second)
	r.hold(t, held, "mine")
	ts := r.alert(t, held, fresh)
	for _, tc := range []struct{ key, says string }{
		{held, "is on hold by carol: release it first"},
		{fresh, "is in flight"},
	} {
		before := r.state(t, tc.key)
		audit := r.db.Count(t, "reconcile_audit WHERE key = $1", tc.key)
		// Grouped message: the key's overflow menu.
		r.click(t, hAlice, ts, r.control(t, ts, alerts.ActionIDRetryable, tc.key))
		r.submit(t, hAlice, slacktest.OpenedView(r.lastView(t)), vals(inReason, "never happened"))
		if reply := r.lastReply(t); !strings.Contains(reply, tc.says) {
			t.Errorf("%s: answer = %s", tc.key, reply)
		}
		eq(t, tc.key+" state", r.state(t, tc.key), before)
		eq(t, tc.key+" audit rows", r.db.Count(t, "reconcile_audit WHERE key = $1", tc.key), audit)
	}
	if n := len(r.srv.Calls("chat.update")); n != 0 {
		t.Errorf("refusals updated the alert %d times", n)
	}
}

// The key picker of a message that lists fewer keys than it counts
// answers with the picked key's buttons, which act on the alert.
func TestPickerActsOnTheAlert(t *testing.T) {
	t.Parallel()
	r := newRig(t)
	var keys []string
	for i := range 25 {
		k := "wf-10:step-" + string(rune('a'+i))
		keys = append(keys, k)
		r.putKey(t, k, ledger.StatusProcessing, time.Hour)
	}
	ts := r.alert(t, keys...)
	m, _ := r.srv.Message(hChannel, ts)
	if !strings.Contains(string(m.Blocks), alerts.ActionIDPick) {
		t.Fatalf("no key picker in a message listing 20 of 25 keys: %s", m.Blocks)
	}
	// The picker lists the unlisted keys; pick the last.
	last := keys[len(keys)-1]
	if !strings.Contains(string(m.Blocks), `"value":"`+last+`"`) {
		t.Fatalf("picker lacks %s", last)
	}
	// Held: the picker's answer offers Release (Hold for a key not held).
	r.hold(t, last, "x")
	r.click(t, hAlice, ts, slack.BlockAction{ActionID: alerts.ActionIDPick, Type: "static_select", SelectedOption: slack.OptionBlockObject{Value: last}})
	reply := r.srv.Calls("response_url")
	var blocks []slack.Block
	raw, _ := json.Marshal(reply[len(reply)-1].JSON["blocks"])
	var bs slack.Blocks
	if err := json.Unmarshal(raw, &bs); err != nil {
		t.Fatal(err)
	}
	blocks = bs.BlockSet
	var hold *slack.BlockAction
	for _, b := range blocks {
		if ab, ok := b.(*slack.ActionBlock); ok {
			for _, e := range ab.Elements.ElementSet {
				if bt, ok := e.(*slack.ButtonBlockElement); ok && bt.ActionID == alerts.ActionIDRelease {
					hold = &slack.BlockAction{ActionID: bt.ActionID, Value: bt.Value, BlockID: ab.BlockID, Type: "button"}
				}
			}
		}
	}
	if hold == nil || strings.Contains(string(raw), alerts.ActionIDHold+`"`) {
		t.Fatalf("picker answer for a held key: want Release and no Hold: %s", raw)
	}
	// The click arrives from the ephemeral answer: no message blocks.
	cb := r.srv.BlockActions(t, hAlice, hChannel, ts, *hold)
	cb.Message = slack.Message{}
	cb.Container.IsEphemeral = true
	if code, body := r.send(t, cb, hSecret, time.Now()); code != http.StatusOK {
		t.Fatalf("HTTP %d %s", code, body)
	}
	if r.state(t, last).Held {
		t.Error("release from the picker's buttons did not release")
	}
	m, _ = r.srv.Message(hChannel, ts)
	if !strings.Contains(string(m.Blocks), "alice released `"+last+"`") {
		t.Errorf("alert not updated: %s", m.Blocks)
	}
}

// Claim: one winner among concurrent claims of one identity (replicas);
// an expired identity may be claimed again, and expired rows are deleted.
func TestClaimIsSharedAndExpires(t *testing.T) {
	t.Parallel()
	r := newRig(t)
	var wg sync.WaitGroup
	var mu sync.Mutex
	wins := 0
	for range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			ok, err := r.h.Claim(bg, "act:U1:1.2:lk_hold", time.Minute)
			if err != nil {
				t.Error(err)
			}
			if ok {
				mu.Lock()
				wins++
				mu.Unlock()
			}
		}()
	}
	wg.Wait()
	eq(t, "winners", wins, 1)
	r.db.Exec(t, `UPDATE slack_seen SET expires_at = now() - interval '1 second'`)
	r.db.Exec(t, `INSERT INTO slack_seen (id, expires_at) VALUES ('old', now() - interval '1 hour')`)
	ok, err := r.h.Claim(bg, "act:U1:1.2:lk_hold", time.Minute)
	if err != nil || !ok {
		t.Fatalf("expired identity: Claim = %v, %v; want true", ok, err)
	}
	eq(t, "expired rows left", r.db.Count(t, "slack_seen WHERE expires_at < now()"), 0)
}

// New refuses what would make every action fail.
func TestNewNeedsItsParts(t *testing.T) {
	t.Parallel()
	for _, cfg := range []Config{
		{},
		{Pool: new(pgxpool.Pool)},
		{Pool: new(pgxpool.Pool), Slack: slack.New("x"), Windows: hWindows, Operators: map[string]Operator{"U1": {Actions: []Action{"delete"}}}},
	} {
		if _, err := New(cfg); err == nil {
			t.Errorf("New(%+v) = nil error", cfg)
		}
	}
}

// An alert chat.update cannot edit (posted through an incoming webhook) is
// replaced through the click's response_url, its blocks kept.
func TestWebhookAlertIsUpdatedThroughResponseURL(t *testing.T) {
	t.Parallel()
	r := newRig(t)
	const key = "wf-11:step"
	r.putKey(t, key, ledger.StatusProcessing, time.Hour)
	r.hold(t, key, "x")
	ts := r.alert(t, key)
	r.srv.Fail("chat.update", "cant_update_message")
	r.click(t, hAlice, ts, r.control(t, ts, alerts.ActionIDRelease, key))
	m, _ := r.srv.Message(hChannel, ts)
	if !strings.Contains(string(m.Blocks), "alice released `"+key+"`") || !strings.Contains(string(m.Blocks), alerts.ActionIDInspect) {
		t.Errorf("alert not replaced with its blocks and the line: %s", m.Blocks)
	}
}
