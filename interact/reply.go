package interact

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strings"
	"sync"
	"time"

	"github.com/slack-go/slack"

	"github.com/ledgerkeeper/ledgerkeeper/alerts"
	"github.com/ledgerkeeper/ledgerkeeper/operator"
)

// reply answers user alone, after the acknowledgement (a follow-up,
// retried): through the response_url when the interaction gave one, else
// (or when it fails) chat.postEphemeral in the alert's channel. A failure
// is logged: the action's effect, if any, is in the ledger already.
func (h *Handler) reply(w where, user, text string, blocks ...slack.Block) {
	h.goFollowUp(func() { h.sendReply(w, user, text, blocks...) })
}

// sendReply is reply on the calling follow-up's goroutine. An answer about
// a named ledger's key says which ledger first.
func (h *Handler) sendReply(w where, user, text string, blocks ...slack.Block) {
	if w.Ledger != "" {
		text = "Ledger " + alerts.InlineCode(w.Ledger, 70) + ": " + text
		if len(blocks) > 0 {
			blocks = append([]slack.Block{ledgerLine(w.Ledger)}, blocks...)
		}
	}
	_ = h.retry("reply", time.Time{}, func(ctx context.Context) error {
		var errs []error
		if w.ResponseURL != "" {
			err := h.postResponse(ctx, w.ResponseURL, map[string]any{
				"response_type": "ephemeral", "replace_original": false, "text": text, "blocks": replyBlocks(text, blocks),
			})
			if err == nil {
				return nil
			}
			errs = append(errs, err)
		}
		if w.Channel == "" {
			if len(errs) == 0 {
				return permanentError{"nowhere to answer: no response_url and no channel"}
			}
			return errors.Join(errs...)
		}
		_, err := h.cfg.Slack.PostEphemeralContext(ctx, w.Channel, user, slack.MsgOptionText(text, false), slack.MsgOptionBlocks(replyBlocks(text, blocks)...))
		if err == nil {
			return nil
		}
		return errors.Join(append(errs, fmt.Errorf("chat.postEphemeral: %w", err))...)
	}, "user", user, "channel", w.Channel)
}

// ledgerLine is the context line naming the ledger above an answer's or a
// form's blocks.
func ledgerLine(ledger string) *slack.ContextBlock {
	return slack.NewContextBlock("", slack.NewTextBlockObject(slack.MarkdownType, "*Ledger* "+alerts.InlineCode(ledger, 70), false, true))
}

func replyBlocks(text string, blocks []slack.Block) []slack.Block {
	if len(blocks) > 0 {
		return blocks
	}
	return []slack.Block{mrkdwn(text)}
}

// replyFailed tells the user an action failed on our side.
func (h *Handler) replyFailed(w where, user string) {
	h.reply(w, user, "That failed inside ledgerkeeper (its log says why); if anything was written, the audit trail shows it. Try again, or use the command line.")
}

// postResponse posts one JSON message to a response_url (which is a
// capability: it is never logged; the redactor masks Slack's hooks URLs).
func (h *Handler) postResponse(ctx context.Context, responseURL string, msg map[string]any) error {
	body, err := json.Marshal(msg)
	if err != nil {
		return fmt.Errorf("encode response: %w", err)
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, responseURL, bytes.NewReader(body))
	if err != nil {
		return permanentError{"response_url is not a URL"}
	}
	req.Header.Set("Content-Type", "application/json")
	resp, err := h.http.Do(req)
	if err != nil {
		var ue *url.Error
		if errors.As(err, &ue) {
			// *url.Error names the URL: keep only the cause.
			return fmt.Errorf("post to response_url: %w", ue.Err)
		}
		return fmt.Errorf("post to response_url: %w", err)
	}
	defer resp.Body.Close()
	_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, 64<<10))
	if resp.StatusCode/100 != 2 {
		return &responseStatusError{code: resp.StatusCode}
	}
	return nil
}

// logBlockID is the context block interact adds to an alert message, one
// line per action taken from it.
const logBlockID = "lk_log"

// maxContextElements is Slack's limit on a context block's elements.
const maxContextElements = 10

