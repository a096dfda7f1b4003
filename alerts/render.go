package alerts

import (
	"fmt"
	"net/url"
	"regexp"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/slack-go/slack"

	"github.com/ledgerkeeper/ledgerkeeper/console/uipath"
	"github.com/ledgerkeeper/ledgerkeeper/internal/safetext"
	"github.com/ledgerkeeper/ledgerkeeper/internal/secret"
)

// Slack's limits for a message, in characters.
// https://api.slack.com/reference/block-kit/blocks
const (
	maxBlocks      = 50
	maxTextObject  = 3000
	maxHeaderText  = 150
	maxFallback    = 3000 // Slack allows 40,000; a notification shows far less
	maxErrorRunes  = 300  // the last probe error, before escaping
	fixedBlocks    = 3    // header, intro, "…and N more"
	maxListedItems = maxBlocks - fixedBlocks
)

// reasonInfo is what a message says about its reason: a title, what it
// means and what to do first, in one line each (our own text: the only
// mrkdwn in it is `code`).
type reasonInfo struct{ title, meaning, next string }

var reasonInfos = map[Reason]reasonInfo{
	ReasonShardsUnreachable: {"Citus worker unreachable",
		"The coordinator cannot reach a Citus worker of the ledger's cluster, so nothing can be decided about the keys on its shards until it answers; the rest of the ledger is not held up by it.",
		"check the worker (`SELECT * FROM citus_check_cluster_node_health()` on the coordinator, `pg_isready` on its host and port, its logs) and bring it back. Nothing to do on the ledger: once the worker answers, its keys are decided on the next passes, none twice."},
	ReasonDuplicate: {"Duplicate effect downstream",
		"The probe found more than one effect for one key: the action already happened twice downstream, so idempotency was violated.",
		"inspect the key, undo the extra effect downstream, then record the one that stands with the command under the key (fill in the code and body the tool returned)."},
	ReasonDedupWindowPassed: {"Past the downstream's dedup window",
		"The probe found no effect, but the key is older than the downstream's own dedup window: a retry could no longer be caught there, so ledgerkeeper will not mark it retryable by itself.",
		"inspect the key, confirm downstream that the effect never happened, then run the `--retryable` command under the key (or the `--completed` one if it did happen)."},
	ReasonExpiredProcessing: {"Expired while still processing",
		"The key passed its retention (expires_at) with its outcome still unknown: purge keeps it until someone decides.",
		"inspect the key, find its outcome downstream, then run one of the commands under the key; purge removes it afterwards."},
	ReasonDownstreamUnreachable: {"Downstream unreachable",
		"The tool's probes keep failing, so its circuit breaker opened and probing is paused: its stuck keys stay processing (retries get 409) until the downstream answers.",
		"check the downstream and the probe's URL and credentials (the command under the tool probes it now); probing resumes by itself when the breaker closes."},
	ReasonProbeUntrusted: {"Probe untrusted",
		"The tool's probe failed its self-check: keys the ledger knows were completed did not come back found, or a key never issued did not come back not_found. Its verdicts cannot be trusted, so none of the tool's keys changes state (they stay processing; retries get 409).",
		"run the self-check under the tool and `ledgerkeeper probe run` on one of its keys; fix the probe's url, match or response_body (or the downstream's credentials), deploy, and the next pass checks again."},
	ReasonProbeUnwitnessed: {"Probe unwitnessed",
		"The tool's probe answers not_found, but no present-side sample of its self-check came back found (no key completed recently, no canary): nothing shows the probe can find an effect at all, so its not_found verdicts are held and those keys stay processing (retries get 409). found verdicts still apply.",
		"check that the probe finds an effect you know exists (`ledgerkeeper probe run` on its key), then mark it as a canary with `ledgerkeeper probe canary add` (an effect kept downstream for the purpose); the next pass decides the held keys."},
	ReasonProbeFailing: {"Probe failing",
		"The probe keeps answering unknown (error, timeout, unreadable answer) for the key, so ledgerkeeper cannot tell whether the effect happened: the key stays processing.",
		"inspect the key, fix the probe or the downstream, then re-probe with the command under the key, or decide with `ledgerkeeper resolve`."},
	ReasonNoProbe: {"No probe configured",
		"The key is stuck and its tool has no probe, so ledgerkeeper cannot ask the downstream: a human must decide.",
		"inspect the key, check downstream by hand, then run one of the commands under the key; configure a probe for the tool."},
}

