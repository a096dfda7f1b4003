package console

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/ledgerkeeper/ledgerkeeper/ledger"
	"github.com/ledgerkeeper/ledgerkeeper/operator"
	"github.com/ledgerkeeper/ledgerkeeper/store"
)

// The bounds of bulk actions.
const (
	// DefaultBulkLimit is the most keys one bulk action takes unless
	// console.bulk_limit says otherwise.
	DefaultBulkLimit = 500
	// MaxBulkLimit is the largest console.bulk_limit: the form carries
	// every key with its claim, and the acts run key by key in one request.
	MaxBulkLimit = 10000
	// DefaultBulkTimeout bounds one bulk action's acts.
	DefaultBulkTimeout = 2 * time.Minute
	// bulkMaxAge is how old a dry run may be when it is confirmed: older,
	// the operator judged a ledger that has moved on and is shown it again.
	bulkMaxAge = 15 * time.Minute
	// bulkShown is how many keys the dry run lists (the form carries all).
	bulkShown = 50
)

// BulkConfig configures bulk actions by filter: from the keys page, hold,
// release or mark retryable every key of the filter, after a dry run that
// counts them and a typed confirmation of the count.
type BulkConfig struct {
	// Limit is the most keys one bulk action takes (console.bulk_limit);
	// a filter selecting more is refused: narrow it. 0: DefaultBulkLimit.
	Limit int
	// Timeout bounds one bulk action's acts, key by key; the keys not
	// reached by then are reported as not attempted. 0: DefaultBulkTimeout.
	Timeout time.Duration
}

// bulkAction is one action that can be taken by filter.
type bulkAction struct {
	Name  string // in the URLs: hold, release, retryable
	Grant Action
	Set   store.BulkSet
	Title string // "Hold by filter"
	Verb  string // typed in the confirmation: "hold 37"
	// Does says what the action does to each key ("put on hold").
	Does string
	// Which says which keys of the filter it applies to.
	Which string
	// Button is the submit button's text, %d the count.
	Button string
	// Reason: required (hold, mark retryable), else an optional note;
	// Placeholder shows what a reason looks like.
	Reason      bool
	Placeholder string
}

var bulkActions = map[string]bulkAction{
	"hold": {Name: "hold", Grant: ActionHold, Set: store.BulkNotHeld, Title: "Hold by filter", Verb: "hold",
		Does: "put on hold", Which: "the keys of the filter not on hold yet", Button: "Hold %d key(s)", Reason: true, Placeholder: "downstream incident INC-123"},
	"release": {Name: "release", Grant: ActionRelease, Set: store.BulkHeld, Title: "Release by filter", Verb: "release",
		Does: "released", Which: "the keys of the filter on hold", Button: "Release %d key(s)"},
	"retryable": {Name: "retryable", Grant: ActionRetryable, Set: store.BulkStuck, Title: "Mark retryable by filter", Verb: "mark retryable",
		Does: "marked retryable", Which: "the keys of the filter that are stuck: processing, past the tool's window + grace, no recent heartbeat, not on hold (in flight, held and settled keys would be refused)", Button: "Mark %d key(s) retryable", Reason: true, Placeholder: "checked downstream: none of them happened"},
}

// routesBulk registers the dry run (GET, a read) and the acts (a POST per
// action, each checking its grant first), and settles BulkConfig's
// defaults.
func (h *Handler) routesBulk(mux *http.ServeMux) {
	h.cfg.Bulk.Limit = cmp.Or(max(h.cfg.Bulk.Limit, 0), DefaultBulkLimit)
	h.cfg.Bulk.Timeout = cmp.Or(max(h.cfg.Bulk.Timeout, 0), DefaultBulkTimeout)
	mux.HandleFunc("GET "+h.base+"bulk", h.bulkDryRun)
	for name, a := range bulkActions {
		mux.HandleFunc("POST "+h.base+"bulk/"+name, func(w http.ResponseWriter, r *http.Request) { h.bulkAct(w, r, a) })
	}
}

