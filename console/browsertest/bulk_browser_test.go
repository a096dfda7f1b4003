package browsertest

import (
	"strings"
	"testing"

	"github.com/chromedp/chromedp"
)

// The bulk actions' dry runs, with their typed confirmation, pass axe as
// every other page does (the result page is checked in the test below,
// after a POST).
func init() {
	axePages = append(axePages, "/ui/bulk?action=hold&prefix=k-", "/ui/bulk?action=retryable&tool="+tool)
}

// An operator filters the keys, opens "Hold all matching…", reads the dry
// run's count, types the confirmation and sees every key held, each with
// its own audit row by console:alice in the ledger; a key outside the
// filter is untouched. The result page passes axe too.
func TestOperatorHoldsTheFilteredKeysInBulkWithATypedConfirmation(t *testing.T) {
	db, base := serveConsole(t)
	bulkKeys := []string{"bulk-1", "bulk-2", "bulk-3"}
	for _, k := range bulkKeys {
		db.Exec(t, `INSERT INTO idempotency_keys (key, tool, request_hash, created_at, claimed_at, expires_at)
			VALUES ($1, $2, 'h', now() - interval '1 hour', now() - interval '1 hour', now() + interval '1 day')`, k, tool)
	}
	alice := browser(t, "alice")
	filter := `form.filter`
	offer := `.bulk-offers a[href^="/ui/bulk?action=hold"]`
	confirm := `form[action="/ui/bulk/hold"]`
	do(t, alice, "filter the keys by prefix",
		chromedp.Navigate(base+"/ui/keys"),
		chromedp.WaitVisible(chromedp.CSS(filter)),
		chromedp.SendKeys(chromedp.CSS(filter+` input[name="prefix"]`), "bulk-"),
		// The unfiltered list shows bulk-3 and an offer too: they are
		// looked for once the filtered page has loaded.
		follow(filter+" button"),
		chromedp.WaitVisible(chromedp.CSS(`a[href="/ui/key?key=bulk-3"]`)),
	)
	if href := get(t, alice, "the bulk hold offer's link", chromedp.AttributeValue(chromedp.CSS(offer), "href")).Value; !strings.Contains(href, "prefix=bulk-") {
		t.Fatalf("the bulk hold offer links to %q, without the filter", href)
	}
	do(t, alice, "open the bulk hold's dry run",
		follow(offer),
		chromedp.WaitVisible(chromedp.CSS(confirm)),
	)
	if n := get(t, alice, "the dry run's count", chromedp.Text(chromedp.CSS("#bulk-count"))); n != "3" {
		t.Fatalf("the dry run counts %q keys, want 3", n)
	}
	phrase := get(t, alice, "the phrase to type", chromedp.Text(chromedp.CSS(confirm+" kbd")))
	if phrase != "hold 3" {
		t.Fatalf("the confirmation asks for %q", phrase)
	}
	do(t, alice, "type the confirmation and hold",
		chromedp.SendKeys(chromedp.CSS(confirm+` input[name="reason"]`), "downstream incident INC-9"),
		chromedp.SendKeys(chromedp.CSS(confirm+` input[name="confirm_text"]`), phrase),
		follow(confirm+" button"),
		chromedp.WaitVisible(chromedp.CSS("#bulk-done")),
	)
	if done := get(t, alice, "the result", chromedp.Text(chromedp.CSS(".bulk-summary"))); !strings.Contains(done, "3 put on hold") || !strings.Contains(done, "0 refused") {
		t.Errorf("the result says %q", done)
	}
	for _, k := range bulkKeys {
		if n := db.Count(t, `reconcile_audit WHERE key = $1 AND action = 'hold' AND actor = 'console:alice'`, k); n != 1 {
			t.Errorf("%s: %d hold audit rows by console:alice, want 1", k, n)
		}
		if n := db.Count(t, `key_holds WHERE key = $1 AND reason = 'downstream incident INC-9'`, k); n != 1 {
			t.Errorf("%s: %d holds", k, n)
		}
	}
	if n := db.Count(t, `reconcile_audit WHERE key = $1`, key); n != 0 {
		t.Errorf("the key outside the filter got %d audit rows", n)
	}
	axeOn(t, alice, axeScript(t), "the bulk result page")

	// The same dry run now: nothing left to hold, nothing offered.
	do(t, alice, "open the dry run again",
		chromedp.Navigate(base+"/ui/bulk?action=hold&prefix=bulk-"),
		chromedp.WaitVisible(chromedp.CSS(".bulk-count")),
	)
	if again := get(t, alice, "the dry run again", chromedp.Text(chromedp.CSS(".bulk-count"))); !strings.Contains(again, "No key would be put on hold") {
		t.Errorf("the dry run after the hold: %q", again)
	}
	if forms := get(t, alice, "forms", chromedp.Nodes(chromedp.CSSAll(confirm), chromedp.AtLeast(0))); len(forms) != 0 {
		t.Errorf("the dry run of an empty set offers %d form(s)", len(forms))
	}
}
