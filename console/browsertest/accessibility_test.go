package browsertest

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/chromedp/chromedp"
)

// axeScript is axe-core (pinned in axe/package-lock.json), installed by
// `npm ci` in axe/ (.ci/run does it).
func axeScript(t *testing.T) string {
	t.Helper()
	b, err := os.ReadFile(filepath.Join("axe", "node_modules", "axe-core", "axe.min.js"))
	if err != nil {
		t.Fatalf("axe-core not installed: run `npm ci` in console/browsertest/axe (.ci/run does): %v", err)
	}
	return string(b)
}

type axeViolation struct {
	ID     string `json:"id"`
	Impact string `json:"impact"`
	Help   string `json:"help"`
	Nodes  []struct {
		Target []string `json:"target"`
	} `json:"nodes"`
}

// axeOn runs axe-core's WCAG 2 A/AA rules on the page ctx shows (axe is
// axeScript's text); every violation is an error naming page.
func axeOn(t *testing.T, ctx context.Context, axe, page string) {
	t.Helper()
	// DevTools evaluation is not the page's script: the console's
	// Content-Security-Policy still forbids any.
	get(t, ctx, "load axe on "+page, chromedp.Evaluate[bool](axe+";true"))
	violations := get(t, ctx, "axe on "+page, chromedp.Evaluate[[]axeViolation](
		`axe.run(document, {runOnly: {type: 'tag', values: ['wcag2a', 'wcag2aa', 'wcag21a', 'wcag21aa']}}).then(r => r.violations)`,
		chromedp.EvalAwaitPromise))
	for _, v := range violations {
		var where []string
		for _, n := range v.Nodes {
			where = append(where, strings.Join(n.Target, " "))
		}
		t.Errorf("%s: %s (%s): %s at %s", page, v.ID, v.Impact, v.Help, strings.Join(where, ", "))
	}
}

// axePages are the pages TestConsolePagesPassAxe opens, after
// serveConsole's fixture; the tests of each page family add theirs in
// init.
var axePages = []string{"/ui/", "/ui/keys", "/ui/keys?tool=" + tool + "&stuck=1", "/ui/key?key=" + key}

// Every page of the console, as an operator sees it (the action forms and
// the confirmation page included), passes axe-core's WCAG 2 A and AA rules.
func TestConsolePagesPassAxe(t *testing.T) {
	axe := axeScript(t)
	_, base := serveConsole(t)
	alice := browser(t, "alice")
	check := func(page string) { t.Helper(); axeOn(t, alice, axe, page) }
	for _, p := range axePages {
		do(t, alice, "open "+p, chromedp.Navigate(base+p), chromedp.WaitVisible(chromedp.CSS("main")))
		check(p)
	}
	outcome := `form[action="/ui/key/outcome"]`
	do(t, alice, "ask to store an outcome",
		// The pages each family appends come after the key's page.
		chromedp.Navigate(base+"/ui/key?key="+key),
		chromedp.WaitVisible(chromedp.CSS(outcome)),
		chromedp.SendKeys(chromedp.CSS(outcome+` input[name="code"]`), "201"),
		chromedp.SendKeys(chromedp.CSS(outcome+` textarea[name="body"]`), `{"id": "T-1"}`),
		chromedp.SendKeys(chromedp.CSS(outcome+` input[name="reason"]`), "checked downstream"),
		follow(outcome+" button"),
		chromedp.WaitVisible(chromedp.CSS("button.danger")),
	)
	check("the confirmation page")
}
