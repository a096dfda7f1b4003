package main

import (
	"bytes"
	"context"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"time"

	"github.com/slack-go/slack"

	"github.com/ledgerkeeper/ledgerkeeper/alerts"
	"github.com/ledgerkeeper/ledgerkeeper/internal/daemon"
	"github.com/ledgerkeeper/ledgerkeeper/ledger"
	"github.com/ledgerkeeper/ledgerkeeper/operator"
	"github.com/ledgerkeeper/ledgerkeeper/store"
)

// The demo's Slack users: one listed in alerts.slack.operators (demo.yaml),
// one not.
const (
	demoOperator = "U0DEMO"
	demoStranger = "U0STRANGER"
)

// slackStep shows one Slack action end to end: the stand-in for Slack
// clicks "Mark retryable" on the alert about the key without a probe, as a
// user who may not and then as the operator, through the same signed
// request to /slack/interactions that serve answers; then the key's row
// and audit trail.
func (d *demo) slackStep(ctx context.Context, windows operator.Windows) error {
	const key = "wf-4:step-2:refund_payment"
	d.say("\n-- 8. on-call acts from the alert: Mark retryable on %s (Slack actions) --", key)
	// A refusal is logged as a warning; the demo shows it itself.
	logger := d.a.logger
	if d.a.logLevel == "" {
		logger = newLogger(slog.NewTextHandler(d.a.stderr, &slog.HandlerOptions{Level: slog.LevelError}), d.a.redactor())
	}
	in, err := daemon.BuildInteractivity(d.a.cfg, d.pool, windows, logger)
	if err != nil || in == nil || in.HTTP == nil {
		return fmt.Errorf("demo Slack actions: %v (alerts.slack.interactive and signing_secret in demo.yaml)", err) //nolint:errorlint // err may be nil here (in or in.HTTP is nil): %w would print %!w(<nil>)
	}
	defer in.Handler.Stop()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return err
	}
	mux := http.NewServeMux()
	for pattern, h := range in.Routes() {
		mux.Handle(pattern, h)
	}
	srv := &http.Server{Handler: mux, ReadHeaderTimeout: 5 * time.Second}
	go func() { _ = srv.Serve(ln) }()
	defer srv.Close()
	endpoint := "http://" + ln.Addr().String() + daemon.InteractionsPath
	secret := d.a.cfg.Alerts.Slack.SigningSecret.Reveal()

	msg := d.slack.alertAbout(key)
	if msg == nil {
		return fmt.Errorf("demo: no alert about %s was posted", key)
	}
	d.say("the alert about %s carries the buttons Inspect · Hold · Release · Mark retryable · Store outcome;", key)
	d.say("serve answers their clicks at POST %s (signed with alerts.slack.signing_secret) or over Socket Mode (alerts.slack.app_token)", daemon.InteractionsPath)

	// Each interaction is acknowledged first; what Slack is sent after it
	// (answers, forms, the message's update) is awaited before it is shown.
	send := func(cb slack.InteractionCallback) (int, error) {
		code, err := d.slack.interact(ctx, endpoint, secret, cb)
		if err != nil {
			return code, err
		}
		return code, in.Handler.Settle(ctx)
	}
	click := func(user string) (int, error) {
		return send(d.slack.blockActions(user, msg, alerts.ActionIDRetryable, key))
	}
	code, err := click(demoStranger)
	if err != nil {
		return err
	}
	d.say("%s (not in alerts.slack.operators) clicks Mark retryable -> %d; Slack shows them:\n%s", demoStranger, code, indent(d.slack.lastReply()))

	code, err = click(demoOperator)
	if err != nil {
		return err
	}
	view := d.slack.lastView()
	if view == nil {
		return fmt.Errorf("demo: the click opened no confirmation (%d)", code)
	}
	d.say("%s (demo-oncall) clicks Mark retryable -> %d; ledgerkeeper asks for confirmation:\n%s", demoOperator, code, indent(viewText(view)))
	const reason = "checked the refunds table: no refund for wf-4"
	code, err = send(viewSubmission(demoOperator, view, reason))
	if err != nil {
		return err
	}
	d.say("%s confirms with the reason %q -> %d; Slack shows them:\n%s", demoOperator, reason, code, indent(d.slack.lastReply()))
	d.say("the alert message, updated in place:\n%s", indent(d.slack.current(msg)))

	k, err := ledger.Get(ctx, d.pool, key)
	if err != nil {
		return err
	}
	d.say("%s is now %s: the agent's next retry re-claims it and runs refund_payment again", key, k.Status)
	d.say("its audit trail (ledgerkeeper inspect %s):", key)
	hist, err := store.History(ctx, d.pool, key, 10)
	if err != nil {
		return err
	}
	for _, h := range hist {
		line := fmt.Sprintf("  %s  %-18s  %-9s  %s", ts(h.CreatedAt), h.Actor, h.Verdict, h.Action)
		if h.Error != "" {
			line += ": " + h.Error
		}
		if len(h.Evidence) > 0 && string(h.Evidence) != "null" {
			line += " " + string(h.Evidence)
		}
		d.say("%s", line)
	}
	return nil
}

