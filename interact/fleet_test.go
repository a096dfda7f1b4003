package interact

import (
	"context"
	"encoding/json"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/slack-go/slack"

	"github.com/ledgerkeeper/ledgerkeeper/alerts"
	"github.com/ledgerkeeper/ledgerkeeper/ledger"
	"github.com/ledgerkeeper/ledgerkeeper/migrations"
	"github.com/ledgerkeeper/ledgerkeeper/operator"
	"github.com/ledgerkeeper/ledgerkeeper/store"
)

// A Handler over several ledgers needs each one named as a ledger may be
// and given its database; one over a single ledger needs its Pool.
func TestNewChecksItsLedgers(t *testing.T) {
	t.Parallel()
	db := &ledger.SchemaDB{}
	client := slack.New("xoxb-x")
	for _, tc := range []struct {
		name string
		cfg  Config
		want string
	}{
		{"no pool, no ledgers", Config{Slack: client}, "a database pool is required"},
		{"a ledger without a pool", Config{Slack: client, Ledgers: map[string]Ledger{"billing": {}}}, "ledger billing: a database pool is required"},
		{"a bad name", Config{Slack: client, Ledgers: map[string]Ledger{"Billing": {Pool: db}}}, `ledger name "Billing"`},
		{"a separator in a name", Config{Slack: client, Ledgers: map[string]Ledger{"a|b": {Pool: db}}}, `ledger name "a|b"`},
	} {
		if _, err := New(tc.cfg); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: New = %v, want an error saying %q", tc.name, err, tc.want)
		}
	}
	if _, err := New(Config{Slack: client, Ledgers: map[string]Ledger{"billing": {Pool: db}, "eu-2": {Pool: db}}}); err != nil {
		t.Errorf("two good ledgers refused: %v", err)
	}
}

// fleetHandler replaces r's handler with one over two ledgers, billing and
// support, in two schemas of r's database, and returns their pools.
func fleetHandler(t *testing.T, r *rig) map[string]*ledger.SchemaDB {
	t.Helper()
	pools := map[string]*ledger.SchemaDB{}
	ledgers := map[string]Ledger{}
	for _, name := range []string{"billing", "support"} {
		if _, err := migrations.Apply(bg, r.db.Pool, migrations.Options{Schema: name}); err != nil {
			t.Fatalf("migrate %s: %v", name, err)
		}
		p, err := ledger.InSchema(r.db.Pool, name)
		if err != nil {
			t.Fatal(err)
		}
		pools[name] = p
		ledgers[name] = Ledger{Pool: p, Windows: hWindows}
	}
	cfg := r.h.cfg
	cfg.Pool, cfg.Windows, cfg.Ledgers = nil, nil, ledgers
	h, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	r.h = h
	r.http = httptest.NewServer(h.HTTPHandler(hSecret))
	t.Cleanup(r.http.Close)
	t.Cleanup(h.Stop)
	return pools
}