// parseBulkFilter reads a filter as the keys page writes it; the error
// says which value is wrong.
func (h *Handler) parseBulkFilter(v url.Values, a bulkAction) (filterForm, error) {
	bf, err := h.parseFilter(v)
	if err != nil {
		return bf, err
	}
	if a.Set == store.BulkStuck {
		switch {
		case bf.Tool == "":
			return bf, errors.New("marking keys retryable by filter needs a tool: its window says which keys are in flight. Choose a tool on the keys page")
		case h.cfg.Windows == nil:
			return bf, errors.New("the tools' windows are unknown to this console (serve's configuration), so which keys are in flight cannot be judged: mark keys retryable from the command line with the configuration")
		}
	}
	return bf, nil
}

// bulkKey is a key of the set with the claim it had when listed.
type bulkKey struct {
	store.ListedKey
}

// Field is the key as the form carries it: its claim and itself.
func (k bulkKey) Field() string { return k.ClaimedAt.UTC().Format(time.RFC3339Nano) + " " + k.Key }

type bulkData struct {
	Action bulkAction
	Filter filterForm
	// Count is how many keys the action applies to (at most Limit+1).
	Count, Limit int
	// Over: more than Limit; nothing is offered.
	Over bool
	// Keys are the first keys listed; NotShown how many more there are.
	Keys     []store.ListedKey
	NotShown int
	// All is every key with its claim, for the form.
	All []bulkKey
	// AsOf is the database's clock when the set was read.
	AsOf time.Time
	// Retries says what every retry of these keys receives after the act.
	Retries []string
	// Granted: the user may take the action (the form is drawn).
	Granted bool
	// Phrase is what the user types to confirm ("hold 37").
	Phrase string
	// Reason is the reason typed before a refusal, kept.
	Reason string
	// Submit is the button's text ("Hold 37 keys"); Actor the audit's
	// name for the user.
	Submit, Actor string
}

// bulkDryRun counts and lists the keys an action would touch under the
// keys page's filter, and draws the typed confirmation for a user granted
// the action. It writes nothing.
func (h *Handler) bulkDryRun(w http.ResponseWriter, r *http.Request) {
	q := r.URL.Query()
	a, ok := bulkActions[q.Get("action")]
	if !ok {
		h.render(w, r, http.StatusBadRequest, "error", "Bulk action", nil, "No such bulk action: hold, release or retryable.")
		return
	}
	bf, err := h.parseBulkFilter(q, a)
	if err != nil {
		h.render(w, r, http.StatusBadRequest, "error", a.Title, nil, err.Error()+".")
		return
	}
	ctx, cancel := context.WithTimeout(r.Context(), readTimeout)
	defer cancel()
	keys, now, ok := h.bulkKeys(ctx, w, r, a, bf)
	if !ok {
		return
	}
	h.renderDryRun(w, r, a, bf, keys, now, http.StatusOK, "", "")
}

// bulkKeys reads the set (at most Limit+1 keys); ok is false when it
// answered the request.
func (h *Handler) bulkKeys(ctx context.Context, w http.ResponseWriter, r *http.Request, a bulkAction, bf filterForm) ([]store.ListedKey, time.Time, bool) {
	keys, now, err := store.BulkKeys(ctx, h.cfg.Pool, bf.f, a.Set, h.cfg.Bulk.Limit)
	switch {
	case errors.Is(err, ledger.ErrInvalid):
		h.render(w, r, http.StatusBadRequest, "error", a.Title, nil, err.Error()+". Nothing changed.")
		return nil, now, false
	case err != nil:
		h.failed(w, r, "listing the keys of the filter", err)
		return nil, now, false
	}
	return keys, now, true
}

// renderDryRun draws the dry run of keys read at now, with status and a
// refusal line.
func (h *Handler) renderDryRun(w http.ResponseWriter, r *http.Request, a bulkAction, bf filterForm, keys []store.ListedKey, now time.Time, status int, errText, reason string) {
	limit := h.cfg.Bulk.Limit
	d := bulkData{Action: a, Filter: bf, Count: len(keys), Limit: limit, Over: len(keys) > limit, AsOf: now,
		Granted: h.may(userOf(r), a.Grant), Reason: reason}
	d.Phrase = a.Verb + " " + strconv.Itoa(d.Count)
	d.Submit = fmt.Sprintf(a.Button, d.Count)
	d.Actor = h.actor(userOf(r))
	d.Keys = keys[:min(len(keys), bulkShown)]
	d.NotShown = len(keys) - len(d.Keys)
	for _, k := range keys {
		d.All = append(d.All, bulkKey{k})
	}
	d.Retries = h.bulkRetries(a, bf)
	if d.Over && errText == "" {
		errText = fmt.Sprintf("More than %d keys (console.bulk_limit) would be %s: nothing is offered. Narrow the filter (a tool, a status, a key prefix) and look again.", limit, a.Does)
	}
	h.render(w, r, status, "bulk", a.Title, d, errText)
}