// change is what an action did to its key, for the alert message.
type change struct {
	// ledger is the key's ledger ("": the one ledger): its controls carry
	// alerts.ControlValue(ledger, key).
	ledger string
	key    string
	// settled: the action settled the key (completed or
	// failed_retryable): its buttons other than Inspect leave the message,
	// so nobody acts on it from a stale alert, and a one-key alert reads
	// as resolved (✅, its Next commands gone).
	settled bool
	// held (when not settled): the key is now on hold (Release replaces
	// Hold) or released (Hold replaces Release).
	held bool
}

// annotate adds line to the alert message (who did what, when), keeping
// its blocks but what c changes, after the acknowledgement (a follow-up,
// retried): chat.update of the message at w.Channel and w.TS, else its
// response_url with replace_original (a webhook's message). A failure is
// logged: the action stands.
//
// The updates of one message are made one at a time (in this process),
// each on the message as it stands, read back with conversations.history:
// two actions taken in quick succession from one alert each add their
// line, neither overwriting the other's with the copy its click carried.
// That copy is used only when the message cannot be read back (no
// channels:history scope).
func (h *Handler) annotate(w where, line string, c change) {
	if w.Channel == "" || w.TS == "" {
		return
	}
	h.goFollowUp(func() {
		unlock := h.msgs.lock(w.Channel + "/" + w.TS)
		defer unlock()
		_ = h.retry("alert update", time.Time{}, func(ctx context.Context) error { return h.updateAlert(ctx, w, line, c) },
			"channel", w.Channel, "ts", w.TS)
	})
}

// updateAlert is one attempt of annotate. A retry after an update that
// went through but whose answer was lost adds nothing twice (withLine).
func (h *Handler) updateAlert(ctx context.Context, w where, line string, c change) error {
	blocks, text := w.blocks, w.text
	hist, err := h.cfg.Slack.GetConversationHistoryContext(ctx, &slack.GetConversationHistoryParameters{
		ChannelID: w.Channel, Latest: w.TS, Oldest: w.TS, Inclusive: true, Limit: 1})
	switch {
	case err == nil && len(hist.Messages) > 0 && hist.Messages[0].Timestamp == w.TS:
		blocks, text = hist.Messages[0].Blocks.BlockSet, hist.Messages[0].Text
	case err != nil && (blocks == nil || transient(err)):
		return fmt.Errorf("read the alert message back (conversations.history): %w", err)
	case blocks == nil:
		return permanentError{"the alert message is not in its channel's history (deleted, or the bot lacks channels:history)"}
	}
	if c.settled {
		blocks = withoutControls(blocks, alerts.ControlValue(c.ledger, c.key))
		blocks = resolvedLook(blocks, c.ledger, c.key)
	} else {
		blocks = withHoldButton(blocks, c.ledger, c.key, c.held)
	}
	blocks, ok := withLine(blocks, line)
	if !ok {
		return permanentError{"the alert message has no room for another block"}
	}
	_, _, _, err = h.cfg.Slack.UpdateMessageContext(ctx, w.Channel, w.TS, slack.MsgOptionText(text, false), slack.MsgOptionBlocks(blocks...))
	if err == nil {
		return nil
	}
	err = fmt.Errorf("chat.update: %w", err)
	if w.ResponseURL != "" && !w.Ephemeral && !transient(err) {
		// chat.update edits the bot's own messages only; an alert posted
		// through an incoming webhook is replaced through the response_url
		// of the click on it. (A Slack in trouble is retried instead.)
		rerr := h.postResponse(ctx, w.ResponseURL, map[string]any{"replace_original": true, "text": text, "blocks": blocks})
		if rerr == nil {
			return nil
		}
		return errors.Join(err, rerr)
	}
	return err
}

// msgLocks serialises the updates of one message: a mutex per message
// with updates pending, dropped when none is.
type msgLocks struct {
	mu sync.Mutex
	m  map[string]*msgLock
}

type msgLock struct {
	mu      sync.Mutex
	waiters int
}