func infoFor(r Reason) reasonInfo {
	if i, ok := reasonInfos[r]; ok {
		return i
	}
	// A reason stored by another version: shown reduced to its anchor
	// characters, never as raw text.
	return reasonInfo{"Alert " + anchorFor(r), "An alert this version of ledgerkeeper does not describe: see the runbook.",
		"inspect each key below, then follow the runbook section."}
}

// item is one outbox row to render and deliver.
type item struct {
	id        int64
	reason    Reason
	kind      Kind
	tool      string
	key       string
	details   Details
	createdAt time.Time
	attempts  int
	// supersedes are older pending notices of the same reason and subject
	// that this one replaces in the pass (see collapse); firedToo: one of
	// them was a firing notice.
	supersedes []int64
	firedToo   bool
	// held: the key is on hold now (Config.Held): its buttons offer
	// Release, not Hold.
	held bool
}

// node is the Citus worker the item is about (shards_unreachable: no tool,
// no key), "" for a key's or a tool's alert.
func (it item) node() string {
	if it.key != "" || it.tool != "" {
		return ""
	}
	return it.details.Node
}

// name is what the item is about: its key, its tool or its worker.
func (it item) name() string {
	return cmpStr(it.key, cmpStr(it.tool, it.node()))
}

// renderer turns the items of one (kind, reason) into a message.
type renderer struct {
	// runbookURL is the base link of runbook.md (validated), "" for none.
	runbookURL string
	maxItems   int
	// red removes secrets from every value that came from the ledger or a
	// downstream before it is rendered (nil: the built-in patterns only).
	red *secret.Redactor
	// interactive: firing messages carry action buttons (see actions.go).
	interactive bool
	// consoleURL is where the web console is reached (no trailing /); ""
	// draws no link to a key's page.
	consoleURL string
	// ledger is the name of the ledger the messages are about (valid), ""
	// for the one ledger of a process that keeps one: the messages then
	// read exactly as they always did.
	ledger string
}

var safeLinkRE = regexp.MustCompile(`^https?://[^\s<>|"` + "`" + `]+$`)

// newRenderer keeps a runbook URL only if it can sit inside Slack's
// <url|text> link syntax unharmed.
func newRenderer(runbookURL string, maxItems int) renderer {
	r := renderer{maxItems: min(max(maxItems, 1), maxListedItems)}
	if u, err := url.Parse(runbookURL); err == nil && u.Host != "" && safeLinkRE.MatchString(runbookURL) {
		u.Fragment = ""
		r.runbookURL = u.String()
	}
	return r
}

// withRedactor returns r redacting with red.
func (r renderer) withRedactor(red *secret.Redactor) renderer {
	r.red = red
	return r
}

// withInteractive returns r drawing action buttons on firing messages when on.
func (r renderer) withInteractive(on bool) renderer {
	r.interactive = on
	return r
}

// withLedger returns r naming ledger in every message (its header, its
// notification text and its commands) and in every control's value.
func (r renderer) withLedger(ledger string) renderer {
	r.ledger = ledger
	return r
}

// ledgerTag is what a header adds after its title: " · ledger NAME" (a
// plain text: a ledger's name has nothing to escape), "" without one.
func (r renderer) ledgerTag() string {
	if r.ledger == "" {
		return ""
	}
	return LedgerTagPrefix + r.ledger
}

// LedgerTagPrefix starts what the header of a named ledger's message ends
// with: " · ledger NAME".
const LedgerTagPrefix = " · ledger "

