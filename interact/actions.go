package interact

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"unicode/utf8"

	"github.com/slack-go/slack"

	"github.com/ledgerkeeper/ledgerkeeper/alerts"
	"github.com/ledgerkeeper/ledgerkeeper/ledger"
	"github.com/ledgerkeeper/ledgerkeeper/operator"
)

// actionOf maps the alert's controls to actions.
var actionOf = map[string]Action{
	alerts.ActionIDInspect:      ActionInspect,
	alerts.ActionIDHold:         ActionHold,
	alerts.ActionIDRelease:      ActionRelease,
	alerts.ActionIDRetryable:    ActionRetryable,
	alerts.ActionIDStoreOutcome: ActionStoreOutcome,
}

// maxKeyRunes is idempotency_keys.key's width: anything longer names no key.
const maxKeyRunes = 128

// where is the alert message an action concerns, and how to answer the
// user who took it.
type where struct {
	// Ledger is the name of the ledger the action acts on ("": the one
	// ledger of a Handler without Config.Ledgers). Answers name it.
	Ledger string `json:"l,omitempty"`
	// Channel and TS name the alert message ("" when unknown).
	Channel string `json:"c,omitempty"`
	TS      string `json:"t,omitempty"`
	// ResponseURL answers the user (ephemeral); "" falls back to
	// chat.postEphemeral in Channel.
	ResponseURL string `json:"u,omitempty"`
	// Ephemeral: ResponseURL answers an ephemeral message (the picker's),
	// not the alert, so it cannot replace the alert.
	Ephemeral bool `json:"e,omitempty"`
	// blocks and text are the message as the click delivered it (nil:
	// fetched when it is updated).
	blocks []slack.Block
	text   string
}

// whereOf locates a click: on the alert itself, or on the buttons a key
// picker answered with (their block_id names the alert).
func whereOf(cb slack.InteractionCallback, act *slack.BlockAction) where {
	w := where{Channel: cmpStr(cb.Container.ChannelID, cb.Channel.ID), TS: cmpStr(cb.Container.MessageTs, cb.Message.Timestamp), ResponseURL: cb.ResponseURL}
	if origin, ok := strings.CutPrefix(act.BlockID, alerts.BlockIDOrigin); ok {
		if ch, ts, ok := strings.Cut(origin, "/"); ok {
			w.Channel, w.TS = ch, ts
		}
		w.Ephemeral = true
		return w
	}
	w.Ephemeral = cb.Container.IsEphemeral
	if !cb.Container.IsEphemeral && len(cb.Message.Blocks.BlockSet) > 0 {
		w.blocks, w.text = cb.Message.Blocks.BlockSet, cb.Message.Text
	}
	return w
}

// safeClip cuts s to max characters, for a log line.
func safeClip(s string, max int) string {
	if r := []rune(s); len(r) > max {
		return string(r[:max]) + "…"
	}
	return s
}

func cmpStr(a, b string) string {
	if a != "" {
		return a
	}
	return b
}

