package console

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/ledgerkeeper/ledgerkeeper/ledger"
	"github.com/ledgerkeeper/ledgerkeeper/operator"
)

// maxFormBytes bounds an action's form (a body to store is the largest
// field).
const maxFormBytes = 1 << 20

// form is an action's fields, read and checked for shape.
type form struct {
	Key       string
	Reason    string
	ClaimedAt *time.Time
	Confirmed bool
}

// granted checks the user's grant for a, in the handler that acts: the
// page drew the button from the same grant, but a hidden button is no
// check. Without it: 403, nothing written, the attempt logged.
func (h *Handler) granted(w http.ResponseWriter, r *http.Request, a Action) bool {
	user := userOf(r)
	if h.may(user, a) {
		return true
	}
	on := ""
	if h.cfg.Ledger != "" {
		on = " on ledger " + h.cfg.Ledger
	}
	h.log.Warn("console: action refused: not granted"+on, "user", user, "action", string(a))
	h.render(w, r, http.StatusForbidden, "error", "Not allowed", nil,
		"You ("+user+") are not granted "+string(a)+on+" (console.operators): nothing changed.")
	return false
}

// readForm parses the action's form; ok is false when it answered a
// request that names no key.
func (h *Handler) readForm(w http.ResponseWriter, r *http.Request) (form, bool) {
	r.Body = http.MaxBytesReader(w, r.Body, maxFormBytes)
	if err := r.ParseForm(); err != nil {
		h.render(w, r, http.StatusBadRequest, "error", "Bad request", nil, "The form could not be read: nothing changed.")
		return form{}, false
	}
	f := form{Key: r.PostForm.Get("key"), Reason: strings.TrimSpace(r.PostForm.Get("reason")), Confirmed: r.PostForm.Get("confirm") == "yes"}
	if f.Key == "" || utf8.RuneCountInString(f.Key) > maxKeyRunes {
		h.render(w, r, http.StatusBadRequest, "error", "Bad request", nil, "The form names no key: nothing changed.")
		return form{}, false
	}
	if s := r.PostForm.Get("claimed_at"); s != "" {
		t, err := time.Parse(time.RFC3339Nano, s)
		if err != nil {
			h.render(w, r, http.StatusBadRequest, "error", "Bad request", nil, "The form's claimed_at is not a time: nothing changed.")
			return form{}, false
		}
		f.ClaimedAt = &t
	}
	return f, true
}

// answer turns an operator error into the key's page with the refusal
// (or into a logged failure), and success into a redirect to the page
// saying what was done (done: a key of doneText).
func (h *Handler) answer(w http.ResponseWriter, r *http.Request, key string, err error, done string) {
	switch {
	case err == nil:
		http.Redirect(w, r, h.keyURL(key)+"&done="+url.QueryEscape(done), http.StatusSeeOther)
	case errors.Is(err, operator.ErrNoKey):
		h.render(w, r, http.StatusNotFound, "error", "Key", nil, "No key "+strconv.Quote(key)+" in the ledger: nothing changed.")
	case errors.Is(err, operator.ErrInvalid), errors.Is(err, operator.ErrNotHeld):
		h.renderKey(w, r, key, http.StatusBadRequest, h.red.String(err.Error())+". Nothing changed.")
	case errors.Is(err, operator.ErrRefused):
		h.renderKey(w, r, key, http.StatusConflict, h.red.String(err.Error())+".")
	default:
		h.failed(w, r, "the action", err)
	}
}

func (h *Handler) actionContext(r *http.Request) (context.Context, context.CancelFunc) {
	// Once taken, the act is finished even if the browser goes away.
	return context.WithTimeout(context.WithoutCancel(r.Context()), readTimeout)
}

func (h *Handler) hold(w http.ResponseWriter, r *http.Request) {
	if !h.granted(w, r, ActionHold) {
		return
	}
	f, ok := h.readForm(w, r)
	if !ok {
		return
	}
	req := operator.HoldRequest{Key: f.Key, Reason: f.Reason, Actor: h.actor(userOf(r))}
	if err := req.Validate(); err != nil {
		h.renderKey(w, r, f.Key, http.StatusBadRequest, h.red.String(err.Error())+". Nothing changed.")
		return
	}
	if !f.Confirmed {
		held, err := operator.Held(r.Context(), h.cfg.Pool, f.Key)
		switch {
		case err != nil:
			h.failed(w, r, "reading the hold", err)
			return
		case held:
			h.renderKey(w, r, f.Key, http.StatusConflict, "The key is already on hold (its hold is below): nothing changed.")
			return
		}
		h.confirm(w, r, f, "hold", "Hold", func(k ledger.Key) confirmData {
			return confirmData{Lines: holdLines(k)}
		}, nil)
		return
	}
	ctx, cancel := h.actionContext(r)
	defer cancel()
	_, err := operator.Hold(ctx, h.cfg.Pool, req)
	h.answer(w, r, f.Key, err, "hold")
}