// bulkRetries says what every retry of the keys receives after the act,
// as the single key's confirmation does.
func (h *Handler) bulkRetries(a bulkAction, bf filterForm) []string {
	switch a.Set {
	case store.BulkNotHeld:
		return []string{
			"A hold changes nothing a retry receives: a processing key keeps answering 409 (in flight) to every retry, a completed key keeps replaying its stored outcome, and a failed_retryable key can still be claimed by a retry (the tool server does not read holds).",
			"What it changes: the reconciler neither probes, resolves nor purges a held key until it is released, so a stuck key stays stuck and answers 409 for as long as the hold lasts.",
		}
	case store.BulkHeld:
		return []string{
			"A release changes nothing a retry receives by itself: the reconciler probes and settles the keys again on its next passes (a stuck key is completed when its probe finds the effect, marked failed_retryable when it trustedly finds none), and the purge may remove expired ones.",
		}
	default:
		return []string{
			"The next retry of each of these keys will run " + bf.Tool + " again: its effect will happen (again, if it already did).",
			"Mark them retryable only if you checked, for every one of them, that the effect never happened downstream: a bulk action is not evidence (runbook: never mark keys retryable in bulk to make a number go down).",
			"Each key is marked for the attempt listed here: a key claimed again by a retry since this dry run is refused, nothing written for it.",
		}
	}
}

// bulkOutcome is one key's result of a bulk act.
type bulkOutcome struct {
	Key string
	// Why is a refusal's or a failure's reason.
	Why string
}

type bulkResultData struct {
	Action  bulkAction
	Filter  filterForm
	AsOf    time.Time
	Done    []bulkOutcome
	Refused []bulkOutcome
	Failed  []bulkOutcome
	Skipped []bulkOutcome
	Timeout time.Duration
	Reason  string
	Actor   string
	// Confirmed is how many keys the user confirmed.
	Confirmed int
}

// bulkFormBytes bounds a bulk form: every key with its claim (a key is at
// most 128 characters, 4 bytes each, percent-encoded) and the rest.
func (h *Handler) bulkFormBytes() int64 {
	return int64(h.cfg.Bulk.Limit)*1600 + 64<<10
}

