package daemon

import (
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

	"github.com/slack-go/slack"

	"github.com/ledgerkeeper/ledgerkeeper/alerts"
	"github.com/ledgerkeeper/ledgerkeeper/internal/pgtest"
	"github.com/ledgerkeeper/ledgerkeeper/internal/slacktest"
	"github.com/ledgerkeeper/ledgerkeeper/ledger"
	"github.com/ledgerkeeper/ledgerkeeper/ledger/ledgertest/testwait"
	"github.com/ledgerkeeper/ledgerkeeper/migrations"
	"github.com/ledgerkeeper/ledgerkeeper/operator"
	"github.com/ledgerkeeper/ledgerkeeper/store"
)

const (
	fleetToken   = "xoxb-4242-FLEETBOTTOKEN"
	fleetSecret  = "5c3d1a0b9e8f7c6d8f1e0c9d2b7a4e6f"
	fleetChannel = "C0FLEET"
	fleetAlice   = "U0ALICE"
	fleetTool    = "create_ticket"
	// fleetKey is stuck in both ledgers: the same key, two rows.
	fleetKey = "wf-8812:step-3|create_ticket"
)

// fleetRig is a serve process keeping two ledgers, billing and support, in
// two schemas of one database, posting to one Slack channel and taking
// its actions through one handler (BuildFleetInteractivity).
type fleetRig struct {
	db   *pgtest.DB
	srv  *slacktest.Server
	in   *Interactivity
	http *httptest.Server
	// pools by ledger name; ts: each ledger's alert message.
	pools map[string]*ledger.SchemaDB
	ts    map[string]string
	logs  *lockedBuffer
}

type lockedBuffer struct {
	mu sync.Mutex
	b  strings.Builder
}

