package main

import (
	"encoding/json"
	"fmt"
	"html"
	"net/http"
	"net/url"
	"regexp"
	"strings"
	"testing"
	"time"

	"golang.org/x/crypto/bcrypt"

	"github.com/ledgerkeeper/ledgerkeeper/internal/pgtest"
	"github.com/ledgerkeeper/ledgerkeeper/internal/slacktest"
)

// consoleLink is the console link of a Slack message's text.
var consoleLink = regexp.MustCompile(`<(https?://[^|>]+)\|open in the console>`)

// On-call's path at 3 a.m., end to end: serve posts the alert about a stuck
// key to Slack with a link to the key's page (console.public_url); the link,
// followed as it is, opens the page behind sign-in, which says the key is
// stuck and why (the alert firing, on its timeline); the operator holds it
// there, after a confirmation that says what retries receive meanwhile, and
// the hold and its audit row are the operator's, as console:alice,
// on the page and in the ledger.
func TestSlackAlertLinksToTheKeyWhereOnCallActs(t *testing.T) {
	t.Parallel()
	hash, err := bcrypt.GenerateFromPassword([]byte("alice-pw"), bcrypt.MinCost)
	if err != nil {
		t.Fatal(err)
	}
	db := pgtest.New(t)
	srv := slacktest.New(t, actionsBotToken)
	addr := freeAddr(t)
	base := "http://" + addr
	cfg := writeFile(t, "serve.yaml", fmt.Sprintf(`schedule:
  reconcile: "@every 1s"
  purge: "@every 1h"
  alerts: "@every 1s"
reconcile:
  grace: 1s
  alert_after_attempts: 1
alerts:
  slack:
    token: %s
    channel: %s
    api_url: "%s"
http:
  listen: "%s"
console:
  users: {alice: %q}
  operators: {alice: [hold]}
  public_url: %q
`, actionsBotToken, actionsChannel, srv.APIURL(), addr, hash, base))
	// refund_payment has no probe: the key is stuck and only a human can
	// settle it (no_probe).
	const key = "wf-3am:step-2:refund_payment"
	stuckKey(t, db, "refund_payment", key, time.Minute)
	runInBackground(t, "serve", "--config", cfg, "--database-url", db.URL)

	msg := alertMessage(t, srv, key)
	var blocks []struct {
		Text struct {
			Text string `json:"text"`
		} `json:"text"`
	}
	if err := json.Unmarshal(msg.Blocks, &blocks); err != nil {
		t.Fatal(err)
	}
	var text strings.Builder
	for _, b := range blocks {
		text.WriteString(b.Text.Text + "\n")
	}
	// Slack's mrkdwn escapes &, < and > in text; a link's URL is read back
	// unescaped.
	m := consoleLink.FindStringSubmatch(text.String())
	if m == nil {
		t.Fatalf("the alert has no console link:\n%s", msg.Blocks)
	}
	link := html.UnescapeString(m[1])
	if want := base + "/ui/key?key=" + url.QueryEscape(key); link != want {
		t.Fatalf("console link %q, want %q", link, want)
	}
	if code, _ := httpDo(t, http.MethodGet, link, "", "", nil); code != http.StatusUnauthorized {
		t.Errorf("the link without signing in: %d, want 401", code)
	}
	code, page := httpDo(t, http.MethodGet, link, "alice", "alice-pw", nil)
	if code != http.StatusOK {
		t.Fatalf("the key's page from the alert: %d\n%s", code, page)
	}
	for _, want := range []string{"stuck", "alert firing: no_probe", `action="/ui/key/hold"`} {
		if !strings.Contains(page, want) {
			t.Errorf("the key's page does not say %q:\n%s", want, page)
		}
	}

	hold := url.Values{"key": {key}, "reason": {"refund desk is checking it"}}
	code, page = httpDo(t, http.MethodPost, base+"/ui/key/hold", "alice", "alice-pw", hold)
	if code != http.StatusOK || !strings.Contains(page, "Hold: confirm") || !strings.Contains(page, "keeps receiving 409") {
		t.Fatalf("the hold's confirmation: %d\n%s", code, page)
	}
	hold.Set("confirm", "yes")
	code, _ = httpDo(t, http.MethodPost, base+"/ui/key/hold", "alice", "alice-pw", hold)
	if code != http.StatusSeeOther {
		t.Fatalf("hold from the page: %d, want 303", code)
	}
	if n := db.Count(t, `key_holds WHERE key = $1 AND actor = 'console:alice'`, key); n != 1 {
		t.Errorf("holds by console:alice: %d, want 1", n)
	}
	if n := db.Count(t, `reconcile_audit WHERE key = $1 AND actor = 'console:alice'`, key); n != 1 {
		t.Errorf("audit rows by console:alice: %d, want 1", n)
	}
	if got := status(t, db, key); got != "processing" {
		t.Errorf("the held key is %s, want still processing", got)
	}
	_, page = httpDo(t, http.MethodGet, link, "alice", "alice-pw", nil)
	for _, want := range []string{"on hold (in force)", "console:alice", "refund desk is checking it"} {
		if !strings.Contains(page, want) {
			t.Errorf("after the hold, the key's page does not say %q", want)
		}
	}
}