// withConsole returns r linking each key to its page in the web console
// at base (console.public_url), kept only if it can sit inside Slack's
// <url|text> link syntax unharmed.
func (r renderer) withConsole(base string) renderer {
	if u, err := url.Parse(base); err == nil && u.Host != "" && safeLinkRE.MatchString(base) && len(base) <= 200 {
		u.Fragment, u.RawQuery = "", ""
		r.consoleURL = strings.TrimRight(u.String(), "/")
	}
	return r
}

// consoleRef links a key to its page in the console (its ledger's pages
// in a fleet's console: uipath.Key): the key travels as a query value,
// escaped, so no character of it can end the link.
func (r renderer) consoleRef(key string) string {
	return "<" + escape(r.consoleURL+uipath.Key(r.ledger, key)) + "|open in the console>"
}

// consoleToolRef links an alert about a tool (no key: its probe, its
// self-check, its downstream) to the tool's section of the console's
// self-checks page (its ledger's: uipath.Checks), the name escaped so that
// it cannot end the link.
func (r renderer) consoleToolRef(tool string) string {
	return "<" + escape(r.consoleURL+uipath.Checks(r.ledger, tool)) + "|open the tool in the console>"
}

// runbookRef is the runbook section for a reason: a link from our own
// template, or the section's name as text when no URL is configured.
func (r renderer) runbookRef(reason Reason) string {
	anchor := anchorFor(reason)
	if r.runbookURL == "" {
		return "`runbook.md#" + anchor + "`"
	}
	// Slack links: & must be escaped inside the URL too.
	return "<" + escape(r.runbookURL+"#"+anchor) + "|runbook: " + anchor + ">"
}

var anchorRE = regexp.MustCompile(`[^a-z0-9_-]+`)

// anchorFor is a reason's section anchor; reasons are our own snake_case
// constants, and anything else stored in the outbox is reduced to that.
func anchorFor(r Reason) string {
	a := anchorRE.ReplaceAllString(strings.ToLower(string(r)), "")
	if len(a) > 40 {
		a = a[:40]
	}
	if a == "" {
		return "alerts"
	}
	return a
}

func (r renderer) render(kind Kind, reason Reason, items []item, now time.Time) Message {
	items = r.redact(items)
	info := infoFor(reason)
	count := plural(len(items), unitOf(items))

	var header, lead string
	switch {
	case kind == KindResolved && reason == ReasonShardsUnreachable:
		header = "✅ Resolved: " + info.title + " (" + count + ")" + r.ledgerTag()
		lead = "*No longer needs a human:* the coordinator reaches the worker again; the keys on its shards are decided on the next passes, none twice."
	case kind == KindResolved:
		header = "✅ Resolved: " + info.title + " (" + count + ")" + r.ledgerTag()
		lead = "*No longer needs a human:* these alerts were resolved (by the reconciler, the original attempt, an operator or purge)."
	default:
		header = "🔴 " + info.title + ": " + count + r.ledgerTag()
		lead = "*What it means:* " + escape(info.meaning)
	}
	lead += "\n*Runbook:* " + r.runbookRef(reason)
	if kind == KindFiring {
		lead += "\n*Next:* " + escape(info.next)
	}

	blocks := []slack.Block{
		slack.NewHeaderBlock(slack.NewTextBlockObject(slack.PlainTextType, safetext.ClipRunes(header, maxHeaderText), true, false)),
		section(lead),
	}
	limit := r.maxItems
	// Buttons only where a human can act on a key: firing notices.
	interactive := r.interactive && kind == KindFiring
	if interactive {
		// Room for the key picker and for the line interact adds when
		// someone acts.
		limit = min(limit, maxListedItems-2)
	}
	listed := items
	if len(listed) > limit {
		listed = listed[:limit]
	}
	for _, it := range listed {
		sec := section(r.itemText(kind, it, now))
		if interactive && it.key != "" && len(listed) > 1 {
			if menu := keyMenu(r.ledger, it.key); menu != nil {
				sec.Accessory = slack.NewAccessory(menu)
			}
		}
		blocks = append(blocks, sec)
		if interactive && it.key != "" && len(listed) == 1 {
			blocks = append(blocks, KeyActions(r.ledger, it.key, it.tool, "", it.held))
		}
	}
	if rest := len(items) - len(listed); rest > 0 {
		more := fmt.Sprintf("…and %d more (%s in all): list them with `%s`.", rest, count, commandLine(r.ledger, "status", ""))
		blocks = append(blocks, slack.NewContextBlock("", slack.NewTextBlockObject(slack.MarkdownType, more, false, true)))
		if interactive {
			var keys []string
			for _, it := range items[len(listed):] {
				keys = append(keys, it.key)
			}
			if p := keyPicker(r.ledger, keys); p != nil {
				blocks = append(blocks, p)
			}
		}
	}
	return Message{
		Kind:   kind,
		Reason: reason,
		Alerts: len(items),
		Text:   r.fallback(kind, reason, info, items, count),
		Blocks: blocks,
	}
}

