package alerts

import (
	"fmt"
	"regexp"
	"strings"
	"unicode/utf8"

	"github.com/slack-go/slack"
)

// The action IDs of the controls on interactive alert messages
// (Config.Interactive); package interact handles them. A button's value is
// the key it acts on: ControlValue, which names the ledger too when the
// dispatcher has one (Config.Ledger).
const (
	ActionIDInspect      = "lk_inspect"
	ActionIDHold         = "lk_hold"
	ActionIDRelease      = "lk_release"
	ActionIDRetryable    = "lk_retryable"
	ActionIDStoreOutcome = "lk_outcome"
	// ActionIDMenu is the overflow menu of a key listed in a grouped
	// message: each option's value is MenuValue(action ID, ControlValue).
	ActionIDMenu = "lk_menu"
	// ActionIDPick is the key picker of a message listing more keys than
	// it shows: each option's value is a ControlValue.
	ActionIDPick = "lk_pick"
)

// BlockIDOrigin prefixes the block_id of an actions block posted away from
// the alert (the picker's ephemeral reply): OriginBlockID names the alert
// message, so an action there still updates the alert.
const BlockIDOrigin = "lk@"

// OriginBlockID is the block_id naming the alert message at channel and ts.
func OriginBlockID(channel, ts string) string { return BlockIDOrigin + channel + "/" + ts }

// Slack's limits on interactive elements.
// https://api.slack.com/reference/block-kit/block-elements
const (
	maxOverflowOptions = 5
	maxOptionValue     = 150
	maxOptionText      = 75
	maxSelectOptions   = 100
	maxConfirmText     = 300
)

// MenuValue is an overflow option's value: the action ID and the
// control's value (ControlValue: the key, or the ledger and the key).
func MenuValue(actionID, value string) string { return actionID + ":" + value }

// ParseMenuValue splits a MenuValue.
func ParseMenuValue(v string) (actionID, value string, ok bool) {
	return strings.Cut(v, ":")
}

// LedgerSep separates the ledger's name from the key in the value of a
// control on a message of a named ledger (ControlValue). A ledger's name
// cannot hold it, so the first one ends the name whatever the key holds.
const LedgerSep = "|"

// maxKeyBytes is idempotency_keys.key's width (ledger.MaxKeyLength).
const maxKeyBytes = 128

var ledgerNameRE = regexp.MustCompile(`^[a-z0-9][a-z0-9_-]{0,62}$`)

// CheckLedgerName says what is wrong with a ledger's name, or nil: a
// ledgers section's key, lower-case letters, digits, _ and -, starting with
// a letter or digit, at most 63 bytes (the configuration's rule).
func CheckLedgerName(name string) error {
	if !ledgerNameRE.MatchString(name) {
		return fmt.Errorf("ledger name %q: use lower-case letters, digits, _ and -, starting with a letter or digit, at most 63 bytes", name)
	}
	return nil
}

// ControlValue is the value of a control acting on key: the key itself
// when ledger is "" (a process keeping one ledger: the values of every
// message posted so far), else the ledger's name, LedgerSep and the key,
// so that one handler serving several ledgers acts on the one the message
// is about. At most 63+1+128 bytes: far below Slack's 2000 for a button
// (an overflow option's 150 leave long keys without a menu, as before).
func ControlValue(ledger, key string) string {
	if ledger == "" {
		return key
	}
	return ledger + LedgerSep + key
}

// ParseLedgerValue reads a ControlValue that names a ledger, strictly: a
// valid ledger name, LedgerSep, and a key of 1 to 128 bytes (the key may
// hold LedgerSep itself). ok is false for anything else, a bare key
// included: its ledger is unknown. A handler serving one ledger reads
// values as bare keys and does not call it.
func ParseLedgerValue(v string) (ledger, key string, ok bool) {
	ledger, key, found := strings.Cut(v, LedgerSep)
	if !found || !ledgerNameRE.MatchString(ledger) || key == "" || len(key) > maxKeyBytes {
		return "", "", false
	}
	return ledger, key, true
}

// inLedger is " (ledger NAME)" after a key in a plain text, "" without a
// ledger.
func inLedger(ledger string) string {
	if ledger == "" {
		return ""
	}
	return " (ledger " + ledger + ")"
}

// keyActions are the five actions on one key, in the order on-call meets
// them: look, freeze, unfreeze, decide.
var keyActions = []struct{ id, label string }{
	{ActionIDInspect, "Inspect"},
	{ActionIDHold, "Hold"},
	{ActionIDRelease, "Release"},
	{ActionIDRetryable, "Mark retryable"},
	{ActionIDStoreOutcome, "Store outcome"},
}