// bulkAct applies a to the keys of the dry run the user confirmed, key by
// key through the operator package: the grant first (403, nothing
// written), then the typed confirmation, the reason, the dry run's age,
// and the set read again, which must be the set confirmed (its count and
// its keys); each key then gets its own act, audit row and refusal.
func (h *Handler) bulkAct(w http.ResponseWriter, r *http.Request, a bulkAction) {
	if !h.granted(w, r, a.Grant) {
		return
	}
	r.Body = http.MaxBytesReader(w, r.Body, h.bulkFormBytes())
	if err := r.ParseForm(); err != nil {
		h.render(w, r, http.StatusBadRequest, "error", "Bad request", nil, "The form could not be read: nothing changed.")
		return
	}
	pf := r.PostForm
	bad := func(what string) {
		h.render(w, r, http.StatusBadRequest, "error", a.Title, nil, "The form "+what+": run the dry run again from the keys page. Nothing changed.")
	}
	bf, err := h.parseBulkFilter(pf, a)
	if err != nil {
		h.render(w, r, http.StatusBadRequest, "error", a.Title, nil, err.Error()+". Nothing changed.")
		return
	}
	count, err := strconv.Atoi(pf.Get("count"))
	if err != nil || count < 1 || count > h.cfg.Bulk.Limit {
		bad("does not carry the count the dry run showed")
		return
	}
	asOf, err := time.Parse(time.RFC3339Nano, pf.Get("as_of"))
	if err != nil {
		bad("does not say when the dry run was taken (as_of)")
		return
	}
	listed, ok := parseBulkKeys(pf["k"])
	if !ok || len(listed) != count {
		bad("does not carry the keys of the dry run with their claims")
		return
	}
	reason := strings.TrimSpace(pf.Get("reason"))
	typed := strings.Join(strings.Fields(strings.ToLower(pf.Get("confirm_text"))), " ")
	want := a.Verb + " " + strconv.Itoa(count)

	ctx, cancel := context.WithTimeout(r.Context(), readTimeout)
	defer cancel()
	keys, now, ok := h.bulkKeys(ctx, w, r, a, bf)
	if !ok {
		return
	}
	refuse := func(status int, why string) {
		h.log.Info("console: bulk action refused", "user", userOf(r), "action", a.Name, "filter", bf.Describe(), "why", why)
		h.renderDryRun(w, r, a, bf, keys, now, status, why+" Nothing changed.", reason)
	}
	// The set first: a confirmation of another set is no confirmation.
	switch {
	case now.Sub(asOf) > bulkMaxAge:
		refuse(http.StatusConflict, fmt.Sprintf("The dry run was taken at %s, more than %s ago: here it is as the ledger stands now; confirm it again.", asOf.UTC().Format("15:04:05 UTC"), bulkMaxAge))
		return
	case len(keys) > h.cfg.Bulk.Limit:
		refuse(http.StatusConflict, fmt.Sprintf("The set changed since the dry run: more than %d keys (console.bulk_limit) now, not the %d confirmed.", h.cfg.Bulk.Limit, count))
		return
	case len(keys) != count:
		refuse(http.StatusConflict, fmt.Sprintf("The set changed since the dry run: %d key(s) now, not the %d confirmed. Here is the new dry run.", len(keys), count))
		return
	}
	if gone := missing(listed, keys); gone > 0 {
		refuse(http.StatusConflict, fmt.Sprintf("The set changed since the dry run: %d of the %d keys confirmed no longer match, and as many others do now. Here is the new dry run.", gone, count))
		return
	}
	switch {
	case typed != want:
		refuse(http.StatusBadRequest, fmt.Sprintf("The confirmation typed was %q: to %s these %d keys, type %q.", pf.Get("confirm_text"), a.Verb, count, want))
		return
	case a.Reason && reason == "":
		refuse(http.StatusBadRequest, "A reason is required (it goes into every key's audit trail).")
		return
	}
	h.bulkApply(w, r, a, bf, asOf, listed, reason)
}

// parseBulkKeys reads the form's keys ("claimed_at key" each), in order.
func parseBulkKeys(fields []string) ([]bulkKey, bool) {
	keys := make([]bulkKey, 0, len(fields))
	seen := map[string]bool{}
	for _, s := range fields {
		at, key, ok := strings.Cut(s, " ")
		if !ok || key == "" || utf8.RuneCountInString(key) > maxKeyRunes || seen[key] {
			return nil, false
		}
		t, err := time.Parse(time.RFC3339Nano, at)
		if err != nil {
			return nil, false
		}
		seen[key] = true
		keys = append(keys, bulkKey{store.ListedKey{Key: key, ClaimedAt: t}})
	}
	return keys, true
}

// missing counts the listed keys that are not in keys.
func missing(listed []bulkKey, keys []store.ListedKey) int {
	now := make(map[string]bool, len(keys))
	for _, k := range keys {
		now[k.Key] = true
	}
	n := 0
	for _, k := range listed {
		if !now[k.Key] {
			n++
		}
	}
	return n
}

