package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/slack-go/slack"

	"github.com/ledgerkeeper/ledgerkeeper/alerts"
	"github.com/ledgerkeeper/ledgerkeeper/interact"
	"github.com/ledgerkeeper/ledgerkeeper/internal/pgtest"
	"github.com/ledgerkeeper/ledgerkeeper/internal/slacktest"
	"github.com/ledgerkeeper/ledgerkeeper/ledger/ledgertest/testwait"
)

const (
	actionsBotToken      = "xoxb-serve-actions-bot-4711"
	actionsAppToken      = "xapp-1-A0SERVE-serve-actions-4712"
	actionsSigningSecret = "signing-secret-serve-actions-4713"
	actionsChannel       = "C0ONCALL"
)

// actionsConfig is serve's configuration with Slack actions on both
// transports, pointed at srv; alice may do everything, bob only inspect.
func actionsConfig(t *testing.T, srv *slacktest.Server, addr string) string {
	t.Helper()
	secretFile := writeFile(t, "signing-secret", actionsSigningSecret+"\n")
	return writeFile(t, "serve.yaml", fmt.Sprintf(`schedule:
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
    interactive: true
    app_token: %s
    signing_secret_file: %q
    operators:
      U0ALICE: alice
      U0BOB: {name: bob, actions: [inspect]}
http:
  listen: "%s"
`, actionsBotToken, actionsChannel, srv.APIURL(), actionsAppToken, secretFile, addr))
}

// alertMessage waits for the alert about key and returns it.
func alertMessage(t *testing.T, srv *slacktest.Server, key string) slacktest.Message {
	t.Helper()
	var found slacktest.Message
	testwait.Eventually(t, func() bool {
		for _, m := range srv.Messages() {
			if strings.Contains(string(m.Blocks), key) {
				found = m
				return true
			}
		}
		return false
	}, 30*time.Second, "the alert about "+key)
	return found
}

// button finds the button actionID on msg and returns its value.
func button(t *testing.T, msg slacktest.Message, actionID string) string {
	t.Helper()
	var blocks []struct {
		Elements []struct {
			ActionID string `json:"action_id"`
			Value    string `json:"value"`
		} `json:"elements"`
	}
	if err := json.Unmarshal(msg.Blocks, &blocks); err != nil {
		t.Fatalf("alert blocks: %v", err)
	}
	for _, b := range blocks {
		for _, e := range b.Elements {
			if e.ActionID == actionID {
				return e.Value
			}
		}
	}
	t.Fatalf("no %s button on the alert:\n%s", actionID, msg.Blocks)
	return ""
}

// postInteraction sends cb to serve's /slack/interactions signed as Slack
// signs it, and returns the status code.
func postInteraction(t *testing.T, addr string, cb slack.InteractionCallback) int {
	t.Helper()
	req := slacktest.SignedRequest(t, "http://"+addr+"/slack/interactions", actionsSigningSecret, time.Now(), slacktest.Body(t, cb))
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	_, _ = io.Copy(io.Discard, resp.Body)
	return resp.StatusCode
}

func auditBy(t *testing.T, db *pgtest.DB, key, action, user string) int {
	t.Helper()
	return db.Count(t, "reconcile_audit WHERE key = $1 AND action = $2 AND actor = $3", key, action, "slack:"+user)
}

