package alerts

import (
	"encoding/json"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/slack-go/slack"
)

var update = flag.Bool("update", false, "rewrite testdata/*.golden files")

// messageTexts returns every text object of a rendered message with its
// kind ("header", "mrkdwn", …) and the fallback as "fallback".
func messageTexts(t testing.TB, m Message) (kinds, texts []string) {
	t.Helper()
	raw, err := json.Marshal(slack.Blocks{BlockSet: m.Blocks})
	if err != nil {
		t.Fatalf("blocks do not marshal: %v", err)
	}
	var blocks []map[string]any
	if err := json.Unmarshal(raw, &blocks); err != nil {
		t.Fatal(err)
	}
	var walk func(owner string, v any)
	walk = func(owner string, v any) {
		switch x := v.(type) {
		case map[string]any:
			if ty, ok := x["type"].(string); ok && (ty == "mrkdwn" || ty == "plain_text") {
				kinds = append(kinds, owner+"/"+ty)
				texts = append(texts, x["text"].(string))
				return
			}
			for _, e := range x {
				walk(owner, e)
			}
		case []any:
			for _, e := range x {
				walk(owner, e)
			}
		}
	}
	for _, b := range blocks {
		walk(b["type"].(string), b)
	}
	return append(kinds, "fallback"), append(texts, m.Text)
}

// checkMessage asserts Slack's limits and that no text holds markup other
// than our own runbook links.
func checkMessage(t testing.TB, r renderer, m Message) {
	t.Helper()
	if len(m.Blocks) > maxBlocks {
		t.Fatalf("%d blocks", len(m.Blocks))
	}
	for _, b := range m.Blocks {
		if v, ok := b.(interface{ Validate() error }); ok {
			if err := v.Validate(); err != nil {
				t.Fatalf("slack-go rejects a %s block: %v", b.BlockType(), err)
			}
		}
	}
	kinds, texts := messageTexts(t, m)
	var ours []string
	for _, reason := range append(Reasons, m.Reason) {
		ours = append(ours, r.runbookRef(reason))
	}
	for i, s := range texts {
		n := utf8.RuneCountInString(s)
		switch {
		case n == 0 && kinds[i] != "fallback":
			t.Fatalf("empty %s text", kinds[i])
		case strings.HasPrefix(kinds[i], "header") && n > maxHeaderText:
			t.Fatalf("header of %d characters", n)
		case n > maxTextObject:
			t.Fatalf("%s text of %d characters", kinds[i], n)
		}
		if !utf8.ValidString(s) {
			t.Fatalf("%s text is not UTF-8", kinds[i])
		}
		if strings.HasSuffix(kinds[i], "plain_text") {
			continue // plain_text is never parsed for markup
		}
		rest := s
		for _, o := range ours {
			if strings.HasPrefix(o, "<") {
				rest = strings.ReplaceAll(rest, o, "")
			}
		}
		for _, bad := range []string{"<!", "<@", "<#", "<http", "<"} {
			if strings.Contains(rest, bad) {
				t.Fatalf("%s text holds %q: %q", kinds[i], bad, s)
			}
		}
		// Every & opens a whole entity: nothing was cut inside one.
		for j := strings.IndexByte(rest, '&'); j >= 0; j = strings.IndexByte(rest, '&') {
			tail := rest[j:]
			if !strings.HasPrefix(tail, "&amp;") && !strings.HasPrefix(tail, "&lt;") && !strings.HasPrefix(tail, "&gt;") {
				t.Fatalf("%s text has a broken entity at %q", kinds[i], tail[:min(len(tail), 8)])
			}
			rest = tail[1:]
		}
	}
}

var fixtureNow = time.Date(2026, 11, 30, 4, 20, 0, 0, time.UTC)

