package interact

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/slack-go/slack"

	"github.com/ledgerkeeper/ledgerkeeper/alerts"
	"github.com/ledgerkeeper/ledgerkeeper/ledger"
	"github.com/ledgerkeeper/ledgerkeeper/operator"
)

// The modals' callback IDs.
const (
	viewHold          = "lk_hold"
	viewRetryable     = "lk_retryable"
	viewOutcome       = "lk_outcome"
	viewOutcomeReview = "lk_outcome_confirm"
)

// The inputs' block and action IDs (one action per block, same name).
const (
	inReason = "reason"
	inCode   = "code"
	inBody   = "body"
)

// maxMetadata is Slack's limit on a view's private_metadata.
// https://api.slack.com/reference/surfaces/views
const maxMetadata = 3000

// meta is what a modal carries to its submission: the key, the alert
// message (to update it) and how to answer; the outcome under review.
type meta struct {
	Key string `json:"k"`
	// ClaimedAt is the claim the operator was shown when the form opened:
	// a resolve applies to that attempt only (operator.ResolveRequest's
	// ClaimedAt), never to one a retry made while the form was open.
	ClaimedAt *time.Time `json:"ca,omitempty"`
	where
	Code   int             `json:"code,omitempty"`
	Body   json.RawMessage `json:"body,omitempty"`
	Reason string          `json:"reason,omitempty"`
}

func (m meta) encode() string {
	b, err := json.Marshal(m)
	if err != nil {
		// Strings and a valid JSON body: cannot fail.
		panic(fmt.Sprintf("interact: encode private_metadata: %v", err))
	}
	return string(b)
}

func modal(callbackID, title, submit string, m meta, blocks ...slack.Block) slack.ModalViewRequest {
	if m.Ledger != "" {
		blocks = append([]slack.Block{ledgerLine(m.Ledger)}, blocks...)
	}
	return slack.ModalViewRequest{
		Type:            slack.VTModal,
		CallbackID:      callbackID,
		Title:           plain(title),
		Submit:          plain(submit),
		Close:           plain("Cancel"),
		PrivateMetadata: m.encode(),
		Blocks:          slack.Blocks{BlockSet: blocks},
	}
}

func plain(s string) *slack.TextBlockObject {
	return slack.NewTextBlockObject(slack.PlainTextType, s, false, false)
}

func mrkdwn(s string) *slack.SectionBlock {
	return slack.NewSectionBlock(slack.NewTextBlockObject(slack.MarkdownType, s, false, true), nil, nil)
}

func input(id, label, placeholder string, multiline bool, maxLen int) *slack.InputBlock {
	el := slack.NewPlainTextInputBlockElement(plain(placeholder), id)
	el.Multiline, el.MaxLength = multiline, maxLen
	return slack.NewInputBlock(id, plain(label), nil, el)
}

func reasonInput(placeholder string) *slack.InputBlock {
	return input(inReason, "Reason (goes into the audit trail)", placeholder, true, 1000)
}

func holdModal(key string, w where) slack.ModalViewRequest {
	return modal(viewHold, "Hold key", "Hold", meta{Key: key, where: w},
		mrkdwn("Put "+alerts.InlineCode(key, 400)+" on hold: the reconciler neither probes nor decides it, purge keeps it and resolve refuses it, until someone releases it. Retries are still answered as the key's status says."),
		reasonInput("investigating downstream"))
}

func retryableModal(k ledger.Key, w where) slack.ModalViewRequest {
	return modal(viewRetryable, "Mark retryable", "Mark retryable", meta{Key: k.Key, ClaimedAt: &k.ClaimedAt, where: w},
		mrkdwn("The next retry of "+alerts.InlineCode(k.Key, 400)+" will run "+alerts.InlineCode(k.Tool, 200)+" again. Mark it retryable only if you checked that the effect never happened downstream."),
		attemptLine(k),
		reasonInput("checked downstream: never happened"))
}

func outcomeModal(k ledger.Key, w where) slack.ModalViewRequest {
	return modal(viewOutcome, "Store outcome", "Review", meta{Key: k.Key, ClaimedAt: &k.ClaimedAt, where: w},
		mrkdwn("Store the outcome of "+alerts.InlineCode(k.Key, 400)+": every retry will receive this response instead of running "+alerts.InlineCode(k.Tool, 200)+" again. Give the status code and body the tool returned for the effect that happened downstream. For an MCP tool give a JSON object: its retries receive it as structured content (when it matches the tool's output schema); any other body, such as `\"refunded\"`, reaches them as text only."),
		attemptLine(k),
		input(inCode, "HTTP status code", "201", false, 3),
		input(inBody, "Response body (JSON)", `{"id": "T-1"}`, true, 2500),
		reasonInput("checked downstream: it happened"))
}