// alertAbout is the first posted message naming key, as it was posted.
func (f *fakeSlack) alertAbout(key string) *fakeMessage {
	f.mu.Lock()
	defer f.mu.Unlock()
	for _, m := range f.msgs {
		if bytes.Contains(m.blocks, []byte(key)) {
			c := *m
			return &c
		}
	}
	return nil
}

// current is msg as it stands now, as on-call reads it.
func (f *fakeSlack) current(msg *fakeMessage) string {
	f.mu.Lock()
	defer f.mu.Unlock()
	if m := f.message(msg.channel, msg.ts); m != nil {
		return blocksOr(m.blocks, m.text)
	}
	return ""
}

func (f *fakeSlack) lastReply() string {
	f.mu.Lock()
	defer f.mu.Unlock()
	if len(f.replies) == 0 {
		return "(nothing)"
	}
	return f.replies[len(f.replies)-1]
}

// lastView is the view opened last, decoded (nil: none).
func (f *fakeSlack) lastView() *slack.View {
	f.mu.Lock()
	defer f.mu.Unlock()
	if len(f.views) == 0 {
		return nil
	}
	var v slack.View
	if json.Unmarshal(f.views[len(f.views)-1], &v) != nil {
		return nil
	}
	return &v
}

// blockActions is the payload Slack sends when user clicks the button
// actionID (value key) on msg.
func (f *fakeSlack) blockActions(user string, msg *fakeMessage, actionID, key string) slack.InteractionCallback {
	f.mu.Lock()
	n := len(f.replies) + len(f.views)
	f.mu.Unlock()
	var m slack.Message
	m.Channel, m.Timestamp, m.Text = msg.channel, msg.ts, msg.text
	_ = json.Unmarshal(msg.blocks, &m.Blocks)
	stamp := fmt.Sprintf("1700000002.%06d", n)
	return slack.InteractionCallback{
		Type:        slack.InteractionTypeBlockActions,
		TriggerID:   "demo-trigger-" + strconv.Itoa(n),
		ResponseURL: f.url + "/response/" + msg.ts,
		ActionTs:    stamp,
		User:        slack.User{ID: user},
		Channel:     slack.Channel{GroupConversation: slack.GroupConversation{Conversation: slack.Conversation{ID: msg.channel}}},
		Message:     m,
		Container:   slack.Container{Type: "message", MessageTs: msg.ts, ChannelID: msg.channel},
		ActionCallback: slack.ActionCallbacks{BlockActions: []*slack.BlockAction{
			{ActionID: actionID, Value: key, ActionTs: stamp},
		}},
	}
}

// viewSubmission is user submitting view with every text input set to
// text.
func viewSubmission(user string, view *slack.View, text string) slack.InteractionCallback {
	v := *view
	v.Hash = "demo-" + v.ID
	v.State = &slack.ViewState{Values: map[string]map[string]slack.BlockAction{}}
	for _, b := range v.Blocks.BlockSet {
		in, ok := b.(*slack.InputBlock)
		if !ok {
			continue
		}
		if el, ok := in.Element.(*slack.PlainTextInputBlockElement); ok {
			v.State.Values[in.BlockID] = map[string]slack.BlockAction{el.ActionID: {ActionID: el.ActionID, BlockID: in.BlockID, Type: "plain_text_input", Value: text}}
		}
	}
	return slack.InteractionCallback{Type: slack.InteractionTypeViewSubmission, User: slack.User{ID: user}, View: v}
}

// viewText is a modal as the user reads it: its title and sections.
func viewText(v *slack.View) string {
	var b strings.Builder
	if v.Title != nil {
		b.WriteString("[" + v.Title.Text + "]\n")
	}
	for _, blk := range v.Blocks.BlockSet {
		switch x := blk.(type) {
		case *slack.SectionBlock:
			if x.Text != nil {
				b.WriteString(x.Text.Text + "\n")
			}
		case *slack.InputBlock:
			if x.Label != nil {
				b.WriteString(x.Label.Text + ": ____\n")
			}
		}
	}
	return b.String()
}

// interact posts cb to endpoint as Slack does: form-encoded payload, signed
// with the signing secret (v0 HMAC-SHA256 of "v0:timestamp:body").
// https://api.slack.com/authentication/verifying-requests-from-slack
func (f *fakeSlack) interact(ctx context.Context, endpoint, secret string, cb slack.InteractionCallback) (int, error) {
	js, err := json.Marshal(&cb)
	if err != nil {
		return 0, err
	}
	body := []byte(url.Values{"payload": {string(js)}}.Encode())
	now := time.Now()
	mac := hmac.New(sha256.New, []byte(secret))
	fmt.Fprintf(mac, "v0:%d:", now.Unix())
	mac.Write(body)
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, endpoint, bytes.NewReader(body))
	if err != nil {
		return 0, err
	}
	req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	req.Header.Set("X-Slack-Request-Timestamp", strconv.FormatInt(now.Unix(), 10))
	req.Header.Set("X-Slack-Signature", "v0="+hex.EncodeToString(mac.Sum(nil)))
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return 0, err
	}
	defer resp.Body.Close()
	_, _ = io.Copy(io.Discard, resp.Body)
	return resp.StatusCode, nil
}