func fixtureItems() []item {
	created := fixtureNow.Add(-2*time.Hour - 13*time.Minute)
	claimed := fixtureNow.Add(-47 * time.Minute)
	return []item{
		{id: 1, reason: ReasonProbeFailing, kind: KindFiring, tool: "create_ticket", key: "wf-8812:step-3:create_ticket", attempts: 0,
			details: Details{Attempts: 4, CreatedAt: &created, ClaimedAt: &claimed, Verdict: "unknown",
				LastError: `GET http://tickets.internal/v1/tickets?idempotency_key=wf-8812%3Astep-3%3Acreate_ticket: 503 Service Unavailable: {"error":"upstream connect error or disconnect/reset before headers"}`}},
		{id: 2, reason: ReasonProbeFailing, kind: KindFiring, tool: "create_ticket", key: "wf-8820:step-1:create_ticket",
			details: Details{Attempts: 3, CreatedAt: &created, Verdict: "unknown", LastError: "context deadline exceeded (probe timeout 3s)"}},
		{id: 3, reason: ReasonProbeFailing, kind: KindFiring, tool: "charge_card", key: "order 77 <retry>",
			details: Details{Attempts: 5, CreatedAt: &created, Verdict: "unknown", LastError: "pq: relation \"charges\" does not exist"}},
	}
}

// TestRenderFixture pins the message on-call reads. testdata holds it as a
// Slack payload (paste into Block Kit Builder) and as plain text.
func TestRenderFixture(t *testing.T) {
	r := newRenderer(testRunbook, 20)
	m := r.render(KindFiring, ReasonProbeFailing, fixtureItems(), fixtureNow)
	checkMessage(t, r, m)
	payload, err := json.MarshalIndent(map[string]any{"text": m.Text, "blocks": m.Blocks}, "", "  ")
	if err != nil {
		t.Fatal(err)
	}
	_, texts := messageTexts(t, m)
	readable := strings.Join(texts, "\n\n") + "\n"
	golden(t, "probe_failing.payload.json.golden", string(payload)+"\n")
	golden(t, "probe_failing.txt.golden", readable)

	for _, want := range []string{
		"*Key* `wf-8812:step-3:create_ticket` · *tool* `create_ticket`",
		"*age* 2h13m · *attempts* 4 · *last verdict* unknown",
		"```ledgerkeeper inspect wf-8812:step-3:create_ticket```",
		"```ledgerkeeper inspect 'order 77 &lt;retry&gt;'```",
		"<" + testRunbook + "#probe_failing|runbook: probe_failing>",
	} {
		if !strings.Contains(readable, want) {
			t.Errorf("fixture message lacks %q", want)
		}
	}
}