// attemptLine names the attempt the form judges: a retry that re-claims
// the key while the form is open makes the submission refused.
func attemptLine(k ledger.Key) *slack.SectionBlock {
	return mrkdwn("This applies to the attempt claimed at " + k.ClaimedAt.UTC().Format("2006-01-02 15:04:05 UTC") +
		" (status " + alerts.InlineCode(k.Status, 40) + "). If a retry claims the key again before you submit, nothing is written.")
}

// reviewModal is the confirmation of an outcome: what every retry will
// receive.
func reviewModal(m meta) slack.ModalViewRequest {
	return modal(viewOutcomeReview, "Confirm outcome", "Store it", m,
		mrkdwn("Every retry of "+alerts.InlineCode(m.Key, 400)+fmt.Sprintf(" will receive *HTTP %d* with this body, forever (a completed key is final):", m.Code)),
		mrkdwn(alerts.CodeBlock(string(m.Body), 2600)),
		mrkdwn("*Reason:* "+alerts.EscapeMrkdwn(m.Reason)))
}

func value(v slack.View, id string) string {
	if v.State == nil {
		return ""
	}
	return strings.TrimSpace(v.State.Values[id][id].Value)
}

func (h *Handler) viewSubmission(ctx context.Context, cb slack.InteractionCallback) (any, error) {
	v := cb.View
	var action Action
	switch v.CallbackID {
	case viewHold:
		action = ActionHold
	case viewRetryable:
		action = ActionRetryable
	case viewOutcome, viewOutcomeReview:
		action = ActionStoreOutcome
	default:
		return nil, nil
	}
	var m meta
	if err := json.Unmarshal([]byte(v.PrivateMetadata), &m); err != nil || m.Key == "" {
		return nil, fmt.Errorf("view %s: private_metadata is not ours", v.CallbackID)
	}
	user := cb.User.ID
	b, ok := h.bookNamed(m.Ledger)
	if !ok {
		// A form opened by a process keeping other ledgers (the
		// configuration changed meanwhile): nothing to act on.
		h.log.Warn("slack submission refused: its form names no ledger this process keeps",
			"user", user, "view", v.CallbackID, "ledger", h.red.String(safeClip(m.Ledger, 70)))
		why := "That form names no ledger, and this ledgerkeeper keeps several (" + h.ledgerList() + "): nothing changed."
		if m.Ledger != "" {
			why = "That form was opened for ledger " + alerts.InlineCode(m.Ledger, 70) + ", which this ledgerkeeper does not keep now: nothing changed."
		}
		w := m.where
		w.Ledger = ""
		h.reply(w, user, why)
		return slack.NewClearViewSubmissionResponse(), nil
	}
	// Again at the submission: the operators list may have changed since
	// the form opened.
	op, ok, err := h.authorize(ctx, b, m.where, user, action, m.Key)
	if !ok || err != nil {
		return slack.NewClearViewSubmissionResponse(), err
	}
	if v.CallbackID == viewOutcome {
		return h.review(m, v, op)
	}
	reason := value(v, inReason)
	if v.CallbackID != viewOutcomeReview && reason == "" {
		return slack.NewErrorsViewSubmissionResponse(map[string]string{inReason: "Give a reason: it goes into the audit trail."}), nil
	}
	// Once per submission, whichever transport, replica or retry
	// delivered it; claimed only once the form is complete, so a form
	// sent back with errors can be submitted again.
	fresh, err := h.Claim(ctx, "view:"+v.ID+":"+cmpStr(cb.Hash, v.Hash), SeenTTL)
	if err != nil {
		return nil, err
	}
	if !fresh {
		h.log.Info("slack submission already handled", "user", user, "view", v.CallbackID)
		return slack.NewClearViewSubmissionResponse(), nil
	}
	switch v.CallbackID {
	case viewHold:
		return nil, h.hold(ctx, b, m, user, op, reason)
	case viewRetryable:
		req := operator.ResolveRequest{Key: m.Key, Mark: operator.MarkRetryable, Reason: reason + " " + byline(op), Actor: b.actor(user),
			Windows: b.windows, ClaimedAt: m.ClaimedAt}
		return nil, h.resolve(ctx, b, m, user, op, req, "marked "+alerts.InlineCode(m.Key, 300)+" retryable")
	}
	// The reviewed outcome, as the review showed it.
	req := operator.ResolveRequest{Key: m.Key, Mark: operator.MarkCompleted, Code: m.Code, Body: m.Body,
		Reason: m.Reason + " " + byline(op), Actor: b.actor(user), Windows: b.windows, ClaimedAt: m.ClaimedAt}
	err = h.resolve(ctx, b, m, user, op, req, fmt.Sprintf("stored the outcome of %s (HTTP %d)", alerts.InlineCode(m.Key, 300), m.Code))
	// Close the form and its review.
	return slack.NewClearViewSubmissionResponse(), err
}

