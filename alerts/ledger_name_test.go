package alerts

import (
	"encoding/json"
	"fmt"
	"strings"
	"testing"
	"unicode/utf8"

	"github.com/slack-go/slack"
)

// A control's value names its ledger unambiguously: the first "|" ends the
// name, whatever the key holds; anything else (a bare key, a name a ledger
// cannot have, no key, a key wider than the column) is refused.
func TestLedgerValueParsesStrictly(t *testing.T) {
	long := strings.Repeat("k", 128)
	for _, tc := range []struct {
		ledger, key string
	}{
		{"billing", "wf-8812:step-3:create_ticket"},
		{"eu-west_2", "a|b|c"},
		{"0", "|"},
		{strings.Repeat("l", 63), long},
	} {
		v := ControlValue(tc.ledger, tc.key)
		l, k, ok := ParseLedgerValue(v)
		if !ok || l != tc.ledger || k != tc.key {
			t.Errorf("ParseLedgerValue(%q) = %q, %q, %v; want %q, %q", v, l, k, ok, tc.ledger, tc.key)
		}
	}
	if v := ControlValue("", "a|b"); v != "a|b" {
		t.Errorf("the one ledger's value = %q, want the key itself", v)
	}
	for _, v := range []string{
		"wf-8812:step-3:create_ticket", // a bare key
		"",
		"|key",
		"billing|",
		"Billing|key",
		"-billing|key",
		"_billing|key",
		"bill ing|key",
		"billing:x|key",
		strings.Repeat("l", 64) + "|key",
		"billing|" + long + "k",
	} {
		if l, k, ok := ParseLedgerValue(v); ok {
			t.Errorf("ParseLedgerValue(%q) = %q, %q, true; want refused", v, l, k)
		}
	}
}

// A named ledger's message says which ledger it is about, in its header,
// its notification text and every command it quotes (--ledger NAME), and
// every control carries the ledger: buttons, menu options and the picker,
// each parsing back to the ledger and its key. Within Slack's limits.
func TestRenderNamedLedger(t *testing.T) {
	r := newRenderer(testRunbook, 2).withInteractive(true).withLedger("billing")
	items := fixtureItems()
	items = append(items, item{id: 4, reason: ReasonProbeFailing, kind: KindFiring, tool: "t", key: "-starts-like-a-flag"})

	first := items[0]
	first.reason = ReasonNoProbe
	one := r.render(KindFiring, ReasonNoProbe, []item{first}, fixtureNow)
	checkMessage(t, r, one)
	kinds, texts := messageTexts(t, one)
	if kinds[0] != "header/plain_text" || texts[0] != "🔴 No probe configured: 1 key · ledger billing" {
		t.Errorf("header %s %q", kinds[0], texts[0])
	}
	if !strings.HasPrefix(one.Text, "[FIRING] Ledger `billing`: No probe configured") {
		t.Errorf("notification text %q", one.Text)
	}
	all := strings.Join(texts, "\n")
	for _, want := range []string{
		"```ledgerkeeper inspect --ledger billing wf-8812:step-3:create_ticket```",
		"ledgerkeeper resolve --ledger billing wf-8812:step-3:create_ticket --retryable",
		"ledgerkeeper resolve --ledger billing wf-8812:step-3:create_ticket --completed",
	} {
		if !strings.Contains(all, want) {
			t.Errorf("no %q in the message: %s", want, all)
		}
	}
	acts, _ := controls(t, one)
	for _, b := range acts[0] {
		if l, k, ok := ParseLedgerValue(b["value"].(string)); !ok || l != "billing" || k != items[0].key {
			t.Errorf("button %s value %q: not billing's key", b["action_id"], b["value"])
		}
	}
	confirm, _ := json.Marshal(acts[0][2]["confirm"])
	if !strings.Contains(string(confirm), "The next retry of wf-8812:step-3:create_ticket (ledger billing) will run create_ticket again") {
		t.Errorf("Mark retryable's confirmation: %s", confirm)
	}

	// Grouped, listing 2 of 4: menus and the picker carry the ledger; a key
	// that looks like a flag comes after "--".
	grouped := r.render(KindFiring, ReasonProbeFailing, items, fixtureNow)
	checkMessage(t, r, grouped)
	acts, menus := controls(t, grouped)
	if len(menus) != 2 || len(acts) != 1 {
		t.Fatalf("grouped: %d menus, %d actions blocks; want 2 and the picker", len(menus), len(acts))
	}
	for i, m := range menus {
		for _, o := range m[0]["options"].([]any) {
			id, v, _ := ParseMenuValue(o.(map[string]any)["value"].(string))
			if l, k, ok := ParseLedgerValue(v); !ok || l != "billing" || k != items[i].key || actionIDs[id] == "" {
				t.Errorf("menu %d option %v: not an action on billing's key", i, o)
			}
		}
	}
	for i, o := range acts[0][0]["options"].([]any) {
		if l, k, ok := ParseLedgerValue(o.(map[string]any)["value"].(string)); !ok || l != "billing" || k != items[2+i].key {
			t.Errorf("picker option %d %v: not billing's key", i, o)
		}
	}
	_, texts = messageTexts(t, grouped)
	all = strings.Join(texts, "\n")
	for _, want := range []string{"list them with `ledgerkeeper status --ledger billing`", "[FIRING] Ledger `billing`: Probe failing: 4 keys"} {
		if !strings.Contains(all, want) {
			t.Errorf("no %q in the grouped message: %s", want, all)
		}
	}
	if got := inspectCommandIn("billing", items[3]); got != "```ledgerkeeper inspect --ledger billing -- -starts-like-a-flag```" {
		t.Errorf("inspect of a flag-like key: %s", got)
	}

	resolved := r.render(KindResolved, ReasonProbeFailing, items[:1], fixtureNow)
	if _, texts := messageTexts(t, resolved); texts[0] != "✅ Resolved: Probe failing (1 key) · ledger billing" {
		t.Errorf("resolved header %q", texts[0])
	}
	if a, m := controls(t, resolved); len(a)+len(m) != 0 {
		t.Error("a resolved notice carries controls")
	}
}

