package alerts

import (
	"net/url"
	"strings"
	"testing"
)

// With console.public_url set, every listed key links to its page in the
// console, the key escaped as a query value so that no character of it can
// end the link; an alert about a tool links to the tool's self-check; a
// base that cannot sit in a Slack link draws none.
func TestEveryKeyLinksToItsConsolePage(t *testing.T) {
	items := fixtureItems()
	items[0].key = "ord-7|<evil>&x"
	r := newRenderer(testRunbook, 20).withConsole("https://lk.example.com/")
	for _, kind := range []Kind{KindFiring, KindResolved} {
		m := r.render(kind, ReasonProbeFailing, items, fixtureNow)
		_, texts := messageTexts(t, m)
		all := strings.Join(texts, "\n")
		// Beside our runbook links, the console's are the only links: a key
		// cannot open one of its own.
		rest := strings.ReplaceAll(all, r.runbookRef(ReasonProbeFailing), "")
		for _, it := range items {
			rest = strings.ReplaceAll(rest, r.consoleRef(r.red.String(it.key)), "")
		}
		if strings.Contains(rest, "<") {
			t.Errorf("%s: a link other than ours:\n%s", kind, rest)
		}
		if want := "<https://lk.example.com/ui/key?key=ord-7%7C%3Cevil%3E%26x|open in the console>"; !strings.Contains(all, want) {
			t.Errorf("%s: no link %q in:\n%s", kind, want, all)
		}
		for _, it := range items[1:] {
			if it.key != "" && !strings.Contains(all, "https://lk.example.com/ui/key?key="+url.QueryEscape(it.key)+"|") {
				t.Errorf("%s: key %s has no console link", kind, it.key)
			}
		}
	}
	// An alert about a tool (no key) links to the tool's self-check.
	tool := item{reason: ReasonDownstreamUnreachable, tool: "tickets|<x>&y"}
	m := r.render(KindFiring, ReasonDownstreamUnreachable, []item{tool}, fixtureNow)
	_, texts := messageTexts(t, m)
	all := strings.Join(texts, "\n")
	if want := "<https://lk.example.com/ui/checks#tool-tickets%7C%3Cx%3E&amp;y|open the tool in the console>"; !strings.Contains(all, want) {
		t.Errorf("tool alert: no link %q in:\n%s", want, all)
	}
	for _, base := range []string{"", "lk.example.com", "javascript:alert(1)", "https://lk.example.com/a|b", "https://lk.example.com/<x>"} {
		m := newRenderer(testRunbook, 20).withConsole(base).render(KindFiring, ReasonProbeFailing, items, fixtureNow)
		_, texts := messageTexts(t, m)
		if all := strings.Join(texts, "\n"); strings.Contains(all, "open in the console") {
			t.Errorf("base %q drew a console link:\n%s", base, all)
		}
	}
}