func (l *lockedBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *lockedBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

func newFleetRig(t *testing.T) *fleetRig {
	t.Helper()
	ctx := context.Background()
	r := &fleetRig{db: pgtest.NewEmpty(t), srv: slacktest.New(t, fleetToken),
		pools: map[string]*ledger.SchemaDB{}, ts: map[string]string{}, logs: &lockedBuffer{}}
	top, err := settle(t, `alerts:
  slack:
    token: `+fleetToken+`
    channel: `+fleetChannel+`
    api_url: `+r.srv.APIURL()+`
    interactive: true
    signing_secret: `+fleetSecret+`
    operators: {`+fleetAlice+`: alice}
`, envOf(nil))
	if err != nil {
		t.Fatal(err)
	}
	windows := func(string) (time.Duration, time.Duration) { return time.Minute, time.Minute }
	var targets []LedgerTarget
	for _, name := range []string{"billing", "support"} {
		if _, err := migrations.Apply(ctx, r.db.Pool, migrations.Options{Schema: name}); err != nil {
			t.Fatalf("migrate schema %s: %v", name, err)
		}
		pool, err := ledger.InSchema(r.db.Pool, name)
		if err != nil {
			t.Fatal(err)
		}
		r.pools[name] = pool
		targets = append(targets, LedgerTarget{Name: name, Config: top, Pool: pool, Windows: windows})
	}
	r.in, err = BuildFleetInteractivity(top, targets, slog.New(slog.NewTextHandler(r.logs, nil)))
	if err != nil {
		t.Fatal(err)
	}
	if r.in == nil || r.in.HTTP == nil {
		t.Fatal("BuildFleetInteractivity: no handler or no HTTP transport")
	}
	r.http = httptest.NewServer(r.in.HTTP)
	t.Cleanup(r.http.Close)
	t.Cleanup(r.in.Handler.Stop)

	// The same key stuck in both ledgers, each alerted by its own
	// dispatcher to the one channel.
	for _, name := range []string{"billing", "support"} {
		pool := r.pools[name]
		if _, err := pool.Exec(ctx, `INSERT INTO idempotency_keys (key, tool, request_hash, status, created_at, claimed_at, expires_at)
			VALUES ($1, $2, 'h', 'processing', now() - interval '2 hours', now() - interval '2 hours', now() + interval '1 day')`, fleetKey, fleetTool); err != nil {
			t.Fatal(err)
		}
		if _, err := alerts.Raise(ctx, pool, alerts.Alert{Reason: alerts.ReasonNoProbe, Tool: fleetTool, Key: fleetKey}, time.Hour); err != nil {
			t.Fatal(err)
		}
		n, err := alerts.NewSlack(alerts.SlackConfig{Token: fleetToken, Channel: fleetChannel, APIURL: r.srv.APIURL()})
		if err != nil {
			t.Fatal(err)
		}
		d := alerts.New(pool, alerts.Config{Owner: "test-" + name, Interactive: true, Ledger: name,
			Held: func(ctx context.Context, keys []string) (map[string]bool, error) {
				return store.HeldKeys(ctx, pool, keys)
			}}, n, nil, nil)
		rep, err := d.RunOnce(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if rep.Messages != 1 || rep.Delivered != 1 {
			t.Fatalf("%s's dispatcher posted %d messages carrying %d alerts, want 1 and 1", name, rep.Messages, rep.Delivered)
		}
		posts := r.srv.Calls("chat.postMessage")
		text := posts[len(posts)-1].Field("text")
		for _, m := range r.srv.Messages() {
			if m.Text == text {
				r.ts[name] = m.TS
			}
		}
		if r.ts[name] == "" {
			t.Fatalf("%s's message not stored", name)
		}
	}
	if r.ts["billing"] == r.ts["support"] {
		t.Fatal("both ledgers' alerts in one message")
	}
	return r
}

// status is key's status in schema, read with the schema written out.
func (r *fleetRig) status(t *testing.T, schema string) string {
	t.Helper()
	var st string
	if err := r.db.Pool.QueryRow(context.Background(), `SELECT status FROM "`+schema+`".idempotency_keys WHERE key = $1`, fleetKey).Scan(&st); err != nil {
		t.Fatalf("status in %s: %v", schema, err)
	}
	return st
}

// count counts rows of a table of schema about fleetKey.
func (r *fleetRig) count(t *testing.T, schema, table string) int {
	t.Helper()
	return r.db.Count(t, `"`+schema+`".`+table+` WHERE key = $1`, fleetKey)
}

// ledgerState is everything an action may change about fleetKey in one
// ledger.
type ledgerState struct {
	Status                   string
	Holds, Audit, OpenAlerts int
	Actors                   string
}

func (r *fleetRig) state(t *testing.T, schema string) ledgerState {
	t.Helper()
	rows, err := r.db.Pool.Query(context.Background(), `SELECT actor FROM "`+schema+`".reconcile_audit WHERE key = $1 ORDER BY id`, fleetKey)
	if err != nil {
		t.Fatal(err)
	}
	var actors []string
	for rows.Next() {
		var a string
		if err := rows.Scan(&a); err != nil {
			t.Fatal(err)
		}
		actors = append(actors, a)
	}
	rows.Close()
	return ledgerState{
		Status:     r.status(t, schema),
		Holds:      r.count(t, schema, "key_holds"),
		Audit:      r.count(t, schema, "reconcile_audit"),
		OpenAlerts: r.db.Count(t, `"`+schema+`".alert_state WHERE subject = $1 AND resolved_at IS NULL`, "key:"+fleetKey),
		Actors:     strings.Join(actors, ", "),
	}
}

// send posts cb signed, waits for the handler's follow-ups, and returns
// the acknowledgement body.
func (r *fleetRig) send(t *testing.T, cb slack.InteractionCallback) string {
	t.Helper()
	req := slacktest.SignedRequest(t, r.http.URL, fleetSecret, time.Now(), slacktest.Body(t, cb))
	resp, err := r.http.Client().Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("interaction: HTTP %d %s", resp.StatusCode, body)
	}
	ctx, cancel := context.WithTimeout(context.Background(), testwait.Timeout)
	defer cancel()
	if err := r.in.Handler.Settle(ctx); err != nil {
		t.Fatalf("follow-ups not done within %s: %v", testwait.Timeout, err)
	}
	return string(body)
}

// button is the button actionID of the message of ledger name, as posted.
func (r *fleetRig) button(t *testing.T, name, actionID string) slack.BlockAction {
	t.Helper()
	m, ok := r.srv.Message(fleetChannel, r.ts[name])
	if !ok {
		t.Fatalf("no message of %s", name)
	}
	var blocks []struct {
		Elements []struct {
			ActionID string `json:"action_id"`
			Value    string `json:"value"`
		} `json:"elements"`
	}
	if err := json.Unmarshal(m.Blocks, &blocks); err != nil {
		t.Fatal(err)
	}
	for _, b := range blocks {
		for _, e := range b.Elements {
			if e.ActionID == actionID {
				return slack.BlockAction{ActionID: actionID, Value: e.Value, Type: "button"}
			}
		}
	}
	t.Fatalf("no button %s on %s's message: %s", actionID, name, m.Blocks)
	return slack.BlockAction{}
}

func (r *fleetRig) lastReply(t *testing.T) string {
	t.Helper()
	calls := r.srv.Calls("response_url", "chat.postEphemeral")
	if len(calls) == 0 {
		t.Fatal("no answer to the user")
	}
	c := calls[len(calls)-1]
	if c.Method == "response_url" && c.JSON["response_type"] != "ephemeral" {
		t.Fatalf("answer is not ephemeral: %s", c.Raw)
	}
	return c.Field("text")
}

// One handler over two ledgers that hold the same stuck key: each
// ledger's message names its ledger and its controls carry it, and Mark
// retryable pressed on billing's message changes billing's row alone
// (audited as alice's act in ledger billing), support's row, audit and
// alert untouched, and only billing's message is updated.
func TestFleetActionActsOnTheLedgerItsMessageNames(t *testing.T) {
	r := newFleetRig(t)
	for _, name := range []string{"billing", "support"} {
		m, _ := r.srv.Message(fleetChannel, r.ts[name])
		var header []struct {
			Type string `json:"type"`
			Text struct {
				Text string `json:"text"`
			} `json:"text"`
		}
		if err := json.Unmarshal(m.Blocks, &header); err != nil {
			t.Fatal(err)
		}
		if want := "🔴 No probe configured: 1 key · ledger " + name; header[0].Type != "header" || header[0].Text.Text != want {
			t.Errorf("%s's header = %q, want %q", name, header[0].Text.Text, want)
		}
		if !strings.HasPrefix(m.Text, "[FIRING] Ledger `"+name+"`: ") {
			t.Errorf("%s's notification text does not name its ledger: %q", name, m.Text)
		}
		if !strings.Contains(string(m.Blocks), "ledgerkeeper inspect --ledger "+name+" ") {
			t.Errorf("%s's inspect command lacks --ledger %s: %s", name, name, m.Blocks)
		}
		if v := r.button(t, name, alerts.ActionIDRetryable).Value; v != name+"|"+fleetKey {
			t.Errorf("%s's Mark retryable value = %q, want %q", name, v, name+"|"+fleetKey)
		}
	}
	supportBefore := r.state(t, "support")

	r.send(t, r.srv.BlockActions(t, fleetAlice, fleetChannel, r.ts["billing"], r.button(t, "billing", alerts.ActionIDRetryable)))
	views := r.srv.Calls("views.open")
	if len(views) != 1 {
		t.Fatalf("%d forms opened, want 1; answer: %v", len(views), r.srv.Calls("response_url"))
	}
	if !strings.Contains(string(views[0].Raw), "billing") {
		t.Errorf("the form does not name the ledger: %s", views[0].Raw)
	}
	if ack := r.send(t, slacktest.ViewSubmission(t, views[0], fleetAlice,
		map[string]map[string]string{"reason": {"reason": "checked downstream: never happened"}})); strings.TrimSpace(ack) != "" {
		t.Fatalf("submission ack = %s, want empty", ack)
	}

	billing := r.state(t, "billing")
	if billing.Status != ledger.StatusFailedRetryable || billing.OpenAlerts != 0 {
		t.Errorf("billing after Mark retryable: %+v, want failed_retryable and no open alert", billing)
	}
	if billing.Actors != "slack:"+fleetAlice+" (ledger billing)" {
		t.Errorf("billing's audit actors = %q, want alice's act in ledger billing", billing.Actors)
	}
	if got := r.state(t, "support"); got != supportBefore || got.Status != ledger.StatusProcessing {
		t.Errorf("support changed: %+v, was %+v", got, supportBefore)
	}
	if reply := r.lastReply(t); !strings.HasPrefix(reply, "Ledger `billing`: Marked") {
		t.Errorf("the answer does not say which ledger: %q", reply)
	}
	updated := map[string]bool{}
	for _, c := range r.srv.Calls("chat.update") {
		updated[c.Field("ts")] = true
	}
	if !updated[r.ts["billing"]] || updated[r.ts["support"]] {
		t.Errorf("messages updated: %v; want billing's %s only", updated, r.ts["billing"])
	}
	m, _ := r.srv.Message(fleetChannel, r.ts["billing"])
	if strings.Contains(string(m.Blocks), alerts.ActionIDRetryable) || !strings.Contains(string(m.Blocks), "✅ Resolved: No probe configured (1 key) · ledger billing") {
		t.Errorf("billing's message after the act: %s", m.Blocks)
	}
	if m, _ := r.srv.Message(fleetChannel, r.ts["support"]); !strings.Contains(string(m.Blocks), alerts.ActionIDRetryable) {
		t.Errorf("support's message lost its buttons: %s", m.Blocks)
	}
}

// A control whose value names a ledger the process does not keep, names
// none, or is not a ledger's value at all changes nothing in either
// ledger, is told to the user and logged; so is a form whose private
// metadata names a ledger the process does not keep.
func TestFleetActionNamingNoKeptLedgerChangesNothing(t *testing.T) {
	r := newFleetRig(t)
	ctx := context.Background()
	states := func() map[string]ledgerState {
		return map[string]ledgerState{"billing": r.state(t, "billing"), "support": r.state(t, "support")}
	}
	unchanged := func(t *testing.T, before map[string]ledgerState) {
		t.Helper()
		for name, want := range before {
			if got := r.state(t, name); got != want {
				t.Errorf("%s changed: %+v, was %+v", name, got, want)
			}
		}
	}

	// A form carries its ledger in its private metadata; one naming a
	// ledger not kept (a configuration changed while it was open) writes
	// nothing, though billing's key could be marked retryable.
	before := states()
	r.send(t, r.srv.BlockActions(t, fleetAlice, fleetChannel, r.ts["billing"], r.button(t, "billing", alerts.ActionIDRetryable)))
	views := r.srv.Calls("views.open")
	if len(views) != 1 {
		t.Fatalf("%d forms opened, want 1", len(views))
	}
	view := slacktest.OpenedView(views[0]).(map[string]any)
	var meta map[string]any
	if err := json.Unmarshal([]byte(view["private_metadata"].(string)), &meta); err != nil {
		t.Fatal(err)
	}
	if meta["l"] != "billing" {
		t.Fatalf("the form's metadata does not carry its ledger: %v", meta)
	}
	for _, forged := range []any{"payroll", nil} {
		if forged == nil {
			delete(meta, "l")
		} else {
			meta["l"] = forged
		}
		b, _ := json.Marshal(meta)
		view["private_metadata"] = string(b)
		r.send(t, slacktest.ViewSubmission(t, view, fleetAlice, map[string]map[string]string{"reason": {"reason": "forged"}}))
		want := "opened for ledger `payroll`, which this ledgerkeeper does not keep now: nothing changed."
		if forged == nil {
			want = "That form names no ledger, and this ledgerkeeper keeps several (`billing`, `support`): nothing changed."
		}
		if reply := r.lastReply(t); !strings.Contains(reply, want) {
			t.Errorf("answer to the form naming %v = %q, want %q", forged, reply, want)
		}
		unchanged(t, before)
	}
	if !strings.Contains(r.logs.String(), "slack submission refused: its form names no ledger this process keeps") {
		t.Errorf("refused submission not logged: %s", r.logs.String())
	}

	// Release lifts a hold at once, no form between: held in both
	// ledgers, neither may lose its hold to a value not naming it.
	for _, name := range []string{"billing", "support"} {
		if _, err := operator.Hold(ctx, r.pools[name], operator.HoldRequest{Key: fleetKey, Reason: "investigating", Actor: "carol"}); err != nil {
			t.Fatal(err)
		}
	}
	before = states()
	for _, tc := range []struct {
		name, value, answer string
	}{
		{"unknown ledger", "payroll|" + fleetKey, "names ledger `payroll`, which this ledgerkeeper does not keep (it keeps `billing`, `support`): nothing changed."},
		{"no ledger", fleetKey, "names no ledger, and this ledgerkeeper keeps several (`billing`, `support`)"},
		{"not a ledger's name", "Billing|" + fleetKey, "names no ledger"},
		{"empty ledger", "|" + fleetKey, "names no ledger"},
		{"no key", "billing|", "names no ledger"},
		{"key too long", "billing|" + strings.Repeat("k", 129), "names no ledger"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			release := slack.BlockAction{ActionID: alerts.ActionIDRelease, Value: tc.value, Type: "button"}
			r.send(t, r.srv.BlockActions(t, fleetAlice, fleetChannel, r.ts["billing"], release))
			if reply := r.lastReply(t); !strings.Contains(reply, tc.answer) {
				t.Errorf("answer = %q, want it to say %q", reply, tc.answer)
			}
			unchanged(t, before)
		})
	}
	if !strings.Contains(r.logs.String(), "slack action refused: its control names no ledger this process keeps") {
		t.Errorf("refusals not logged: %s", r.logs.String())
	}
	if n := len(r.srv.Calls("chat.update")); n != 0 {
		t.Errorf("%d alert messages updated by refused actions", n)
	}

	// Release with the value billing's message carries (it was posted
	// before the hold, so it offers Hold) releases billing's key, and only
	// it.
	release := r.button(t, "billing", alerts.ActionIDHold)
	release.ActionID = alerts.ActionIDRelease
	r.send(t, r.srv.BlockActions(t, fleetAlice, fleetChannel, r.ts["billing"], release))
	if got := r.state(t, "billing"); got.Holds != 0 {
		t.Errorf("billing still held after its own Release: %+v", got)
	}
	if got := r.state(t, "support"); got != before["support"] {
		t.Errorf("support changed by billing's Release: %+v, was %+v", got, before["support"])
	}

	// Hold from billing's message holds billing's key, and the message
	// then offers Release of billing's key.
	r.send(t, r.srv.BlockActions(t, fleetAlice, fleetChannel, r.ts["billing"], r.button(t, "billing", alerts.ActionIDHold)))
	views = r.srv.Calls("views.open")
	r.send(t, slacktest.ViewSubmission(t, views[len(views)-1], fleetAlice, map[string]map[string]string{"reason": {"reason": "checking billing"}}))
	if got := r.state(t, "billing"); got.Holds != 1 {
		t.Errorf("billing not held after its own Hold: %+v", got)
	}
	if got := r.state(t, "support"); got != before["support"] {
		t.Errorf("support changed by billing's Hold: %+v, was %+v", got, before["support"])
	}
	if v := r.button(t, "billing", alerts.ActionIDRelease).Value; v != "billing|"+fleetKey {
		t.Errorf("billing's message offers Release of %q", v)
	}
}