// bulkApply acts on each key in turn, within the bulk timeout: a key's
// refusal is reported and the next one taken; a failure of the database
// stops the rest (reported as not attempted), since what it did to the
// key is to be checked on its page.
func (h *Handler) bulkApply(w http.ResponseWriter, r *http.Request, a bulkAction, bf filterForm, asOf time.Time, keys []bulkKey, reason string) {
	user := userOf(r)
	act := h.actor(user)
	// Once confirmed, the acts go on if the browser goes away, within
	// their own bound.
	ctx, cancel := context.WithTimeout(context.WithoutCancel(r.Context()), h.cfg.Bulk.Timeout)
	defer cancel()
	d := bulkResultData{Action: a, Filter: bf, AsOf: asOf, Timeout: h.cfg.Bulk.Timeout, Reason: reason, Actor: act, Confirmed: len(keys)}
	stopped := ""
	for _, k := range keys {
		if stopped == "" && ctx.Err() != nil {
			stopped = fmt.Sprintf("not attempted: the bulk action's %s ran out", h.cfg.Bulk.Timeout)
		}
		if stopped != "" {
			d.Skipped = append(d.Skipped, bulkOutcome{Key: k.Key, Why: stopped})
			continue
		}
		var err error
		switch a.Set {
		case store.BulkNotHeld:
			_, err = operator.Hold(ctx, h.cfg.Pool, operator.HoldRequest{Key: k.Key, Reason: reason, Actor: act})
		case store.BulkHeld:
			err = operator.Release(ctx, h.cfg.Pool, operator.ReleaseRequest{Key: k.Key, Actor: act, Note: reason})
		default:
			claimed := k.ClaimedAt
			_, err = operator.Resolve(ctx, h.cfg.Pool, operator.ResolveRequest{Key: k.Key, Mark: operator.MarkRetryable, Reason: reason,
				Actor: act, Windows: h.cfg.Windows, ClaimedAt: &claimed})
		}
		var refused *operator.RefusedError
		switch {
		case err == nil:
			d.Done = append(d.Done, bulkOutcome{Key: k.Key})
		case errors.As(err, &refused) && refused.Why == operator.RefusedChanged && refused.Action == operator.ActionReclaimed:
			d.Refused = append(d.Refused, bulkOutcome{Key: k.Key, Why: "claimed again by a retry since the dry run: a new attempt, judge it on its page"})
		case errors.Is(err, operator.ErrRefused), errors.Is(err, operator.ErrNoKey), errors.Is(err, operator.ErrNotHeld), errors.Is(err, operator.ErrInvalid):
			d.Refused = append(d.Refused, bulkOutcome{Key: k.Key, Why: h.red.String(err.Error())})
		case ctx.Err() != nil:
			h.log.Warn("console: bulk action: out of time during a key's act", "user", user, "action", a.Name, "key", k.Key, "err", h.red.Error(err))
			d.Failed = append(d.Failed, bulkOutcome{Key: k.Key, Why: fmt.Sprintf("the bulk action's %s ran out during its act: whether it was %s is on its page", h.cfg.Bulk.Timeout, a.Does)})
			stopped = fmt.Sprintf("not attempted: the bulk action's %s ran out", h.cfg.Bulk.Timeout)
		default:
			// The database's trouble is not this key's: the rest wait
			// for a person to look.
			h.log.Error("console: bulk action: a key's act failed", "user", user, "action", a.Name, "key", k.Key, "err", h.red.Error(err))
			d.Failed = append(d.Failed, bulkOutcome{Key: k.Key, Why: "the database did not answer (see serve's log): whether it was " + a.Does + " is on its page"})
			stopped = "not attempted: an earlier key's act failed"
		}
	}
	h.log.Info("console: bulk action", "user", user, "action", a.Name, "filter", bf.Describe(),
		"done", len(d.Done), "refused", len(d.Refused), "failed", len(d.Failed), "not_attempted", len(d.Skipped))
	status := http.StatusOK
	if len(d.Failed) > 0 {
		status = http.StatusInternalServerError
	}
	h.render(w, r, status, "bulkdone", a.Title, d, "")
}

// bulkLinks are the keys page's offers of bulk actions for its filter,
// each only for a user granted it and where the filter can select a key
// it applies to.
type bulkLinks struct {
	Hold, Release, Retryable string
	// RetryableNeedsTool: mark retryable is granted but the filter names
	// no tool (its window says which keys are in flight).
	RetryableNeedsTool bool
}

// bulkOffers builds the keys page's bulk links for user and the page's
// query.
func (h *Handler) bulkOffers(user string, q url.Values) bulkLinks {
	bf, err := h.parseFilter(q)
	if err != nil {
		return bulkLinks{}
	}
	link := func(action string) string {
		v := bf.values()
		v.Set("action", action)
		return h.base + "bulk?" + v.Encode()
	}
	var l bulkLinks
	if h.may(user, ActionHold) && bf.Held != "yes" {
		l.Hold = link("hold")
	}
	if h.may(user, ActionRelease) && bf.Held != "no" && !bf.Stuck {
		l.Release = link("release")
	}
	if h.may(user, ActionRetryable) && bf.Held != "yes" && slices.Contains([]string{"", ledger.StatusProcessing}, bf.Status) && h.cfg.Windows != nil {
		if bf.Tool == "" {
			l.RetryableNeedsTool = true
		} else {
			l.Retryable = link("retryable")
		}
	}
	return l
}
