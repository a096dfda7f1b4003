package interact

import (
	"context"
	"encoding/json"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/slack-go/slack"

	"github.com/ledgerkeeper/ledgerkeeper/alerts"
	"github.com/ledgerkeeper/ledgerkeeper/internal/pgtest"
	"github.com/ledgerkeeper/ledgerkeeper/internal/slacktest"
	"github.com/ledgerkeeper/ledgerkeeper/ledger"
	"github.com/ledgerkeeper/ledgerkeeper/ledger/ledgertest/testwait"
)

const (
	smAppToken = "xapp-1-A0TEST-1-socketmodetest"
	smBotToken = "xoxb-socket-mode-test"
	smOperator = "U0ALICE"
	smChannel  = "C0ONCALL"
)

// smReplica is one serve replica's Socket Mode side: its own Handler on the
// shared ledger, its own connection to Slack.
type smReplica struct {
	h  *Handler
	sm *SocketMode
}

func startSocketModeReplica(t *testing.T, db *pgtest.DB, srv *slacktest.Server) *smReplica {
	t.Helper()
	return startSocketModeReplicaWith(t, db, srv, nil)
}

// startSocketModeReplicaWith is startSocketModeReplica with handle in place
// of the Handler's Handle (nil: the Handler's).
func startSocketModeReplicaWith(t *testing.T, db *pgtest.DB, srv *slacktest.Server, handle func(context.Context, slack.InteractionCallback) (any, error)) *smReplica {
	t.Helper()
	h, err := New(Config{
		Pool:      db.Pool,
		Slack:     srv.Client(smBotToken),
		Operators: map[string]Operator{smOperator: {Name: "alice"}},
		// Every key is past its window: the click may act on it.
		Windows: func(string) (time.Duration, time.Duration) { return time.Millisecond, time.Millisecond },
		Logger:  slog.New(slog.DiscardHandler),
	})
	if err != nil {
		t.Fatal(err)
	}
	sm, err := NewSocketMode(h, SocketModeConfig{AppToken: smAppToken, APIURL: srv.APIURL(), Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	if handle != nil {
		sm.handle = handle
	}
	if err := sm.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(sm.Stop)
	return &smReplica{h: h, sm: sm}
}

// stuckKey claims key and backdates it past any window.
func stuckKey(t *testing.T, db *pgtest.DB, key string) {
	t.Helper()
	if _, err := ledger.Claim(context.Background(), db.Pool, ledger.ClaimParams{Key: key, Tool: "create_ticket", RequestHash: strings.Repeat("a", 64)}); err != nil {
		t.Fatal(err)
	}
	db.Exec(t, `UPDATE idempotency_keys SET claimed_at = now() - interval '1 hour', created_at = now() - interval '1 hour' WHERE key = $1`, key)
}

// alertWithButton posts a firing alert for key carrying the given action
// button, as the renderer draws it, and returns its ts.
func alertWithButton(srv *slacktest.Server, key, actionID, label string) string {
	return srv.Post(smChannel, "stuck key "+key, []slack.Block{
		slack.NewSectionBlock(slack.NewTextBlockObject(slack.MarkdownType, "*stuck* `"+key+"`", false, false), nil, nil),
		slack.NewActionBlock("lk_actions", slack.NewButtonBlockElement(actionID, key, slack.NewTextBlockObject(slack.PlainTextType, label, false, false))),
	})
}

func auditCount(t *testing.T, db *pgtest.DB, key, action string) int {
	t.Helper()
	return db.Count(t, "reconcile_audit WHERE key = $1 AND action = $2 AND actor = $3", key, action, "slack:"+smOperator)
}

// A click on "Mark retryable" and the confirmation's submission, both
// delivered over Socket Mode, mark the key retryable with the audit row the
// CLI writes (actor slack:<user>), and each envelope is acknowledged. The
// same envelopes delivered again, to this replica and to another one, and
// the same click in a new envelope, change nothing more: no second dialog,
// no second audit row.
func TestSocketModeHandlesEachInteractionOnce(t *testing.T) {
	db := pgtest.New(t)
	srv := slacktest.New(t, smBotToken)
	sock := srv.SocketMode(t, smAppToken)
	startSocketModeReplica(t, db, srv)
	sock.WaitConns(t, 1, testwait.Timeout)
	startSocketModeReplica(t, db, srv) // a second replica
	conns := sock.WaitConns(t, 2, testwait.Timeout)

	const key = "wf-sm:step-1:create_ticket"
	stuckKey(t, db, key)
	ts := alertWithButton(srv, key, alerts.ActionIDRetryable, "Mark retryable")

	click := srv.BlockActions(t, smOperator, smChannel, ts, slack.BlockAction{ActionID: alerts.ActionIDRetryable, Value: key})
	sock.Deliver(t, conns[0], "env-click", click)
	sock.WaitAcks(t, "env-click", 1, testwait.Timeout)
	opened := srv.WaitCalls(t, "views.open", 1, testwait.Timeout)

	// Redeliveries of the click: the same envelope to the other replica,
	// and the same click in another envelope.
	sock.Deliver(t, conns[1], "env-click", click)
	sock.Deliver(t, conns[1], "env-click-again", click)
	sock.WaitAcks(t, "env-click", 2, testwait.Timeout)
	sock.WaitAcks(t, "env-click-again", 1, testwait.Timeout)
	if n := len(srv.Calls("views.open")); n != 1 {
		t.Fatalf("the confirmation dialog opened %d times, want once", n)
	}

	submit := slacktest.ViewSubmission(t, opened[0], smOperator, map[string]map[string]string{"reason": {"reason": "checked downstream: never happened"}})
	sock.Deliver(t, conns[1], "env-submit", submit)
	acks := sock.WaitAcks(t, "env-submit", 1, testwait.Timeout)
	if acks[0].Conn != conns[1] {
		t.Errorf("acknowledged on connection %d, want %d (the one it came on)", acks[0].Conn, conns[1])
	}
	testwait.Eventually(t, func() bool { return auditCount(t, db, key, "operator_marked_retryable") == 1 }, testwait.Timeout, "the audit row of the operator's decision")
	k, err := ledger.Get(context.Background(), db.Pool, key)
	if err != nil || k.Status != ledger.StatusFailedRetryable {
		t.Fatalf("key after the submission: %+v, %v", k, err)
	}

	// The submission again: in new envelopes to both replicas, and the
	// same envelope to the first.
	sock.Deliver(t, conns[0], "env-submit-a", submit)
	sock.Deliver(t, conns[1], "env-submit-b", submit)
	sock.Deliver(t, conns[0], "env-submit", submit)
	sock.WaitAcks(t, "env-submit", 2, testwait.Timeout)
	sock.WaitAcks(t, "env-submit-a", 1, testwait.Timeout)
	sock.WaitAcks(t, "env-submit-b", 1, testwait.Timeout)
	if n := auditCount(t, db, key, "operator_marked_retryable"); n != 1 {
		t.Fatalf("%d audit rows of the decision, want 1", n)
	}
	if n := db.Count(t, "reconcile_audit WHERE key = $1", key); n != 1 {
		t.Errorf("%d audit rows for the key, want 1", n)
	}
}

// The transport itself lets one delivery through to Handle, whatever the
// Handler would do with a second: the same envelope again, to this replica
// or another, and the same interaction in a new envelope are acknowledged
// and dropped; another click of the same user on the same button is not.
func TestSocketModeDedupesBeforeHandle(t *testing.T) {
	db := pgtest.New(t)
	srv := slacktest.New(t, smBotToken)
	sock := srv.SocketMode(t, smAppToken)
	var mu sync.Mutex
	handled := map[string]int{}
	count := func(_ context.Context, cb slack.InteractionCallback) (any, error) {
		mu.Lock()
		defer mu.Unlock()
		handled[cb.TriggerID]++
		return nil, nil
	}
	startSocketModeReplicaWith(t, db, srv, count)
	startSocketModeReplicaWith(t, db, srv, count)
	conns := sock.WaitConns(t, 2, testwait.Timeout)
	ts := alertWithButton(srv, "wf-sm:dedupe", alerts.ActionIDInspect, "Inspect")
	click := srv.BlockActions(t, smOperator, smChannel, ts, slack.BlockAction{ActionID: alerts.ActionIDInspect, Value: "wf-sm:dedupe"})
	sock.Deliver(t, conns[0], "env-1", click)
	sock.WaitAcks(t, "env-1", 1, testwait.Timeout)
	sock.Deliver(t, conns[1], "env-1", click)
	sock.Deliver(t, conns[0], "env-1", click)
	sock.Deliver(t, conns[1], "env-2", click)
	sock.WaitAcks(t, "env-1", 3, testwait.Timeout)
	sock.WaitAcks(t, "env-2", 1, testwait.Timeout)
	again := srv.BlockActions(t, smOperator, smChannel, ts, slack.BlockAction{ActionID: alerts.ActionIDInspect, Value: "wf-sm:dedupe"})
	sock.Deliver(t, conns[1], "env-3", again)
	sock.WaitAcks(t, "env-3", 1, testwait.Timeout)
	mu.Lock()
	defer mu.Unlock()
	if handled[click.TriggerID] != 1 || handled[again.TriggerID] != 1 || len(handled) != 2 {
		t.Fatalf("Handle calls per click: %v, want one each", handled)
	}
}

// The acknowledgement carries Handle's answer: a submission whose form is
// incomplete is sent back with the field's error, and nothing changes.
func TestSocketModeAckCarriesTheAnswer(t *testing.T) {
	db := pgtest.New(t)
	srv := slacktest.New(t, smBotToken)
	sock := srv.SocketMode(t, smAppToken)
	startSocketModeReplica(t, db, srv)
	conn := sock.WaitConns(t, 1, testwait.Timeout)[0]

	const key = "wf-sm:step-2:create_ticket"
	stuckKey(t, db, key)
	ts := alertWithButton(srv, key, alerts.ActionIDRetryable, "Mark retryable")
	sock.Deliver(t, conn, "env-1", srv.BlockActions(t, smOperator, smChannel, ts, slack.BlockAction{ActionID: alerts.ActionIDRetryable, Value: key}))
	opened := srv.WaitCalls(t, "views.open", 1, testwait.Timeout)
	sock.Deliver(t, conn, "env-2", slacktest.ViewSubmission(t, opened[0], smOperator, map[string]map[string]string{"reason": {"reason": "  "}}))
	ack := sock.WaitAcks(t, "env-2", 1, testwait.Timeout)[0]
	var got struct {
		ResponseAction string            `json:"response_action"`
		Errors         map[string]string `json:"errors"`
	}
	if err := json.Unmarshal(ack.Payload, &got); err != nil || got.ResponseAction != "errors" || got.Errors["reason"] == "" {
		t.Fatalf("acknowledgement payload %s (%v), want the reason's error", ack.Payload, err)
	}
	if k, _ := ledger.Get(context.Background(), db.Pool, key); k.Status != ledger.StatusProcessing {
		t.Errorf("key is %s after a refused form", k.Status)
	}
	// The form corrected and submitted again (the same view id and hash,
	// other values) is a new submission, not a redelivery of the first.
	sock.Deliver(t, conn, "env-3", slacktest.ViewSubmission(t, opened[0], smOperator, map[string]map[string]string{"reason": {"reason": "checked downstream: never happened"}}))
	if ack := sock.WaitAcks(t, "env-3", 1, testwait.Timeout)[0]; len(ack.Payload) != 0 && string(ack.Payload) != "null" {
		t.Errorf("corrected form acknowledged with %s, want an empty acknowledgement (the form closes)", ack.Payload)
	}
	if k, _ := ledger.Get(context.Background(), db.Pool, key); k.Status != ledger.StatusFailedRetryable {
		t.Errorf("key is %s after the corrected form was acknowledged, want failed_retryable", k.Status)
	}
}

// Slack's disconnect (it recycles connections) is followed by a new
// connection, and interactions keep arriving; Stop ends every goroutine
// (goleak in TestMain checks the package).
func TestSocketModeReconnectsAndStops(t *testing.T) {
	db := pgtest.New(t)
	srv := slacktest.New(t, smBotToken)
	sock := srv.SocketMode(t, smAppToken)
	r := startSocketModeReplica(t, db, srv)
	conn := sock.WaitConns(t, 1, testwait.Timeout)[0]
	sock.Disconnect(t, conn)
	testwait.Eventually(t, func() bool {
		ids := sock.Conns()
		return sock.Opened() >= 2 && len(ids) == 1 && ids[0] != conn
	}, testwait.Timeout, "a new connection after Slack's disconnect")
	conn = sock.Conns()[0]

	const key = "wf-sm:step-3:create_ticket"
	stuckKey(t, db, key)
	ts := alertWithButton(srv, key, alerts.ActionIDInspect, "Inspect")
	sock.Deliver(t, conn, "env-inspect", srv.BlockActions(t, smOperator, smChannel, ts, slack.BlockAction{ActionID: alerts.ActionIDInspect, Value: key}))
	sock.WaitAcks(t, "env-inspect", 1, testwait.Timeout)

	r.sm.Stop()
	r.sm.Stop() // twice is fine
	testwait.Eventually(t, func() bool { return len(sock.Conns()) == 0 }, testwait.Timeout, "the connection to close at Stop")
}

// Cancelling Start's context closes the connection too; Stop then
// returns at once.
func TestSocketModeStopsOnContextCancel(t *testing.T) {
	db := pgtest.New(t)
	srv := slacktest.New(t, smBotToken)
	sock := srv.SocketMode(t, smAppToken)
	h, err := New(Config{Pool: db.Pool, Slack: srv.Client(smBotToken), Operators: map[string]Operator{smOperator: {Name: "alice"}}, Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	sm, err := NewSocketMode(h, SocketModeConfig{AppToken: smAppToken, APIURL: srv.APIURL()})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	if err := sm.Start(ctx); err != nil {
		t.Fatal(err)
	}
	if err := sm.Start(ctx); err == nil {
		t.Error("started twice")
	}
	sock.WaitConns(t, 1, testwait.Timeout)
	cancel()
	testwait.Eventually(t, func() bool { return len(sock.Conns()) == 0 }, testwait.Timeout, "the connection to close when the context is cancelled")
	stopped := make(chan struct{})
	go func() {
		sm.Stop()
		close(stopped)
	}()
	testwait.Recv(t, stopped, testwait.Timeout)
}

// A refused app token is logged and retried with back-off, never fatal;
// Stop ends the retrying.
func TestSocketModeRefusedTokenIsRetried(t *testing.T) {
	db := pgtest.New(t)
	srv := slacktest.New(t, smBotToken)
	srv.SocketMode(t, "xapp-the-right-one")
	h, err := New(Config{Pool: db.Pool, Slack: srv.Client(smBotToken), Operators: map[string]Operator{smOperator: {Name: "alice"}}, Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	var logs syncLog
	sm, err := NewSocketMode(h, SocketModeConfig{AppToken: smAppToken, APIURL: srv.APIURL(), RetryBase: time.Millisecond, RetryMax: 5 * time.Millisecond,
		Logger: slog.New(slog.NewTextHandler(&logs, nil))})
	if err != nil {
		t.Fatal(err)
	}
	sm.Stop() // before Start: nothing to stop
	if err := sm.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	srv.WaitCalls(t, "apps.connections.open", 3, testwait.Timeout)
	sm.Stop()
	out := logs.String()
	if !strings.Contains(out, "slack socket mode connection failed") || !strings.Contains(out, "invalid_auth") || strings.Contains(out, smAppToken) {
		t.Errorf("log:\n%s", out)
	}

	if _, err := NewSocketMode(h, SocketModeConfig{AppToken: "xoxb-a-bot-token"}); err == nil {
		t.Error("a bot token accepted as the app-level token")
	}
}

// syncLog is a log destination safe for the logging goroutines and the
// test reading it.
type syncLog struct {
	mu sync.Mutex
	b  strings.Builder
}

func (l *syncLog) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *syncLog) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}