// redact returns copies of items whose texts (key, tool, last error, note,
// resolution, verdict) went through the one redactor: a probe error may
// quote a URL with a token, a header or a DSN. It runs before any cut, so
// no cut can leave half a secret the redactor no longer recognises.
func (r renderer) redact(items []item) []item {
	out := make([]item, len(items))
	for i, it := range items {
		it.key = r.red.String(it.key)
		it.tool = r.red.String(it.tool)
		d := &it.details
		d.LastError = r.red.String(d.LastError)
		d.Note = r.red.String(d.Note)
		d.Resolution = r.red.String(d.Resolution)
		d.Verdict = r.red.String(d.Verdict)
		d.Node = r.red.String(d.Node)
		out[i] = it
	}
	return out
}

// section is a mrkdwn section. verbatim: Slack must not turn bare names or
// URLs in ledger data into mentions or links; our own links are explicit.
func section(text string) *slack.SectionBlock {
	return slack.NewSectionBlock(slack.NewTextBlockObject(slack.MarkdownType, safeCut(text, maxTextObject), false, true), nil, nil)
}

// itemText describes one alert. Every value from the ledger or a
// downstream goes through escape (via inline, codeBlock or escTrunc), each
// under a budget that keeps the whole text within 3000 characters.
func (r renderer) itemText(kind Kind, it item, now time.Time) string {
	if it.node() != "" {
		return nodeText(kind, it)
	}
	var b strings.Builder
	d := it.details
	if it.key == "" {
		b.WriteString("*Tool* " + inline(it.tool, 200))
		if d.Keys > 0 {
			fmt.Fprintf(&b, " · *keys affected* %d", d.Keys)
		}
	} else {
		b.WriteString("*Key* " + inline(it.key, 400) + " · *tool* " + inline(it.tool, 200))
	}
	if kind == KindResolved {
		if it.firedToo {
			b.WriteString("\n*Fired and resolved before it could be delivered:* nothing to do.")
		}
		if d.Resolution != "" {
			b.WriteString("\n*Resolved:* " + escTrunc(oneLine(d.Resolution), 200))
		}
	} else {
		var facts []string
		if t := firstTime(d.CreatedAt, d.ClaimedAt); t != nil {
			facts = append(facts, "*age* "+formatAge(now.Sub(*t)))
		}
		if d.Attempts > 0 {
			facts = append(facts, fmt.Sprintf("*attempts* %d", d.Attempts))
		}
		// No probe ran for no_probe: there is no verdict to show.
		if d.Verdict != "" && it.reason != ReasonNoProbe {
			facts = append(facts, "*last verdict* "+escTrunc(oneLine(d.Verdict), 40))
		}
		if d.ExpiresAt != nil {
			facts = append(facts, "*expired* "+d.ExpiresAt.UTC().Format(time.RFC3339)+" ("+formatAge(now.Sub(*d.ExpiresAt))+" ago)")
		}
		if len(facts) > 0 {
			b.WriteString("\n" + strings.Join(facts, " · "))
		}
		if d.LastError != "" {
			// A self-check's evidence is the answers it got, not one probe's error.
			label := "Last probe error"
			if it.reason == ReasonProbeUntrusted || it.reason == ReasonProbeUnwitnessed {
				label = "Self-check answers"
			}
			b.WriteString("\n*" + label + ":* " + codeBlock(safetext.ClipRunes(d.LastError, maxErrorRunes), 1000))
		}
		if d.Note != "" {
			b.WriteString("\n*Note:* " + escTrunc(oneLine(d.Note), 250))
		}
	}
	b.WriteString("\n*Inspect:* " + inspectCommandIn(r.ledger, it))
	switch {
	case r.consoleURL == "":
	case it.key != "":
		b.WriteString(" · " + r.consoleRef(it.key))
	case it.tool != "":
		b.WriteString(" · " + r.consoleToolRef(it.tool))
	}
	if kind == KindFiring {
		if next := nextCommandsIn(r.ledger, it); next != "" {
			b.WriteString("\n*Next:* " + next)
		}
	}
	return b.String()
}