func (h *Handler) hold(ctx context.Context, b book, m meta, user string, op Operator, reason string) error {
	_, err := operator.Hold(ctx, b.pool, operator.HoldRequest{Key: m.Key, Reason: reason + " " + byline(op), Actor: b.actor(user)})
	if err != nil && !isAnswer(err) {
		h.replyFailed(m.where, user)
		return err
	}
	if err != nil {
		h.reply(m.where, user, explain(err, m.Key))
		return nil
	}
	h.reply(m.where, user, alerts.InlineCode(m.Key, 400)+" is on hold: the reconciler neither probes nor decides it, purge keeps it and resolve refuses it, until someone releases it.")
	h.annotate(m.where, fmt.Sprintf("%s put %s on hold at %s: %s", name(op), alerts.InlineCode(m.Key, 300), h.clock(), alerts.EscapeMrkdwn(oneLine(reason, 200))), change{ledger: b.name, key: m.Key, held: true})
	return nil
}

func (h *Handler) resolve(ctx context.Context, b book, m meta, user string, op Operator, req operator.ResolveRequest, did string) error {
	_, err := operator.Resolve(ctx, b.pool, req)
	if err != nil && !isAnswer(err) {
		h.replyFailed(m.where, user)
		return err
	}
	h.reply(m.where, user, explainResolve(err, req))
	if err == nil {
		h.annotate(m.where, fmt.Sprintf("%s %s at %s", name(op), did, h.clock()), change{ledger: b.name, key: m.Key, settled: true})
	}
	return nil
}

// review checks the outcome form, every field at once (errors inline,
// under the field), then pushes the confirmation of what every retry will
// receive. The operator package is the judge: its Validate has the last
// word, and Resolve checks again.
func (h *Handler) review(m meta, v slack.View, op Operator) (any, error) {
	errs := map[string]string{}
	code, err := strconv.Atoi(value(v, inCode))
	switch {
	case err != nil:
		errs[inCode] = "A number: the HTTP status code the tool returned (for example 201)."
	case code < 100 || code > 599:
		errs[inCode] = "An HTTP status code: 100 to 599."
	case code >= 500:
		errs[inCode] = "A 5xx would be replayed to every retry forever, so it is not stored from Slack (the caching rule keeps definitive outcomes only)."
	}
	body := []byte(value(v, inBody))
	var compact bytes.Buffer
	if len(body) == 0 || json.Compact(&compact, body) != nil {
		errs[inBody] = "Valid JSON: the response body every retry will receive."
	}
	reason := value(v, inReason)
	if reason == "" {
		errs[inReason] = "Give a reason: it goes into the audit trail."
	}
	if len(errs) == 0 {
		req := operator.ResolveRequest{Key: m.Key, Mark: operator.MarkCompleted, Code: code, Body: compact.Bytes(), Reason: reason, Actor: "slack:check"}
		switch err := req.Validate(); {
		case errors.Is(err, operator.ErrServerErrorOutcome), errors.Is(err, operator.ErrBadCode):
			errs[inCode] = err.Error()
		case errors.Is(err, operator.ErrBadBody):
			errs[inBody] = err.Error()
		case err != nil:
			errs[inReason] = err.Error()
		}
	}
	if len(errs) > 0 {
		return slack.NewErrorsViewSubmissionResponse(errs), nil
	}
	m.Code, m.Body, m.Reason = code, compact.Bytes(), reason
	if len(m.encode()) > maxMetadata {
		return slack.NewErrorsViewSubmissionResponse(map[string]string{inBody: "Too long to confirm through Slack (a form carries 3000 characters): store it with `ledgerkeeper resolve --completed`."}), nil
	}
	rv := reviewModal(m)
	return slack.NewPushViewSubmissionResponse(&rv), nil
}

// oneLine folds s to one line of at most max characters.
func oneLine(s string, max int) string {
	s = strings.Join(strings.Fields(s), " ")
	if r := []rune(s); len(r) > max {
		return string(r[:max-1]) + "…"
	}
	return s
}