func (l *msgLocks) lock(id string) (unlock func()) {
	l.mu.Lock()
	if l.m == nil {
		l.m = map[string]*msgLock{}
	}
	ml := l.m[id]
	if ml == nil {
		ml = &msgLock{}
		l.m[id] = ml
	}
	ml.waiters++
	l.mu.Unlock()
	ml.mu.Lock()
	return func() {
		ml.mu.Unlock()
		l.mu.Lock()
		if ml.waiters--; ml.waiters == 0 {
			delete(l.m, id)
		}
		l.mu.Unlock()
	}
}

// withoutControls returns blocks without the buttons whose value is value
// (alerts.ControlValue: the key, or its ledger and the key), Inspect
// excepted, and without an actions block left empty. A grouped message's
// overflow menu stays: a click on it is told the key is settled.
func withoutControls(blocks []slack.Block, value string) []slack.Block {
	out := make([]slack.Block, 0, len(blocks))
	for _, b := range blocks {
		ab, ok := b.(*slack.ActionBlock)
		if !ok || ab.Elements == nil {
			out = append(out, b)
			continue
		}
		kept := make([]slack.BlockElement, 0, len(ab.Elements.ElementSet))
		for _, el := range ab.Elements.ElementSet {
			if btn, ok := el.(*slack.ButtonBlockElement); ok && btn.Value == value && btn.ActionID != alerts.ActionIDInspect {
				continue
			}
			kept = append(kept, el)
		}
		if len(kept) == 0 {
			continue
		}
		out = append(out, slack.NewActionBlock(ab.BlockID, kept...))
	}
	return out
}

// withHoldButton returns blocks with the Hold or Release button of key in
// ledger replaced by the one that applies now (held: Release).
func withHoldButton(blocks []slack.Block, ledger, key string, held bool) []slack.Block {
	value := alerts.ControlValue(ledger, key)
	out := make([]slack.Block, len(blocks))
	for i, b := range blocks {
		out[i] = b
		ab, ok := b.(*slack.ActionBlock)
		if !ok || ab.Elements == nil {
			continue
		}
		els := make([]slack.BlockElement, len(ab.Elements.ElementSet))
		changed := false
		for j, el := range ab.Elements.ElementSet {
			els[j] = el
			if btn, ok := el.(*slack.ButtonBlockElement); ok && btn.Value == value &&
				(btn.ActionID == alerts.ActionIDHold || btn.ActionID == alerts.ActionIDRelease) {
				els[j], changed = alerts.HoldButton(ledger, key, held), true
			}
		}
		if changed {
			out[i] = slack.NewActionBlock(ab.BlockID, els...)
		}
	}
	return out
}

// resolvedLook makes a one-key alert whose key was settled read as
// resolved: its header "🔴 Title: 1 key" becomes "✅ Resolved: Title (1
// key)", as the resolved notice reads, and the "*Next:*" advice of its
// sections goes (what to do next is done). A grouped message keeps its
// look: its other keys may still need a human. A named ledger's header
// keeps its "· ledger NAME" at the end.
func resolvedLook(blocks []slack.Block, ledger, key string) []slack.Block {
	tag := ""
	if ledger != "" {
		tag = alerts.LedgerTagPrefix + ledger
	}
	one := false
	for _, b := range blocks {
		if s, ok := b.(*slack.SectionBlock); ok && s.Text != nil && strings.Contains(s.Text.Text, "`"+key+"`") {
			one = true
		}
	}
	out := make([]slack.Block, 0, len(blocks))
	for _, b := range blocks {
		switch x := b.(type) {
		case *slack.HeaderBlock:
			if x.Text != nil {
				if title, ok := strings.CutPrefix(x.Text.Text, "🔴 "); ok && one && strings.HasSuffix(title, ": 1 key"+tag) {
					title = strings.TrimSuffix(title, ": 1 key"+tag)
					b = slack.NewHeaderBlock(slack.NewTextBlockObject(slack.PlainTextType, "✅ Resolved: "+title+" (1 key)"+tag, true, false))
				} else {
					one = false // a grouped message: leave it as it is
				}
			}
		case *slack.SectionBlock:
			if one && x.Text != nil {
				if i := strings.Index(x.Text.Text, "\n*Next:*"); i >= 0 {
					t := *x.Text
					t.Text = t.Text[:i]
					b = slack.NewSectionBlock(&t, x.Fields, x.Accessory, slack.SectionBlockOptionBlockID(x.BlockID))
				}
			}
		}
		out = append(out, b)
	}
	return out
}