// Outcome values only the operator knows. They are written so that a
// command pasted without filling them in is refused (CODE is not a number,
// JSON is not JSON) instead of storing an invented outcome.
const (
	codePlaceholder = "CODE"
	bodyPlaceholder = "'JSON'"
)

// nextCommands is the command line(s) that act on one alert, with its real
// key or tool, every required flag given: one per line, a shell comment
// saying when to run each.
func nextCommands(it item) string { return nextCommandsIn("", it) }

// nextCommandsIn is nextCommands for a named ledger ("": the one ledger):
// each command carries --ledger NAME.
func nextCommandsIn(ledger string, it item) string {
	completed := []string{"--completed", "--code", codePlaceholder, "--body", bodyPlaceholder}
	var lines []string
	switch it.reason {
	case ReasonDuplicate:
		lines = []string{
			"# after undoing the extra effect: the code and body the tool returned for the one that stands",
			commandLine(ledger, "resolve", it.key, append(completed, "--reason", shellQuote("extra effect undone downstream"))...),
		}
	case ReasonDedupWindowPassed, ReasonExpiredProcessing, ReasonNoProbe:
		lines = []string{
			"# the effect never happened downstream:",
			commandLine(ledger, "resolve", it.key, "--retryable", "--reason", shellQuote("checked downstream: never happened")),
			"# it did happen: the code and body the tool returned",
			commandLine(ledger, "resolve", it.key, append(completed, "--reason", shellQuote("checked downstream: it happened"))...),
		}
	case ReasonProbeFailing:
		lines = []string{commandLine(ledger, "reconcile", "", "--key="+shellQuote(it.key))}
	case ReasonDownstreamUnreachable, ReasonProbeUntrusted, ReasonProbeUnwitnessed:
		if it.tool == "" {
			return ""
		}
		lines = []string{commandLine(ledger, "probe check", "", "--tool="+shellQuote(it.tool))}
	default:
		return ""
	}
	if it.key == "" && it.reason != ReasonDownstreamUnreachable && it.reason != ReasonProbeUntrusted && it.reason != ReasonProbeUnwitnessed {
		return ""
	}
	text := strings.Join(lines, "\n")
	if utf8.RuneCountInString(escape(text)) > 890 || strings.Contains(text, "```") {
		return "too long to quote here: find the key or tool with `ledgerkeeper status`"
	}
	return codeBlock(text, 900)
}