func (h *Handler) blockActions(ctx context.Context, cb slack.InteractionCallback) error {
	if len(cb.ActionCallback.BlockActions) == 0 {
		return nil
	}
	act := cb.ActionCallback.BlockActions[0]
	id, value := act.ActionID, act.Value
	switch id {
	case alerts.ActionIDMenu:
		id, value, _ = alerts.ParseMenuValue(act.SelectedOption.Value)
	case alerts.ActionIDPick:
		value = act.SelectedOption.Value
	}
	action, ours := actionOf[id]
	if !ours && id != alerts.ActionIDPick {
		return nil
	}
	// Once per click, whichever transport, replica or retry delivered it.
	fresh, err := h.Claim(ctx, "act:"+cb.User.ID+":"+cmpStr(act.ActionTs, cb.ActionTs)+":"+act.ActionID, SeenTTL)
	if err != nil {
		return err
	}
	if !fresh {
		h.log.Info("slack action already handled", "user", cb.User.ID, "action", act.ActionID)
		return nil
	}
	w := whereOf(cb, act)
	user := cb.User.ID
	b, key, why := h.route(value)
	if why != "" {
		// No ledger to act on, nor to audit in: logged, and told.
		h.log.Warn("slack action refused: its control names no ledger this process keeps",
			"user", user, "action", act.ActionID, "value", h.red.String(safeClip(value, 200)))
		h.reply(w, user, why)
		return nil
	}
	w.Ledger = b.name
	if key == "" || utf8.RuneCountInString(key) > maxKeyRunes {
		h.reply(w, user, "That control names no key ledgerkeeper can act on: nothing changed.")
		return nil
	}
	if id == alerts.ActionIDPick {
		// Choosing a key shows its buttons: as much as Inspect allows.
		action = ActionInspect
	}
	op, ok, err := h.authorize(ctx, b, w, user, action, key)
	if !ok || err != nil {
		return err
	}
	if id == alerts.ActionIDPick {
		return h.pick(ctx, b, w, user, key)
	}
	switch action {
	case ActionInspect:
		return h.inspect(ctx, b, w, user, key)
	case ActionRelease:
		return h.release(ctx, b, w, user, op, key)
	case ActionHold:
		h.openModal(ctx, cb.TriggerID, w, user, holdModal(key, w))
		return nil
	case ActionRetryable, ActionStoreOutcome:
		// Read first: the modal says what the retry will run, and a key
		// settled since the alert (by the reconciler, the original attempt,
		// another operator) is told at once. operator.Resolve judges again
		// at the submission.
		k, err := ledger.Get(ctx, b.pool, key)
		switch {
		case errors.Is(err, ledger.ErrNotFound):
			h.reply(w, user, explain(operator.ErrNoKey, key))
			return nil
		case err != nil:
			h.replyFailed(w, user)
			return err
		case k.Status == ledger.StatusCompleted:
			h.reply(w, user, explain(&operator.RefusedError{Why: operator.RefusedFinal, Key: key, Tool: k.Tool, Status: k.Status}, key))
			return nil
		case k.Status == ledger.StatusFailedRetryable && action == ActionRetryable:
			h.reply(w, user, explain(&operator.RefusedError{Why: operator.RefusedAlreadyRetryable, Key: key, Tool: k.Tool, Status: k.Status}, key))
			return nil
		}
		if action == ActionRetryable {
			h.openModal(ctx, cb.TriggerID, w, user, retryableModal(k, w))
		} else {
			h.openModal(ctx, cb.TriggerID, w, user, outcomeModal(k, w))
		}
		return nil
	}
	return nil
}

// pick answers a key picked from a message's picker with that key's
// buttons, which act on the alert message like its own.
func (h *Handler) pick(ctx context.Context, b book, w where, user, key string) error {
	tool := ""
	if k, err := ledger.Get(ctx, b.pool, key); err == nil {
		tool = k.Tool
	}
	held, err := operator.Held(ctx, b.pool, key)
	if err != nil {
		h.replyFailed(w, user)
		return err
	}
	text := "Actions on " + alerts.InlineCode(key, 400) + ":"
	h.reply(w, user, text,
		slack.NewSectionBlock(slack.NewTextBlockObject(slack.MarkdownType, text, false, true), nil, nil),
		alerts.KeyActions(b.name, key, tool, alerts.OriginBlockID(w.Channel, w.TS), held))
	return nil
}

func (h *Handler) release(ctx context.Context, b book, w where, user string, op Operator, key string) error {
	err := operator.Release(ctx, b.pool, operator.ReleaseRequest{Key: key, Actor: b.actor(user), Note: "released " + byline(op)})
	if err != nil && !errors.Is(err, operator.ErrNotHeld) {
		h.replyFailed(w, user)
		return err
	}
	if err != nil {
		h.reply(w, user, explain(err, key))
		return nil
	}
	h.reply(w, user, "Released "+alerts.InlineCode(key, 400)+": the reconciler may probe and decide it again, and purge may remove it once expired.")
	h.annotate(w, fmt.Sprintf("%s released %s at %s", name(op), alerts.InlineCode(key, 300), h.clock()), change{ledger: b.name, key: key, held: false})
	return nil
}

// openModal opens a form with the click's trigger at once, beside the
// acknowledgement rather than after it: the trigger expires TriggerTTL
// after the click (Slack), so the call is retried only within that time,
// and the user is told when the form could not open.
func (h *Handler) openModal(ctx context.Context, trigger string, w where, user string, v slack.ModalViewRequest) {
	deadline := receivedAt(ctx).Add(TriggerTTL)
	h.goFollowUp(func() {
		err := h.retry("views.open", deadline, func(ctx context.Context) error {
			_, err := h.cfg.Slack.OpenViewContext(ctx, trigger, v)
			return err
		}, "user", user)
		if err != nil {
			h.sendReply(w, user, "Slack would not open the form (it must open within 3 seconds of the click): click again. Nothing changed.")
		}
	})
}

// name is an operator's name for a Slack text, escaped.
func name(op Operator) string { return alerts.EscapeMrkdwn(op.Name) }

// clock is the time for the line added to an alert.
func (h *Handler) clock() string { return h.now().UTC().Format("15:04 UTC") }