// KeyActions is the actions block of one key of ledger ("": the one
// ledger): a button per action, ControlValue(ledger, key) as every
// button's value. Of Hold and Release only the one that applies is shown
// (held: Release, else Hold). Mark retryable asks for confirmation saying
// what the retry will do, Release what lifting the hold means. blockID is
// "" on the alert itself (Slack names the block), or an OriginBlockID
// elsewhere.
func KeyActions(ledger, key, tool, blockID string, held bool) *slack.ActionBlock {
	value := ControlValue(ledger, key)
	els := make([]slack.BlockElement, 0, len(keyActions))
	for _, a := range keyActions {
		switch a.id {
		case ActionIDHold, ActionIDRelease:
			if (a.id == ActionIDRelease) == held {
				els = append(els, HoldButton(ledger, key, held))
			}
			continue
		case ActionIDRetryable:
			b := slack.NewButtonBlockElement(a.id, value, plain(a.label))
			b.Style = slack.StyleDanger
			b.Confirm = slack.NewConfirmationBlockObject(
				plain("Mark retryable?"),
				plain(safeCutPlain("The next retry of "+key+inLedger(ledger)+" will run "+cmpStr(tool, "its tool")+" again: do this only if you checked that the effect never happened downstream. You will be asked for a reason.", maxConfirmText)),
				plain("Continue"), plain("Cancel"))
			els = append(els, b)
			continue
		}
		els = append(els, slack.NewButtonBlockElement(a.id, value, plain(a.label)))
	}
	return slack.NewActionBlock(blockID, els...)
}

// HoldButton is the button that changes the hold of key in ledger ("": the
// one ledger): Release (with its confirmation) when it is held, Hold
// otherwise. interact swaps one for the other on the alert message when
// someone holds or releases the key.
func HoldButton(ledger, key string, held bool) *slack.ButtonBlockElement {
	value := ControlValue(ledger, key)
	if !held {
		return slack.NewButtonBlockElement(ActionIDHold, value, plain("Hold"))
	}
	b := slack.NewButtonBlockElement(ActionIDRelease, value, plain("Release"))
	b.Confirm = slack.NewConfirmationBlockObject(
		plain("Release the hold?"),
		plain(safeCutPlain("The reconciler may probe and decide "+key+inLedger(ledger)+" again, and purge may remove it once it expires.", maxConfirmText)),
		plain("Release"), plain("Cancel"))
	return b
}

// keyMenu is the overflow menu of one key of ledger in a grouped message,
// or nil when the key is too long for an option's value.
func keyMenu(ledger, key string) *slack.OverflowBlockElement {
	opts := make([]*slack.OptionBlockObject, 0, maxOverflowOptions)
	for _, a := range keyActions[:maxOverflowOptions] {
		v := MenuValue(a.id, ControlValue(ledger, key))
		if utf8.RuneCountInString(v) > maxOptionValue {
			return nil
		}
		opts = append(opts, slack.NewOptionBlockObject(v, plain(a.label), nil))
	}
	return slack.NewOverflowBlockElement(ActionIDMenu, opts...)
}

// keyPicker is a select of keys of ledger the message counts but does not
// list; picking one answers with that key's actions. Keys too long for an
// option's value are left out; nil when none is left.
func keyPicker(ledger string, keys []string) *slack.ActionBlock {
	var opts []*slack.OptionBlockObject
	for _, k := range keys {
		if len(opts) == maxSelectOptions {
			break
		}
		v := ControlValue(ledger, k)
		if k == "" || utf8.RuneCountInString(v) > maxOptionValue {
			continue
		}
		opts = append(opts, slack.NewOptionBlockObject(v, plain(safeCutPlain(k, maxOptionText)), nil))
	}
	if len(opts) == 0 {
		return nil
	}
	sel := slack.NewOptionsSelectBlockElement(slack.OptTypeStatic, plain("Act on another key…"), ActionIDPick, opts...)
	return slack.NewActionBlock("", sel)
}

func plain(s string) *slack.TextBlockObject {
	return slack.NewTextBlockObject(slack.PlainTextType, s, false, false)
}

// safeCutPlain cuts plain text to max characters (no entities to respect).
func safeCutPlain(s string, max int) string {
	s = strings.ToValidUTF8(s, "\uFFFD")
	if utf8.RuneCountInString(s) <= max {
		return s
	}
	r := []rune(s)
	return string(r[:max-1]) + "…"
}

// EscapeMrkdwn makes text from outside (the ledger, a downstream, a Slack
// user's input) safe in Slack mrkdwn, as every alert text is.
func EscapeMrkdwn(s string) string { return escape(s) }

// InlineCode shows a value from outside as `code`, escaped and within max
// characters, as alert texts show keys.
func InlineCode(s string, max int) string { return inline(s, max) }

// CodeBlock shows a value from outside preformatted, escaped and within
// max characters.
func CodeBlock(s string, max int) string { return codeBlock(s, max) }