// commandLine is `ledgerkeeper SUB KEY FLAGS…`, `ledgerkeeper SUB
// --ledger NAME KEY FLAGS…` for a named ledger (a name is shell-safe); a
// key that looks like a flag goes last, after "--".
func commandLine(ledger, sub, key string, flags ...string) string {
	parts := []string{"ledgerkeeper", sub}
	if ledger != "" {
		parts = append(parts, "--ledger", ledger)
	}
	switch {
	case key == "":
		parts = append(parts, flags...)
	case strings.HasPrefix(key, "-"):
		parts = append(append(parts, flags...), "--", shellQuote(key))
	default:
		parts = append(append(parts, shellQuote(key)), flags...)
	}
	return strings.Join(parts, " ")
}

// inspectCommand is the exact command to run, the key shell-quoted.
func inspectCommand(it item) string { return inspectCommandIn("", it) }

// inspectCommandIn is inspectCommand for a named ledger ("": the one
// ledger): the command carries --ledger NAME.
func inspectCommandIn(ledger string, it item) string {
	if it.key == "" {
		return codeBlock(commandLine(ledger, "status", ""), 700)
	}
	cmd := commandLine(ledger, "inspect", "") + " "
	if strings.HasPrefix(it.key, "-") {
		cmd += "-- " // a key is not a flag
	}
	cmd += shellQuote(it.key)
	if utf8.RuneCountInString(escape(cmd)) > 690 || strings.Contains(cmd, "```") {
		return "the key is too long to quote here: find it with `ledgerkeeper status`"
	}
	return codeBlock(cmd, 700)
}

// fallback is the plain `text` of the message: what a notification shows.
func (r renderer) fallback(kind Kind, reason Reason, info reasonInfo, items []item, count string) string {
	var b strings.Builder
	if kind == KindResolved {
		b.WriteString("[RESOLVED] ")
	} else {
		b.WriteString("[FIRING] ")
	}
	if r.ledger != "" {
		b.WriteString("Ledger " + inline(r.ledger, 70) + ": ")
	}
	b.WriteString(escape(info.title) + ": " + count + ". Runbook: " + r.runbookRef(reason) + ".")
	names := make([]string, 0, min(len(items), 5))
	for _, it := range items[:min(len(items), 5)] {
		names = append(names, inline(it.name(), 120))
	}
	if len(names) > 0 {
		b.WriteString(" " + strings.Join(names, ", "))
		if len(items) > len(names) {
			fmt.Fprintf(&b, " and %d more", len(items)-len(names))
		}
	}
	return safeCut(b.String(), maxFallback)
}

// unitOf names what a message counts: keys, tools (tool-wide alerts),
// workers (Citus workers), or alerts when a reason mixes them.
func unitOf(items []item) string {
	keys, tools, workers := 0, 0, 0
	for _, it := range items {
		switch {
		case it.key != "":
			keys++
		case it.node() != "":
			workers++
		default:
			tools++
		}
	}
	switch {
	case tools == 0 && workers == 0:
		return "key"
	case keys == 0 && workers == 0:
		return "tool"
	case keys == 0 && tools == 0:
		return "worker"
	}
	return "alert"
}

func cmpStr(a, b string) string {
	if a != "" {
		return a
	}
	return b
}

func firstTime(ts ...*time.Time) *time.Time {
	for _, t := range ts {
		if t != nil && !t.IsZero() {
			return t
		}
	}
	return nil
}

func plural(n int, unit string) string {
	if n == 1 {
		return "1 " + unit
	}
	return fmt.Sprintf("%d %ss", n, unit)
}

// formatAge is a duration on-call reads at a glance: 45s, 12m, 2h13m, 3d4h.
func formatAge(d time.Duration) string {
	if d < 0 {
		d = 0
	}
	switch {
	case d < time.Minute:
		return fmt.Sprintf("%ds", int(d/time.Second))
	case d < time.Hour:
		return fmt.Sprintf("%dm", int(d/time.Minute))
	case d < 48*time.Hour:
		return fmt.Sprintf("%dh%02dm", int(d/time.Hour), int(d%time.Hour/time.Minute))
	default:
		return fmt.Sprintf("%dd%dh", int(d/(24*time.Hour)), int(d%(24*time.Hour)/time.Hour))
	}
}