// serve, end to end with Slack actions: the firing alert is posted with
// buttons; a signed click on "Mark retryable" by an operator and the
// confirmation's submission to /slack/interactions mark the key retryable
// (row, audit with actor slack:<id>, the message updated in place); an
// unknown user and an operator without the action are refused and
// audited; Socket Mode is connected and acknowledges a click too; no
// secret reaches the logs.
func TestServeSlackActions(t *testing.T) {
	t.Parallel()
	db := pgtest.New(t)
	srv := slacktest.New(t, actionsBotToken)
	sock := srv.SocketMode(t, actionsAppToken)
	addr := freeAddr(t)
	cfg := actionsConfig(t, srv, addr)
	const key = "wf-9:step-1:refund_payment"
	stuckKey(t, db, "refund_payment", key, time.Minute)

	ctx, cancel := context.WithCancel(context.Background())
	exited := make(chan int, 1)
	var stderr syncBuffer
	go func() {
		exited <- run(ctx, []string{"serve", "--config", cfg, "--database-url", db.URL}, io.Discard, &stderr)
	}()
	stopped, code := false, 0
	stop := func() int {
		if !stopped {
			stopped = true
			cancel()
			code = testwait.Recv(t, exited, 40*time.Second)
		}
		return code
	}
	t.Cleanup(func() {
		stop()
		if t.Failed() {
			t.Logf("serve's stderr:\n%s", stderr.String())
		}
	})

	msg := alertMessage(t, srv, key)
	if v := button(t, msg, alerts.ActionIDRetryable); v != key {
		t.Fatalf("Mark retryable acts on %q, want %q", v, key)
	}
	click := func(user string) slack.InteractionCallback {
		return srv.BlockActions(t, user, msg.Channel, msg.TS, slack.BlockAction{ActionID: alerts.ActionIDRetryable, Value: key})
	}

	// Nobody listed, then an operator without the action: refused,
	// audited, nothing changed, no dialog.
	for _, user := range []string{"U0MALLORY", "U0BOB"} {
		if code := postInteraction(t, addr, click(user)); code != http.StatusOK {
			t.Fatalf("click by %s answered %d", user, code)
		}
		testwait.Eventually(t, func() bool { return auditBy(t, db, key, interact.ActionSlackRefused, user) == 1 }, testwait.Timeout, "the refusal of "+user+" in the audit")
	}
	if n := len(srv.Calls("views.open")); n != 0 || status(t, db, key) != "processing" {
		t.Fatalf("after refused clicks: %d dialogs, key %s", n, status(t, db, key))
	}

	// The operator: click, then the confirmation.
	if code := postInteraction(t, addr, click("U0ALICE")); code != http.StatusOK {
		t.Fatalf("alice's click answered %d", code)
	}
	opened := srv.WaitCalls(t, "views.open", 1, testwait.Timeout)
	submit := slacktest.ViewSubmission(t, opened[0], "U0ALICE", map[string]map[string]string{"reason": {"reason": "checked the refunds table: never happened"}})
	if code := postInteraction(t, addr, submit); code != http.StatusOK {
		t.Fatalf("alice's submission answered %d", code)
	}
	testwait.Eventually(t, func() bool { return status(t, db, key) == "failed_retryable" }, testwait.Timeout, "the key to be marked retryable")
	if n := auditBy(t, db, key, "operator_marked_retryable", "U0ALICE"); n != 1 {
		t.Fatalf("%d audit rows of alice's decision, want 1", n)
	}
	testwait.Eventually(t, func() bool {
		m, _ := srv.Message(msg.Channel, msg.TS)
		return strings.Contains(string(m.Blocks), "alice") && strings.Contains(string(m.Blocks), "retryable")
	}, testwait.Timeout, "the alert message to say who marked the key retryable")

	// Socket Mode is the other transport of the same serve.
	conn := sock.WaitConns(t, 1, testwait.Timeout)[0]
	sock.Deliver(t, conn, "env-inspect", srv.BlockActions(t, "U0BOB", msg.Channel, msg.TS, slack.BlockAction{ActionID: alerts.ActionIDInspect, Value: key}))
	sock.WaitAcks(t, "env-inspect", 1, testwait.Timeout)

	if code := stop(); code != 0 {
		t.Fatalf("serve exited %d", code)
	}
	logs := stderr.String()
	if !strings.Contains(logs, "slack actions on") || !strings.Contains(logs, "transports=\"socket_mode, http /slack/interactions\"") || !strings.Contains(logs, "operators=2") {
		t.Errorf("no start-up line naming the transports:\n%s", logs)
	}
	for _, s := range []string{actionsBotToken, actionsAppToken, actionsSigningSecret} {
		if strings.Contains(logs, s) {
			t.Errorf("serve logged a secret (%s)", s)
		}
	}
}

// config check shows whether Slack actions are on and through what,
// masking the app token and the signing secret in text and JSON.
func TestConfigCheckShowsSlackActions(t *testing.T) {
	t.Parallel()
	srv := slacktest.New(t, actionsBotToken)
	cfg := actionsConfig(t, srv, "127.0.0.1:9464")
	code, out, errOut := cli(t, "config", "check", "--config", cfg)
	if code != 0 {
		t.Fatalf("config check: %d\n%s%s", code, out, errOut)
	}
	want := "# Slack actions: on, Socket Mode (alerts.slack.app_token) and POST /slack/interactions on 127.0.0.1:9464 (alerts.slack.signing_secret); 2 operator(s) may act\n"
	if !strings.Contains(out, want) {
		t.Errorf("no summary line %q in:\n%s", want, out)
	}
	code, js, _ := cli(t, "config", "check", "--config", cfg, "--json")
	if code != 0 {
		t.Fatalf("config check --json: %d", code)
	}
	for _, o := range []string{out, js} {
		for _, s := range []string{actionsBotToken, actionsAppToken, actionsSigningSecret} {
			if strings.Contains(o, s) {
				t.Errorf("config check shows a secret (%s):\n%s", s, o)
			}
		}
	}
	var doc struct {
		Alerts struct {
			Slack struct {
				AppToken      string                    `json:"app_token"`
				SigningSecret string                    `json:"signing_secret"`
				Operators     map[string]map[string]any `json:"operators"`
				Interactive   bool                      `json:"interactive"`
			} `json:"slack"`
		} `json:"alerts"`
	}
	if err := json.Unmarshal([]byte(js), &doc); err != nil {
		t.Fatal(err)
	}
	s := doc.Alerts.Slack
	if s.AppToken != "[redacted]" || s.SigningSecret != "[redacted]" || !s.Interactive || s.Operators["U0BOB"]["name"] != "bob" {
		t.Errorf("effective alerts.slack: %+v", s)
	}

	// Off, the line says so.
	off := writeFile(t, "off.yaml", "alerts:\n  slack:\n    token: xoxb-x\n    channel: C1\n")
	if _, out, _ := cli(t, "config", "check", "--config", off); !strings.Contains(out, "# Slack actions: off (alerts.slack.interactive: false)\n") {
		t.Errorf("off:\n%s", out)
	}
}
