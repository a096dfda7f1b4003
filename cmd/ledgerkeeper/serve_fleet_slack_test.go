package main

import (
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/slack-go/slack"

	"github.com/ledgerkeeper/ledgerkeeper/alerts"
	"github.com/ledgerkeeper/ledgerkeeper/internal/pgtest"
	"github.com/ledgerkeeper/ledgerkeeper/internal/slacktest"
	"github.com/ledgerkeeper/ledgerkeeper/ledger/ledgertest/testwait"
)

// One serve keeps two ledgers whose tool has no probe, each with the same
// stuck key: each ledger's alert names its ledger, and marking the key
// retryable from billing's alert changes billing's row only, audited
// there; support's key stays processing with no audit row of alice's.
func TestServeSlackActionOnOneLedgersAlertChangesThatLedgerOnly(t *testing.T) {
	t.Parallel()
	db := pgtest.NewEmpty(t)
	srv := slacktest.New(t, actionsBotToken)
	addr := freeAddr(t)
	secretFile := writeFile(t, "signing-secret", actionsSigningSecret+"\n")
	cfg := writeFile(t, "fleet.yaml", fmt.Sprintf(`schedule:
  reconcile: "@every 1s"
  alerts: "@every 1s"
reconcile:
  grace: 1s
  alert_after_attempts: 1
alerts:
  slack:
    token: %s
    channel: %s
    api_url: "%s"
    interactive: true
    signing_secret_file: %q
    operators:
      U0ALICE: alice
http:
  listen: "%s"
ledgers:
  billing:
    schema: billing
  support:
    schema: support
`, actionsBotToken, actionsChannel, srv.APIURL(), secretFile, addr))
	if code, out, errOut := cli(t, "migrate", "--config", cfg, "--database-url", db.URL); code != 0 {
		t.Fatalf("migrate: %d %s %s", code, out, errOut)
	}
	billing := fleetLedger{"billing", "billing", db.Pool}
	support := fleetLedger{"support", "support", db.Pool}
	const key = "wf-9:step-1:refund_payment"
	for _, l := range []fleetLedger{billing, support} {
		l.exec(t, `INSERT INTO `+l.table("idempotency_keys")+` (key, tool, request_hash, created_at, claimed_at, expires_at)
			VALUES ($1, 'refund_payment', 'h', now() - interval '1 minute', now() - interval '1 minute', now() + interval '1 day')`, key)
	}

	serveUntilCleanup(t, cfg, db.URL)

	// Both alerts posted, each naming its ledger.
	var billingMsg slacktest.Message
	testwait.Eventually(t, func() bool {
		var b, s bool
		for _, m := range srv.Messages() {
			blocks := string(m.Blocks)
			if !strings.Contains(blocks, key) {
				continue
			}
			switch {
			case strings.Contains(blocks, "ledger billing"):
				b, billingMsg = true, m
			case strings.Contains(blocks, "ledger support"):
				s = true
			}
		}
		return b && s
	}, 30*time.Second, "an alert of each ledger, naming it")

	value := button(t, billingMsg, alerts.ActionIDRetryable)
	click := srv.BlockActions(t, "U0ALICE", billingMsg.Channel, billingMsg.TS, slack.BlockAction{ActionID: alerts.ActionIDRetryable, Value: value})
	if code := postInteraction(t, addr, click); code != http.StatusOK {
		t.Fatalf("alice's click answered %d", code)
	}
	opened := srv.WaitCalls(t, "views.open", 1, testwait.Timeout)
	submit := slacktest.ViewSubmission(t, opened[0], "U0ALICE", map[string]map[string]string{"reason": {"reason": "checked billing's refunds: never happened"}})
	if code := postInteraction(t, addr, submit); code != http.StatusOK {
		t.Fatalf("alice's submission answered %d", code)
	}
	testwait.Eventually(t, func() bool { return billing.status(t, key) == "failed_retryable" }, testwait.Timeout, "billing's key marked retryable")
	if n := billing.count(t, billing.table("reconcile_audit")+` WHERE key = $1 AND action = 'operator_marked_retryable' AND actor LIKE 'slack:U0ALICE%'`, key); n != 1 {
		t.Errorf("%d audit rows of alice's decision in billing, want 1", n)
	}
	if s := support.status(t, key); s != "processing" {
		t.Errorf("support's key is %s after an action on billing's alert, want processing", s)
	}
	if n := support.count(t, support.table("reconcile_audit")+` WHERE actor LIKE 'slack:%'`); n != 0 {
		t.Errorf("%d audit rows of a Slack act in support, want 0", n)
	}
}