var shellSafeRE = regexp.MustCompile(`^[A-Za-z0-9_@%+=:,./-]+$`)

// shellQuote quotes s for a POSIX shell: bare when harmless, else in
// single quotes.
func shellQuote(s string) string {
	if shellSafeRE.MatchString(s) {
		return s
	}
	return "'" + strings.ReplaceAll(s, "'", `'\''`) + "'"
}

// escape makes text from outside safe in Slack mrkdwn: &, < and > become
// entities, so nothing can open a mention (<!channel>, <@U1>, <#C1>) or a
// disguised link (<https://evil|runbook>). Invalid UTF-8 and control
// characters, which Slack may reject, become U+FFFD and spaces.
// https://api.slack.com/reference/surfaces/formatting#escaping
func escape(s string) string {
	var b strings.Builder
	for _, r := range strings.ToValidUTF8(s, "\uFFFD") {
		b.WriteString(escapeRune(r))
	}
	return b.String()
}

func escapeRune(r rune) string {
	switch {
	case r == '&':
		return "&amp;"
	case r == '<':
		return "&lt;"
	case r == '>':
		return "&gt;"
	case r == '\n' || r == '\t':
		return string(r)
	case r < 0x20 || r == 0x7f || (r >= 0x80 && r < 0xa0) || r == '\u2028' || r == '\u2029':
		return " "
	}
	return string(r)
}

// escTrunc escapes s and keeps the result within max characters, cutting
// between characters of the source (never inside an entity) and marking
// the cut with "…".
func escTrunc(s string, max int) string {
	s = strings.ToValidUTF8(s, "\uFFFD")
	var b strings.Builder
	n := 0
	for i, r := range s {
		e := escapeRune(r)
		w := utf8.RuneCountInString(e)
		if n+w > max-1 {
			// Room for the ellipsis, unless this is the last character.
			if n+w <= max && i+utf8.RuneLen(r) == len(s) {
				b.WriteString(e)
				return b.String()
			}
			b.WriteString("…")
			return b.String()
		}
		b.WriteString(e)
		n += w
	}
	return b.String()
}

// oneLine folds line breaks into spaces, for inline values.
func oneLine(s string) string {
	return strings.NewReplacer("\r\n", " ", "\n", " ", "\r", " ", "\t", " ").Replace(s)
}

// inline is a value shown as `code` (not parsed for bold or italics),
// escaped and within max characters. A value holding a backtick cannot sit
// in a code span, so it is shown escaped without one.
func inline(s string, max int) string {
	s = oneLine(s)
	if s == "" {
		return "(none)"
	}
	if strings.Contains(s, "`") {
		return escTrunc(s, max)
	}
	return "`" + escTrunc(s, max-2) + "`"
}

// codeBlock is a preformatted block, escaped and within max characters
// (Slack decodes the entities inside it too). Text holding backticks would
// close the fence early, so it is shown escaped without one.
func codeBlock(s string, max int) string {
	s = strings.TrimSpace(s)
	if strings.Contains(s, "`") {
		return escTrunc(oneLine(s), max)
	}
	return "```" + escTrunc(s, max-6) + "```"
}

// safeCut is the last guard on an already rendered text: it cuts to max
// characters, never inside an entity (&amp;) nor inside one of our links.
func safeCut(s string, max int) string {
	if utf8.RuneCountInString(s) <= max {
		return s
	}
	rs := make([]rune, 0, max)
	for _, r := range s {
		if len(rs) == max-1 {
			break
		}
		rs = append(rs, r)
	}
	cut := string(rs)
	// Back off an entity or a link left open at the end.
	if i := strings.LastIndexByte(cut, '&'); i >= 0 && !strings.Contains(cut[i:], ";") {
		cut = cut[:i]
	}
	if i := strings.LastIndexByte(cut, '<'); i >= 0 && !strings.Contains(cut[i:], ">") {
		cut = cut[:i]
	}
	return cut + "…"
}