func golden(t *testing.T, name, got string) {
	t.Helper()
	path := filepath.Join("testdata", name)
	if *update {
		if err := os.MkdirAll("testdata", 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(path, []byte(got), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	want, err := os.ReadFile(path)
	if err != nil {
		t.Fatalf("%v (run go test -update to create it)", err)
	}
	if string(want) != got {
		t.Errorf("%s differs from the rendered message (go test -update rewrites it):\n%s", path, got)
	}
}

func TestRenderEveryReasonAndKind(t *testing.T) {
	r := newRenderer("", 20)
	for _, reason := range append(Reasons, "from_a_newer_version") {
		for _, kind := range []Kind{KindFiring, KindResolved} {
			items := fixtureItems()
			for i := range items {
				items[i].reason, items[i].kind = reason, kind
				items[i].details.Resolution = "resolved by operator alice"
			}
			if reason == ReasonDownstreamUnreachable {
				items = []item{{reason: reason, kind: kind, tool: "charge_card", details: Details{Keys: 37, LastError: "dial tcp 10.0.0.7:5432: connect: connection refused"}}}
			}
			if reason == ReasonShardsUnreachable {
				items = []item{{reason: reason, kind: kind, details: Details{Node: "10.0.0.7:5432", Shards: []int64{102008, 102012}, ShardCount: 2,
					LastError: "connection to the remote node postgres@10.0.0.7:5432 failed", Resolution: "reachable again"}}}
			}
			m := r.render(kind, reason, items, fixtureNow)
			checkMessage(t, r, m)
			_, texts := messageTexts(t, m)
			all := strings.Join(texts, "\n")
			if !strings.Contains(all, "`runbook.md#"+anchorFor(reason)+"`") {
				t.Errorf("%s/%s: no runbook section named:\n%s", reason, kind, all)
			}
			if reason == ReasonDownstreamUnreachable && kind == KindFiring && !strings.Contains(all, "*keys affected* 37") {
				t.Errorf("tool-wide message:\n%s", all)
			}
			if reason == ReasonShardsUnreachable && (!strings.Contains(all, "*Citus worker* `10.0.0.7:5432`") || !strings.Contains(all, "1 worker")) {
				t.Errorf("a worker's message:\n%s", all)
			}
		}
	}
}

func TestRenderLimits(t *testing.T) {
	r := newRenderer(testRunbook, 1000) // capped by Slack's 50 blocks
	long := strings.Repeat("<&>", 2000)
	var items []item
	for i := range 80 {
		items = append(items, item{id: int64(i), tool: long, key: fmt.Sprintf("%d%s", i, long),
			details: Details{LastError: long, Note: long, Verdict: long, Resolution: long}})
	}
	for _, kind := range []Kind{KindFiring, KindResolved} {
		m := r.render(kind, ReasonDuplicate, items, fixtureNow)
		checkMessage(t, r, m)
		if len(m.Blocks) != maxBlocks {
			t.Errorf("%d blocks, want %d", len(m.Blocks), maxBlocks)
		}
	}
}

func TestRunbookURLMustBeSafe(t *testing.T) {
	for _, u := range []string{"javascript:alert(1)", "https://x/|<!channel>", "https://x/ y", "not a url", "https://x/>"} {
		if r := newRenderer(u, 20); r.runbookURL != "" {
			t.Errorf("kept runbook URL %q", u)
		}
	}
	r := newRenderer("https://wiki.example/runbook.md?a=1&b=2#old", 20)
	if got := r.runbookRef(ReasonNoProbe); got != "<https://wiki.example/runbook.md?a=1&amp;b=2#no_probe|runbook: no_probe>" {
		t.Errorf("runbook link %q", got)
	}
}

// The renderer's redactor, even empty (nil), masks what looks like a
// credential; registered values are tested in slack_secrets_test.go.
func TestScrubSecretsInProbeErrors(t *testing.T) {
	scrubSecrets := newRenderer("", 20).red.String
	for in, bad := range map[string]string{
		`Get "https://svc:hunter2pass@payments.internal/v1": EOF`: "hunter2pass",
		"401 with Authorization: Bearer abcdefghijklmnop":         "abcdefghijklmnop",
		"slack said no to xoxb-123-456-zzz":                       "zzz",
	} {
		if got := scrubSecrets(in); strings.Contains(got, bad) {
			t.Errorf("scrubSecrets(%q) = %q", in, got)
		}
	}
	if got := scrubSecrets("503 Service Unavailable"); got != "503 Service Unavailable" {
		t.Errorf("changed a plain error: %q", got)
	}
}

func TestShellQuote(t *testing.T) {
	for in, want := range map[string]string{
		"wf-8812:step-3:create_ticket": "wf-8812:step-3:create_ticket",
		"order 77":                     "'order 77'",
		"it's":                         `'it'\''s'`,
		"$(rm -rf /)":                  "'$(rm -rf /)'",
		"":                             "''",
	} {
		if got := shellQuote(in); got != want {
			t.Errorf("shellQuote(%q) = %q, want %q", in, got, want)
		}
	}
	if got := inspectCommand(item{key: "-rf"}); got != "```ledgerkeeper inspect -- -rf```" {
		t.Errorf("a key like a flag: %s", got)
	}
}

func TestEscTruncNeverCutsAnEntity(t *testing.T) {
	for max := 1; max < 20; max++ {
		got := escTrunc("a<b&c>d<<<<", max)
		if n := utf8.RuneCountInString(got); n > max {
			t.Fatalf("max %d: %q is %d long", max, got, n)
		}
		trimmed := strings.TrimSuffix(got, "…")
		for _, e := range []string{"&l", "&a", "&g", "&am", "&lt", "&gt", "&amp"} {
			if strings.HasSuffix(trimmed, e) {
				t.Fatalf("max %d: cut inside an entity: %q", max, got)
			}
		}
	}
	if got := escTrunc("abc", 3); got != "abc" {
		t.Errorf("fits exactly: %q", got)
	}
}

// FuzzRender: whatever the ledger or a downstream holds, a message keeps
// Slack's limits and carries no markup but our runbook links.
func FuzzRender(f *testing.F) {
	f.Add("<!channel>", "<@U123>", "<https://evil|runbook>", "note", "resolved by <!here>", uint8(3), true)
	f.Add("wf-1:step-1", "create_ticket", "503", "", "", uint8(0), false)
	f.Add("&lt;!channel&gt;", "`tool`", "```\n<#C1>\n```", "&", "", uint8(70), true)
	f.Add("\xff\xfe<", "\u2028<!", "<<<<<<", "<!subteam^S1|team>", "x", uint8(200), false)
	f.Add("", "", "<!channel> *bold*", "evil<!here>:5432", "`", uint8(0), true) // a worker (no tool, no key)
	f.Fuzz(func(t *testing.T, key, tool, lastErr, note, resolution string, n uint8, withURL bool) {
		url := ""
		if withURL {
			url = testRunbook + "?a=1&b=2"
		}
		r := newRenderer(url, int(n%60)).withInteractive(n%2 == 0)
		count := int(n%64) + 1
		reasons := append(append([]Reason{}, Reasons...), Reason(key))
		reason := reasons[int(n)%len(reasons)]
		created := fixtureNow.Add(-time.Duration(n) * time.Hour)
		var items []item
		for i := range count {
			k := key
			switch i % 3 {
			case 1:
				k = fmt.Sprintf("%s-%d", key, i)
			case 2:
				k = "" // tool-wide
			}
			items = append(items, item{id: int64(i), reason: reason, tool: tool, key: k,
				details: Details{Attempts: i, CreatedAt: &created, LastError: lastErr, Note: note, Resolution: resolution, Verdict: note, Keys: i,
					Node: note, Shards: []int64{int64(i), int64(n)}, ShardCount: i * int(n)}})
		}
		for _, kind := range []Kind{KindFiring, KindResolved} {
			checkMessage(t, r, r.render(kind, reason, items, fixtureNow))
		}
	})
}

// TestRunbookHasEveryReason: every message links to a runbook section, so
// each reason (and Slack delivery, which logs link to) must have one.
func TestRunbookHasEveryReason(t *testing.T) {
	b, err := os.ReadFile(filepath.Join("..", "runbook.md"))
	if err != nil {
		t.Fatal(err)
	}
	headings := map[string]bool{}
	for _, line := range strings.Split(string(b), "\n") {
		if h, ok := strings.CutPrefix(line, "## "); ok {
			headings[strings.TrimSpace(h)] = true
		}
	}
	for _, want := range append([]string{"Alerts", "slack-delivery"}, func() (rs []string) {
		for _, r := range Reasons {
			rs = append(rs, string(r))
		}
		return rs
	}()...) {
		if !headings[want] {
			t.Errorf("runbook.md has no section %q", "## "+want)
		}
	}
}

// Control characters (C0, DEL, C1) and the JavaScript line separators
// U+2028 and U+2029, which Slack may refuse or show as line breaks inside a
// value, become spaces wherever outside text lands in a message; newlines
// and tabs stay.
func TestEscapeControlCharacters(t *testing.T) {
	bad := []rune{0x00, 0x01, 0x08, 0x0b, 0x0c, 0x0d, 0x1b, 0x1f, 0x7f, 0x80, 0x85, 0x9f, 0x2028, 0x2029}
	for _, r := range bad {
		if got := escape("a" + string(r) + "b"); got != "a b" {
			t.Errorf("escape(%U) = %q, want %q", r, got, "a b")
		}
		if got := escTrunc("a"+string(r)+"b", 10); got != "a b" {
			t.Errorf("escTrunc(%U) = %q, want %q", r, got, "a b")
		}
	}
	for _, keep := range []string{"a\nb", "a\tb", "é😀", "\u00a0"} {
		if got := escape(keep); got != keep {
			t.Errorf("escape(%q) = %q, want it unchanged", keep, got)
		}
	}

	// End to end: a key, a tool and a downstream's error full of them.
	var hostile strings.Builder
	for _, r := range bad {
		hostile.WriteString("x" + string(r))
	}
	items := fixtureItems()
	items[0].key = "wf-1:" + hostile.String()
	items[0].tool = "tool" + hostile.String()
	items[0].details.LastError = "503: " + hostile.String()
	r := newRenderer(testRunbook, 20)
	m := r.render(KindFiring, ReasonProbeFailing, items, fixtureNow)
	checkMessage(t, r, m)
	kinds, texts := messageTexts(t, m)
	for i, s := range texts {
		for _, c := range bad {
			if strings.ContainsRune(s, c) {
				t.Errorf("%s text holds %U: %q", kinds[i], c, s)
			}
		}
	}
}

// controls lists the interactive elements of a message: per block, the
// action IDs of its elements and accessory.
func controls(t *testing.T, m Message) (actions, menus [][]map[string]any) {
	t.Helper()
	raw, err := json.Marshal(slack.Blocks{BlockSet: m.Blocks})
	if err != nil {
		t.Fatal(err)
	}
	var blocks []map[string]any
	if err := json.Unmarshal(raw, &blocks); err != nil {
		t.Fatal(err)
	}
	for _, b := range blocks {
		if b["type"] == "actions" {
			var els []map[string]any
			for _, e := range b["elements"].([]any) {
				els = append(els, e.(map[string]any))
			}
			actions = append(actions, els)
		}
		if acc, ok := b["accessory"].(map[string]any); ok {
			menus = append(menus, []map[string]any{acc})
		}
	}
	return actions, menus
}

// Interactive firing messages carry the actions (Config.Interactive): a
// message about one key its five buttons, Mark retryable confirming what
// the retry will do; a grouped message an overflow menu per listed key; a
// message counting more keys than it lists a picker of the rest. Resolved
// notices carry none, and the text fallback is the same as without
// buttons. Every message stays within Slack's limits.
func TestRenderInteractive(t *testing.T) {
	r := newRenderer(testRunbook, 20).withInteractive(true)
	plain := newRenderer(testRunbook, 20)
	items := fixtureItems()

	one := r.render(KindFiring, ReasonProbeFailing, items[:1], fixtureNow)
	checkMessage(t, r, one)
	acts, menus := controls(t, one)
	if len(acts) != 1 || len(menus) != 0 {
		t.Fatalf("one key: %d actions blocks, %d menus; want 1, 0", len(acts), len(menus))
	}
	var ids []string
	for _, b := range acts[0] {
		ids = append(ids, b["action_id"].(string))
		if b["value"] != items[0].key {
			t.Errorf("button %s value %v, want the key", b["action_id"], b["value"])
		}
	}
	// Hold or Release, whichever applies: not held, Hold.
	if got := strings.Join(ids, ","); got != "lk_inspect,lk_hold,lk_retryable,lk_outcome" {
		t.Errorf("buttons %s", got)
	}
	heldItem := items[0]
	heldItem.held = true
	heldActs, _ := controls(t, r.render(KindFiring, ReasonProbeFailing, []item{heldItem}, fixtureNow))
	var heldIDs []string
	for _, b := range heldActs[0] {
		heldIDs = append(heldIDs, b["action_id"].(string))
	}
	if got := strings.Join(heldIDs, ","); got != "lk_inspect,lk_release,lk_retryable,lk_outcome" {
		t.Errorf("buttons of a held key %s", got)
	}
	confirm, _ := json.Marshal(acts[0][2]["confirm"])
	if !strings.Contains(string(confirm), "The next retry of wf-8812:step-3:create_ticket will run create_ticket again") {
		t.Errorf("Mark retryable's confirmation: %s", confirm)
	}
	if one.Text != plain.render(KindFiring, ReasonProbeFailing, items[:1], fixtureNow).Text {
		t.Error("the text fallback changed with buttons")
	}

	grouped := r.render(KindFiring, ReasonProbeFailing, items, fixtureNow)
	checkMessage(t, r, grouped)
	acts, menus = controls(t, grouped)
	if len(acts) != 0 || len(menus) != len(items) {
		t.Fatalf("grouped: %d actions blocks, %d menus; want 0, %d", len(acts), len(menus), len(items))
	}
	for i, m := range menus {
		opts := m[0]["options"].([]any)
		if m[0]["action_id"] != ActionIDMenu || len(opts) != maxOverflowOptions {
			t.Fatalf("menu %d: %v", i, m[0])
		}
		if v := opts[3].(map[string]any)["value"]; v != MenuValue(ActionIDRetryable, items[i].key) {
			t.Errorf("menu %d option value %v", i, v)
		}
	}

	for _, kind := range []Kind{KindResolved} {
		m := r.render(kind, ReasonProbeFailing, items, fixtureNow)
		if a, mm := controls(t, m); len(a)+len(mm) != 0 {
			t.Errorf("%s notice carries controls", kind)
		}
	}
	if a, mm := controls(t, plain.render(KindFiring, ReasonProbeFailing, items, fixtureNow)); len(a)+len(mm) != 0 {
		t.Error("controls without Config.Interactive")
	}
}

// At Slack's limits: 80 keys of 128 characters (the column's width), and
// 80 keys too long for a menu's value: within 50 blocks, menus and picker
// values within 150 characters, the picker within 100 options.
func TestRenderInteractiveLimits(t *testing.T) {
	r := newRenderer(testRunbook, 1000).withInteractive(true)
	for _, width := range []int{128, 2000} {
		var items []item
		for i := range 180 {
			k := fmt.Sprintf("%03d", i) + strings.Repeat("k", width-3)
			items = append(items, item{id: int64(i), tool: "t", key: k})
		}
		m := r.render(KindFiring, ReasonNoProbe, items, fixtureNow)
		checkMessage(t, r, m)
		if len(m.Blocks) > maxBlocks-1 {
			t.Errorf("width %d: %d blocks: no room left for the actions' log line", width, len(m.Blocks))
		}
		acts, menus := controls(t, m)
		raw, _ := json.Marshal(slack.Blocks{BlockSet: m.Blocks})
		for _, v := range regexpValues.FindAllStringSubmatch(string(raw), -1) {
			if utf8.RuneCountInString(v[1]) > 2000 {
				t.Errorf("width %d: a value of %d characters", width, utf8.RuneCountInString(v[1]))
			}
		}
		if width == 128 {
			if len(menus) != maxListedItems-2 || len(acts) != 1 {
				t.Errorf("width 128: %d menus, %d actions blocks", len(menus), len(acts))
			}
			if n := len(acts[0][0]["options"].([]any)); n != maxSelectOptions {
				t.Errorf("picker of %d options", n)
			}
			for _, o := range acts[0][0]["options"].([]any) {
				if v := o.(map[string]any)["value"].(string); utf8.RuneCountInString(v) > maxOptionValue {
					t.Errorf("picker value of %d characters", len(v))
				}
			}
		} else if len(menus) != 0 || len(acts) != 0 {
			t.Errorf("width %d: controls whose values Slack would refuse", width)
		}
	}
}

var regexpValues = regexp.MustCompile(`"value":"((?:[^"\\]|\\.)*)"`)