// holdLines is what a hold changes for the key as it is now.
func holdLines(k ledger.Key) []string {
	lines := []string{"While the key is held the reconciler leaves it alone: no probe, no decision, no alert about it, until someone releases it or settles it by hand; the purge keeps it past its expiry."}
	switch k.Status {
	case ledger.StatusProcessing:
		lines = append(lines, "Every retry of this key keeps receiving 409 (in progress) with Retry-After, as now: the tool does not run again while the key is processing.")
	case ledger.StatusFailedRetryable:
		lines = append(lines, "A hold parks the reconciler, not the tool server: the next retry of this failed_retryable key still claims it and runs "+k.Tool+" again.")
	default:
		lines = append(lines, "Every retry of this key keeps receiving its stored outcome, as now.")
	}
	return lines
}

// releaseLines is what a release changes for the key as it is now.
func releaseLines(k ledger.Key) []string {
	if k.Status == ledger.StatusProcessing {
		return []string{"Once released, the reconciler may probe this key and decide it at its next pass: found, its stored outcome is what every retry receives; not found (and witnessed), it is marked failed_retryable and the next retry runs " + k.Tool + " again.",
			"Until then every retry keeps receiving 409 (in progress) with Retry-After."}
	}
	return []string{"Once released, nothing changes for a retry (the key is " + k.Status + "); the purge may delete the key once it expires."}
}

func (h *Handler) release(w http.ResponseWriter, r *http.Request) {
	if !h.granted(w, r, ActionRelease) {
		return
	}
	f, ok := h.readForm(w, r)
	if !ok {
		return
	}
	if !f.Confirmed {
		held, err := operator.Held(r.Context(), h.cfg.Pool, f.Key)
		switch {
		case err != nil:
			h.failed(w, r, "reading the hold", err)
			return
		case !held:
			h.answer(w, r, f.Key, operator.ErrNotHeld, "")
			return
		}
		h.confirm(w, r, f, "release", "Release", func(k ledger.Key) confirmData {
			return confirmData{Lines: releaseLines(k)}
		}, nil)
		return
	}
	ctx, cancel := h.actionContext(r)
	defer cancel()
	err := operator.Release(ctx, h.cfg.Pool, operator.ReleaseRequest{Key: f.Key, Actor: h.actor(userOf(r)), Note: f.Reason})
	h.answer(w, r, f.Key, err, "release")
}

// confirmData is the confirmation of an act every retry will see.
type confirmData struct {
	Action    string // the form's path
	Key       string
	Tool      string
	Lines     []string
	Body      string
	Fields    map[string]string
	SubmitFor string
}

func (h *Handler) retryable(w http.ResponseWriter, r *http.Request) {
	if !h.granted(w, r, ActionRetryable) {
		return
	}
	f, ok := h.readForm(w, r)
	if !ok {
		return
	}
	req := operator.ResolveRequest{Key: f.Key, Mark: operator.MarkRetryable, Reason: f.Reason, Actor: h.actor(userOf(r)), Windows: h.cfg.Windows, ClaimedAt: f.ClaimedAt}
	if !h.checkResolve(w, r, f, req) {
		return
	}
	if !f.Confirmed {
		h.confirm(w, r, f, "retryable", "Mark retryable", func(k ledger.Key) confirmData {
			return confirmData{Lines: []string{
				"The next retry of this key will run " + k.Tool + " again: its effect will happen (again, if it already did).",
				"Mark it retryable only if you checked that the effect never happened downstream.",
			}}
		}, nil)
		return
	}
	ctx, cancel := h.actionContext(r)
	defer cancel()
	_, err := operator.Resolve(ctx, h.cfg.Pool, req)
	h.answer(w, r, f.Key, err, "retryable")
}