// The key picker of a named ledger's message answers, naming the ledger,
// with buttons that carry it; Release there lifts the hold in that ledger
// and not in another holding the same key, and updates the alert.
func TestFleetPickerAnswersWithItsLedgersButtons(t *testing.T) {
	t.Parallel()
	r := newRig(t)
	pools := fleetHandler(t, r)
	var keys []string
	for i := range 25 {
		keys = append(keys, "wf-10:step-"+string(rune('a'+i)))
	}
	last := keys[len(keys)-1]
	for name, p := range pools {
		for _, k := range keys {
			if _, err := p.Exec(bg, `INSERT INTO idempotency_keys (key, tool, request_hash, status, created_at, claimed_at, expires_at)
				VALUES ($1, $2, 'h', 'processing', now() - interval '1 hour', now() - interval '1 hour', now() + interval '1 day')`, k, hTool); err != nil {
				t.Fatalf("%s: %v", name, err)
			}
		}
		if _, err := operator.Hold(bg, p, operator.HoldRequest{Key: last, Reason: "x", Actor: "carol"}); err != nil {
			t.Fatal(err)
		}
	}
	billing := pools["billing"]
	for _, k := range keys {
		if _, err := alerts.Raise(bg, billing, alerts.Alert{Reason: alerts.ReasonNoProbe, Tool: hTool, Key: k}, time.Hour); err != nil {
			t.Fatal(err)
		}
	}
	n, err := alerts.NewSlack(alerts.SlackConfig{Token: hToken, Channel: hChannel, APIURL: r.srv.APIURL()})
	if err != nil {
		t.Fatal(err)
	}
	d := alerts.New(billing, alerts.Config{Owner: "test", Interactive: true, Ledger: "billing",
		Held: func(ctx context.Context, keys []string) (map[string]bool, error) {
			return store.HeldKeys(ctx, billing, keys)
		}}, n, nil, nil)
	if _, err := d.RunOnce(bg); err != nil {
		t.Fatal(err)
	}
	msgs := r.srv.Messages()
	if len(msgs) != 1 {
		t.Fatalf("%d messages posted, want 1", len(msgs))
	}
	ts := msgs[0].TS
	value := "billing|" + last
	if !strings.Contains(string(msgs[0].Blocks), `"value":"`+value+`"`) {
		t.Fatalf("the picker does not offer %q: %s", value, msgs[0].Blocks)
	}

	r.click(t, hAlice, ts, slack.BlockAction{ActionID: alerts.ActionIDPick, Type: "static_select", SelectedOption: slack.OptionBlockObject{Value: value}})
	reply := r.srv.Calls("response_url")
	if len(reply) == 0 {
		t.Fatal("no answer to the pick")
	}
	if text := reply[len(reply)-1].Field("text"); !strings.HasPrefix(text, "Ledger `billing`: Actions on `"+last+"`") {
		t.Errorf("the picker's answer does not name the ledger: %q", text)
	}
	raw, _ := json.Marshal(reply[len(reply)-1].JSON["blocks"])
	var bs slack.Blocks
	if err := json.Unmarshal(raw, &bs); err != nil {
		t.Fatal(err)
	}
	var release *slack.BlockAction
	for _, b := range bs.BlockSet {
		ab, ok := b.(*slack.ActionBlock)
		if !ok {
			continue
		}
		for _, e := range ab.Elements.ElementSet {
			bt, ok := e.(*slack.ButtonBlockElement)
			if !ok {
				continue
			}
			if bt.Value != value {
				t.Errorf("button %s carries %q, want %q", bt.ActionID, bt.Value, value)
			}
			if bt.ActionID == alerts.ActionIDRelease {
				release = &slack.BlockAction{ActionID: bt.ActionID, Value: bt.Value, BlockID: ab.BlockID, Type: "button"}
			}
		}
	}
	if release == nil {
		t.Fatalf("no Release for the held key in the answer: %s", raw)
	}
	r.click(t, hAlice, ts, *release)
	if held, err := operator.Held(bg, billing, last); err != nil || held {
		t.Errorf("billing's key still held after Release (%v)", err)
	}
	if held, err := operator.Held(bg, pools["support"], last); err != nil || !held {
		t.Errorf("support's key released by billing's button (%v)", err)
	}
	if n := r.db.Count(t, `"support".reconcile_audit WHERE key = $1 AND actor LIKE 'slack:%'`, last); n != 0 {
		t.Errorf("%d audit rows of Slack acts in support", n)
	}
	if n := r.db.Count(t, `"billing".reconcile_audit WHERE key = $1 AND actor = $2`, last, "slack:"+hAlice+" (ledger billing)"); n != 1 {
		t.Errorf("%d audit rows of alice's Release in billing, want 1", n)
	}
	if len(r.srv.Calls("chat.update")) != 1 {
		t.Errorf("the alert was not updated once: %d updates", len(r.srv.Calls("chat.update")))
	}
}

// A Handler over one ledger reads a value as the bare key it always was,
// even one that looks like a named ledger's: nothing is routed elsewhere.
func TestOneLedgerReadsValuesAsBareKeys(t *testing.T) {
	t.Parallel()
	r := newRig(t)
	key := "billing|wf-1"
	r.putKey(t, key, ledger.StatusProcessing, time.Hour)
	r.hold(t, key, "x")
	ts := r.alert(t, key)
	r.click(t, hAlice, ts, r.control(t, ts, alerts.ActionIDRelease, key))
	if s := r.state(t, key); s.Held {
		t.Errorf("the key %q still held after its Release: %+v", key, s)
	}
}