// withLine returns blocks with line added to the log block (made at the
// end if there is none; its oldest line dropped when full). false: the
// message has no room for a log block.
func withLine(blocks []slack.Block, line string) ([]slack.Block, bool) {
	el := slack.NewTextBlockObject(slack.MarkdownType, line, false, true)
	out := make([]slack.Block, len(blocks), len(blocks)+1)
	copy(out, blocks)
	for i, b := range out {
		if c, ok := b.(*slack.ContextBlock); ok && c.BlockID == logBlockID {
			if n := len(c.ContextElements.Elements); n > 0 {
				if last, ok := c.ContextElements.Elements[n-1].(*slack.TextBlockObject); ok && last.Text == line {
					return out, true // already there: a retried update
				}
			}
			els := append(append([]slack.MixedElement{}, c.ContextElements.Elements...), el)
			if len(els) > maxContextElements {
				els = els[len(els)-maxContextElements:]
			}
			out[i] = slack.NewContextBlock(logBlockID, els...)
			return out, true
		}
	}
	if len(out) >= 50 {
		return nil, false
	}
	return append(out, slack.NewContextBlock(logBlockID, el)), true
}

// ActionSlackRefused is the audit action of a Slack user's attempt that
// authorization refused (verdict "operator", actor slack:<user id>, what
// was attempted in the error column). It changes nothing else.
const ActionSlackRefused = "slack_refused"

// authorize says whether user may take action. A refusal is answered
// (after the acknowledgement), logged and audited on the key (when it is
// in the ledger: an audit trail is per key) and changes nothing else. It
// says exactly what is missing: a user not in Config.Operators is told
// so; a listed one is told which action they lack and which they have.
func (h *Handler) authorize(ctx context.Context, b book, w where, user string, action Action, key string) (Operator, bool, error) {
	op, known := h.cfg.Operators[user]
	if known && op.may(action) {
		if op.Name == "" {
			op.Name = user
		}
		return op, true, nil
	}
	tried := actionWords(action)
	var what, answer string
	if !known {
		h.log.Warn("slack action refused: user not in alerts.slack.operators", "user", user, "action", string(action), "key", h.red.String(key))
		what = fmt.Sprintf("Slack user %s is not in alerts.slack.operators (tried: %s)", user, tried)
		answer = fmt.Sprintf("You are not allowed to %s from Slack: your Slack user ID %s is not in alerts.slack.operators, so you may take no action from Slack. Ask for it to be listed. Nothing changed; the attempt is in the key's audit trail.",
			tried, alerts.EscapeMrkdwn(user))
	} else {
		has := make([]string, len(op.Actions))
		for i, a := range op.Actions {
			has[i] = actionWords(a)
		}
		name := cmpStr(op.Name, user)
		h.log.Warn("slack action refused: operator lacks the action", "user", user, "action", string(action), "allowed", strings.Join(has, ", "), "key", h.red.String(key))
		what = fmt.Sprintf("Slack user %s (%s) lacks %s (has: %s)", user, name, tried, strings.Join(has, ", "))
		answer = fmt.Sprintf("You are not allowed to %s from Slack: as %s (Slack user ID %s) you may %s, and %s is not among your actions in alerts.slack.operators. Ask for it to be added. Nothing changed; the attempt is in the key's audit trail.",
			tried, alerts.EscapeMrkdwn(name), alerts.EscapeMrkdwn(user), orList(has), tried)
	}
	err := h.auditRefusal(ctx, b, key, user, what)
	h.reply(w, user, answer)
	return Operator{}, false, err
}

// actionWords is an action as a text says it ("mark retryable").
func actionWords(a Action) string { return strings.ReplaceAll(string(a), "_", " ") }

// orList joins actions for a sentence: "inspect", "inspect or hold",
// "inspect, hold or release" (each one the user may take).
func orList(words []string) string {
	if len(words) < 2 {
		return strings.Join(words, "")
	}
	return strings.Join(words[:len(words)-1], ", ") + " or " + words[len(words)-1]
}