func (h *Handler) outcome(w http.ResponseWriter, r *http.Request) {
	if !h.granted(w, r, ActionStoreOutcome) {
		return
	}
	f, ok := h.readForm(w, r)
	if !ok {
		return
	}
	code, err := strconv.Atoi(strings.TrimSpace(r.PostForm.Get("code")))
	if err != nil {
		h.renderKey(w, r, f.Key, http.StatusBadRequest, "The status code must be a number, the HTTP status the tool returned (for example 201). Nothing changed.")
		return
	}
	body := []byte(strings.TrimSpace(r.PostForm.Get("body")))
	var compact bytes.Buffer
	if json.Compact(&compact, body) == nil {
		body = compact.Bytes()
	}
	req := operator.ResolveRequest{Key: f.Key, Mark: operator.MarkCompleted, Code: code, Body: body, Reason: f.Reason, Actor: h.actor(userOf(r)), Windows: h.cfg.Windows, ClaimedAt: f.ClaimedAt}
	if !h.checkResolve(w, r, f, req) {
		return
	}
	if !f.Confirmed {
		h.confirm(w, r, f, "outcome", "Store outcome", func(k ledger.Key) confirmData {
			return confirmData{Lines: []string{
				"Every retry of this key will receive HTTP " + strconv.Itoa(code) + " with the body below, forever (a completed key is final), instead of running " + k.Tool + " again.",
			}, Body: h.pretty(body)}
		}, map[string]string{"code": strconv.Itoa(code), "body": string(body)})
		return
	}
	ctx, cancel := h.actionContext(r)
	defer cancel()
	_, err = operator.Resolve(ctx, h.cfg.Pool, req)
	h.answer(w, r, f.Key, err, "outcome")
}

// checkResolve refuses a resolve wrong in itself before the confirmation
// (operator's Validate is the judge; Resolve checks again), and one
// without the claim the page showed: a resolve applies to that attempt
// only.
func (h *Handler) checkResolve(w http.ResponseWriter, r *http.Request, f form, req operator.ResolveRequest) bool {
	if err := req.Validate(); err != nil {
		h.renderKey(w, r, f.Key, http.StatusBadRequest, h.red.String(err.Error())+". Nothing changed.")
		return false
	}
	if f.ClaimedAt == nil {
		h.renderKey(w, r, f.Key, http.StatusBadRequest, "The form does not say which attempt it judged (claimed_at): reload the key's page. Nothing changed.")
		return false
	}
	return true
}

// confirm draws the confirmation page of an act, for the key as it is now;
// a key already settled is refused at once (Resolve would refuse it too).
func (h *Handler) confirm(w http.ResponseWriter, r *http.Request, f form, path, title string, lines func(ledger.Key) confirmData, extra map[string]string) {
	ctx, cancel := context.WithTimeout(r.Context(), readTimeout)
	defer cancel()
	k, err := ledger.Get(ctx, h.cfg.Pool, f.Key)
	switch {
	case errors.Is(err, ledger.ErrNotFound):
		h.answer(w, r, f.Key, operator.ErrNoKey, "")
		return
	case err != nil:
		h.failed(w, r, "reading the key", err)
		return
	case f.ClaimedAt != nil && !k.ClaimedAt.Equal(*f.ClaimedAt):
		h.renderKey(w, r, f.Key, http.StatusConflict, "The key was claimed again since the page was loaded: a retry is a new attempt, judge it afresh. Nothing changed.")
		return
	}
	// Settled since the page was drawn: told now, not after the
	// confirmation (Resolve would refuse it then). A hold or release
	// applies to the key whatever its state.
	resolve := path == "retryable" || path == "outcome"
	switch {
	case !resolve:
	case k.Status == ledger.StatusCompleted:
		h.answer(w, r, f.Key, &operator.RefusedError{Why: operator.RefusedFinal, Key: f.Key, Tool: k.Tool, Status: k.Status}, "")
		return
	case k.Status == ledger.StatusFailedRetryable && path == "retryable":
		h.answer(w, r, f.Key, &operator.RefusedError{Why: operator.RefusedAlreadyRetryable, Key: f.Key, Tool: k.Tool, Status: k.Status}, "")
		return
	}
	d := lines(k)
	d.Action, d.Key, d.Tool, d.SubmitFor = h.base+"key/"+path, f.Key, k.Tool, title
	d.Fields = map[string]string{"key": f.Key, "reason": f.Reason, "confirm": "yes"}
	if f.ClaimedAt != nil {
		d.Fields["claimed_at"] = f.ClaimedAt.UTC().Format(time.RFC3339Nano)
	}
	for n, v := range extra {
		d.Fields[n] = v
	}
	if resolve {
		d.Lines = append(d.Lines, "This applies to the attempt claimed at "+k.ClaimedAt.UTC().Format("2006-01-02 15:04:05 UTC")+" (status "+k.Status+"); if a retry claims the key again before you confirm, nothing is written.")
	}
	what := "Reason"
	if path == "release" {
		what = "Note"
	}
	if f.Reason != "" || path != "release" {
		d.Lines = append(d.Lines, what+" (audited as "+h.actor(userOf(r))+"): "+f.Reason)
	}
	h.render(w, r, http.StatusOK, "confirm", title, d, "")
}