var actionIDs = map[string]string{ActionIDInspect: "inspect", ActionIDHold: "hold", ActionIDRelease: "release", ActionIDRetryable: "retryable", ActionIDStoreOutcome: "outcome"}

// At the limits of a ledger's name (63 bytes) and a key (128): every
// value within Slack's (2000 for a button, 150 for an option: keys whose
// option would not fit get no menu and no picker entry, as a long key
// always had none), and a one-key message's buttons still carry both.
func TestRenderNamedLedgerLimits(t *testing.T) {
	name := strings.Repeat("l", 63)
	r := newRenderer(testRunbook, 1000).withInteractive(true).withLedger(name)
	for _, width := range []int{20, 75, 128} {
		var items []item
		for i := range 120 {
			items = append(items, item{id: int64(i), tool: "t", key: fmt.Sprintf("%03d", i) + strings.Repeat("k", width-3)})
		}
		for _, n := range []int{1, len(items)} {
			m := r.render(KindFiring, ReasonNoProbe, items[:n], fixtureNow)
			checkMessage(t, r, m)
			raw, _ := json.Marshal(slack.Blocks{BlockSet: m.Blocks})
			for _, v := range regexpValues.FindAllStringSubmatch(string(raw), -1) {
				if utf8.RuneCountInString(v[1]) > 2000 {
					t.Errorf("width %d: a value of %d characters", width, utf8.RuneCountInString(v[1]))
				}
			}
			acts, menus := controls(t, m)
			for _, a := range acts {
				for _, el := range a {
					if v, ok := el["value"].(string); ok {
						if _, _, ok := ParseLedgerValue(v); !ok {
							t.Errorf("width %d: button value %q names no ledger", width, v)
						}
					}
					opts, _ := el["options"].([]any)
					for _, o := range opts {
						if v := o.(map[string]any)["value"].(string); utf8.RuneCountInString(v) > maxOptionValue {
							t.Errorf("width %d: picker value of %d characters", width, utf8.RuneCountInString(v))
						}
					}
				}
			}
			for _, mm := range menus {
				for _, o := range mm[0]["options"].([]any) {
					if v := o.(map[string]any)["value"].(string); utf8.RuneCountInString(v) > maxOptionValue {
						t.Errorf("width %d: menu value of %d characters", width, utf8.RuneCountInString(v))
					}
				}
			}
			if n == 1 && (len(acts) != 1 || len(acts[0]) != 4) {
				t.Errorf("width %d: one key: %d actions blocks, want its 4 buttons", width, len(acts))
			}
			if n > 1 && width == 20 && len(menus) == 0 {
				t.Errorf("width 20: no menus, though their values fit")
			}
		}
	}
}

// A dispatcher refuses a ledger name the configuration could not have
// given: it would make values no handler can route.
func TestDispatcherRefusesABadLedgerName(t *testing.T) {
	for _, name := range []string{"Billing", "bill|ing", "-x", strings.Repeat("l", 64)} {
		func() {
			defer func() {
				if recover() == nil {
					t.Errorf("Config.Ledger %q accepted", name)
				}
			}()
			Config{Ledger: name}.withDefaults().mustValidate()
		}()
	}
	Config{Ledger: "billing"}.withDefaults().mustValidate()
}

// A named ledger's message links each key, and a tool's alert the tool's
// self-checks, to that ledger's pages of the fleet's console
// (/ui/ledgers/NAME/), values escaped as for one ledger.
func TestNamedLedgerLinksToItsConsolePages(t *testing.T) {
	r := newRenderer(testRunbook, 20).withConsole("https://lk.example.com/").withLedger("billing")
	items := fixtureItems()
	items[0].key = "ord-7|<evil>&x"
	_, texts := messageTexts(t, r.render(KindFiring, ReasonProbeFailing, items, fixtureNow))
	all := strings.Join(texts, "\n")
	if want := "<https://lk.example.com/ui/ledgers/billing/key?key=ord-7%7C%3Cevil%3E%26x|open in the console>"; !strings.Contains(all, want) {
		t.Errorf("no link %q in:\n%s", want, all)
	}
	if strings.Contains(all, "lk.example.com/ui/key?") {
		t.Errorf("a link to the one ledger's pages in a named ledger's message:\n%s", all)
	}
	tool := item{reason: ReasonDownstreamUnreachable, tool: "tickets"}
	_, texts = messageTexts(t, r.render(KindFiring, ReasonDownstreamUnreachable, []item{tool}, fixtureNow))
	if want := "<https://lk.example.com/ui/ledgers/billing/checks#tool-tickets|open the tool in the console>"; !strings.Contains(strings.Join(texts, "\n"), want) {
		t.Errorf("tool alert: no link %q in:\n%s", want, strings.Join(texts, "\n"))
	}
}