func (h *Handler) auditRefusal(ctx context.Context, b book, key, user, what string) error {
	err := operator.AuditRefusal(ctx, b.pool, operator.RefusalRecord{Key: key, Action: ActionSlackRefused, Actor: b.actor(user), What: what})
	if err != nil {
		return fmt.Errorf("audit refused Slack action: %w", err)
	}
	return nil
}

// isAnswer reports whether err is the operator package's answer about the
// key (a refusal, an invalid request, a missing key, no hold), to tell the
// user, rather than a failure.
func isAnswer(err error) bool {
	return errors.Is(err, operator.ErrRefused) || errors.Is(err, operator.ErrInvalid) ||
		errors.Is(err, operator.ErrNoKey) || errors.Is(err, operator.ErrNotHeld)
}

// explain says in plain words what an act did (err nil) or why it was
// refused, for hold and release.
func explain(err error, key string) string {
	k := alerts.InlineCode(key, 400)
	var r *operator.RefusedError
	switch {
	case err == nil:
		return "Done: " + k + " changed as asked; the audit trail has it."
	case errors.Is(err, operator.ErrNoKey):
		return "No key " + k + " in the ledger (never claimed, or purged after it expired): nothing changed."
	case errors.Is(err, operator.ErrNotHeld):
		return "Key " + k + " is not on hold (someone may have released it already): nothing changed."
	case errors.As(err, &r):
		switch r.Why {
		case operator.RefusedAlreadyHeld:
			if h := r.Hold; h != nil {
				return "Refused: " + k + " is already on hold, by " + alerts.EscapeMrkdwn(h.Actor) + " since " + h.CreatedAt.UTC().Format(time.RFC3339) + ": " + alerts.EscapeMrkdwn(oneLine(h.Reason, 300)) + ". Nothing changed (replacing a hold is `ledgerkeeper hold --replace`)."
			}
			return "Refused: " + k + " is already on hold. Nothing changed."
		case operator.RefusedFinal:
			return "Refused: " + k + " is already " + alerts.EscapeMrkdwn(r.Status) + " (final: its outcome is stored and replayed to every retry). Nothing changed."
		case operator.RefusedAlreadyRetryable:
			return "Refused: " + k + " is already failed_retryable (its next retry runs the tool again). Nothing changed."
		case operator.RefusedHeld:
			who := ""
			if r.Hold != nil {
				who = " by " + alerts.EscapeMrkdwn(r.Hold.Actor)
			}
			return "Refused: " + k + " is on hold" + who + ": release it first. Nothing changed."
		case operator.RefusedInFlight:
			return fmt.Sprintf("Refused: %s is in flight (claimed less than its window + grace of %s ago, or heartbeating, by the database's clock): the original attempt may still finish. Nothing changed; try again once it is past its window.", k, r.Window)
		case operator.RefusedChanged:
			return "Refused: " + k + " changed meanwhile (" + alerts.EscapeMrkdwn(strings.ReplaceAll(r.Action, "_", " ")) + "): nothing written. Inspect it again."
		case operator.RefusedNoConfiguration:
			return "Refused: the processing window of " + alerts.InlineCode(r.Tool, 200) + " is unknown to this ledgerkeeper. Nothing changed."
		}
	case errors.Is(err, operator.ErrServerErrorOutcome):
		return "Refused: a 5xx outcome would be replayed to every retry forever; Slack does not store one. Nothing changed."
	case errors.Is(err, operator.ErrInvalid):
		return "Refused: " + alerts.EscapeMrkdwn(err.Error()) + ". Nothing changed."
	}
	return "Failed: " + alerts.EscapeMrkdwn(err.Error())
}

// explainResolve is explain for resolve, saying what the decision means.
func explainResolve(err error, req operator.ResolveRequest) string {
	if err != nil {
		return explain(err, req.Key)
	}
	k := alerts.InlineCode(req.Key, 400)
	if req.Mark == operator.MarkRetryable {
		return "Marked " + k + " failed_retryable: its next retry runs the tool again. Its open alerts are resolved; the audit trail has your reason."
	}
	return fmt.Sprintf("Stored the outcome of %s: every retry receives HTTP %d with the body you gave. Its open alerts are resolved; the audit trail has your reason.", k, req.Code)
}
