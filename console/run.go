package console

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"maps"
	"net/http"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"
	"unicode/utf8"

	"github.com/ledgerkeeper/ledgerkeeper/alerts"
	"github.com/ledgerkeeper/ledgerkeeper/expiry"
	"github.com/ledgerkeeper/ledgerkeeper/internal/safetext"
	"github.com/ledgerkeeper/ledgerkeeper/ledger"
	"github.com/ledgerkeeper/ledgerkeeper/probes"
	"github.com/ledgerkeeper/ledgerkeeper/reconcile"
	"github.com/ledgerkeeper/ledgerkeeper/store"
)

// RunConfig gives the console what serve runs: the probes (probe now) and
// the reconciler (reconcile this key now), and what the self-checks page
// needs to say whether each tool's probe is trusted. Zero: those buttons
// are absent and the self-checks page shows what the database holds.
type RunConfig struct {
	// Probe asks the downstream about a key with its tool's probe, as
	// `ledgerkeeper probe run KEY` does: nothing is written. ProbeWith
	// makes one from an engine. Nil: no "probe now".
	Probe func(ctx context.Context, key ledger.Key) (ProbeAnswer, error)
	// Reconciler builds an engine whose audit rows, leases and pass record
	// name actor, as `ledgerkeeper reconcile --actor` builds one; the
	// console runs one pass of it restricted to one key and closes it.
	// Nil: no "reconcile this key now".
	Reconciler func(ctx context.Context, actor string) (*reconcile.Engine, io.Closer, error)
	// Policy is each tool's reconcile policy as serve runs it (the
	// engine's Policy): whether it has a probe, its self-check settings,
	// its canaries, its probe's fingerprint. Nil: unknown.
	Policy func(tool string) reconcile.Policy
	// Tools are the configured tools, listed on the self-checks page even
	// before their first check.
	Tools []string
	// SelfCheckInterval is self_check.interval: a check older than it is
	// made again by the next pass. Zero: unknown.
	SelfCheckInterval time.Duration
	// ProbeEvery is the least time between two "probe now" of one key;
	// 0: DefaultProbeEvery.
	ProbeEvery time.Duration

	gates *runGates
}

// DefaultProbeEvery: at most one "probe now" per key per 5 seconds.
const DefaultProbeEvery = 5 * time.Second

const (
	// probeTimeout and reconcileTimeout bound a probe and a pass asked
	// from the console (the probe's own timeout and reconcile.max_duration
	// apply within them).
	probeTimeout     = time.Minute
	reconcileTimeout = 2 * time.Minute
	// resolvedWithin is how far back the alerts page lists resolutions.
	resolvedWithin = 24 * time.Hour
	// maxSlackActs bounds the Slack acts listed on one alerts page.
	maxSlackActs = 500
)

// ErrNoProbe: the key's tool has no probe (none configured, none
// registered).
var ErrNoProbe = errors.New("the key's tool has no probe")

// ProbeAnswer is what one probe said, not redacted: the console redacts
// what it shows.
type ProbeAnswer struct {
	Tool     string
	Verdict  string
	Err      string
	Evidence json.RawMessage
	Duration time.Duration
	// Requests are the http probe's requests (their URLs may hold
	// secrets; header values are never recorded).
	Requests []ProbeRequest
	// WouldStore is the outcome a found verdict would store.
	WouldStore *ProbeOutcome
}

// ProbeRequest is one request a probe made and its answer.
type ProbeRequest struct {
	Method    string
	URL       string
	Answered  bool
	Status    int
	BodyBytes int
}

// ProbeOutcome is an outcome a found verdict would store.
type ProbeOutcome struct {
	Code int
	Body json.RawMessage
}

// ProbeWith answers "probe now" with eng's probes (guarded, as the
// reconciler runs them), exactly as `ledgerkeeper probe run KEY` does: the
// key's tool's probe with its request body, created_at and claimed_at; it
// writes nothing.
func ProbeWith(eng *reconcile.Engine) func(ctx context.Context, k ledger.Key) (ProbeAnswer, error) {
	return func(ctx context.Context, k ledger.Key) (ProbeAnswer, error) {
		ans := ProbeAnswer{Tool: k.Tool}
		p := eng.Policy(k.Tool).Probe
		if p == nil {
			return ans, ErrNoProbe
		}
		var tr probes.Trace
		start := time.Now()
		res := p.Probe(probes.WithTrace(ctx, &tr), probes.Key{Key: k.Key, Tool: k.Tool, RequestBody: k.RequestBody, CreatedAt: k.CreatedAt, ClaimedAt: k.ClaimedAt})
		ans.Duration = time.Since(start)
		ans.Verdict, ans.Evidence = string(res.Verdict), res.Evidence
		if res.Err != nil {
			ans.Err = res.Err.Error()
		}
		for _, x := range tr.Exchanges() {
			ans.Requests = append(ans.Requests, ProbeRequest{Method: x.Method, URL: x.URL, Answered: x.Answered, Status: x.Status, BodyBytes: x.BodyBytes})
		}
		if res.Verdict == probes.Found && res.Outcome != nil {
			ans.WouldStore = &ProbeOutcome{Code: res.Outcome.Code, Body: res.Outcome.Body}
		}
		return ans, nil
	}
}

// runGates bound what the key page's buttons start: one probe at a time
// per key and at most one per ProbeEvery; one reconcile pass at a time per
// key.
type runGates struct {
	probe, reconcile *keyGate
}

// keyGate lets one caller at a time through per key, and no sooner than
// every after the previous one started (0: no spacing).
type keyGate struct {
	every time.Duration
	mu    sync.Mutex
	busy  map[string]bool
	last  map[string]time.Time
}

func newKeyGate(every time.Duration) *keyGate {
	return &keyGate{every: every, busy: map[string]bool{}, last: map[string]time.Time{}}
}

// enter admits key now, or says why not and after how long to ask again.
func (g *keyGate) enter(key string, now time.Time) (release func(), refused string, retryAfter time.Duration) {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.busy[key] {
		return nil, "already running for this key (one at a time)", time.Second
	}
	if last, ok := g.last[key]; ok && now.Sub(last) < g.every {
		wait := g.every - now.Sub(last)
		return nil, fmt.Sprintf("the last one of this key started %s ago: at most one per %s per key", now.Sub(last).Round(100*time.Millisecond), g.every), wait
	}
	// Forget the starts that no longer hold anything back, so the map
	// holds only the keys of the last few seconds.
	if len(g.last) > 1000 {
		maps.DeleteFunc(g.last, func(_ string, t time.Time) bool { return now.Sub(t) >= g.every })
	}
	g.busy[key] = true
	if g.every > 0 {
		g.last[key] = now
	}
	return func() {
		g.mu.Lock()
		defer g.mu.Unlock()
		delete(g.busy, key)
	}, "", 0
}

// routesRun registers the self-checks, alerts and runs pages and the probe
// and reconcile actions.
func (h *Handler) routesRun(mux *http.ServeMux) {
	h.cfg.Run.gates = &runGates{probe: newKeyGate(cmp.Or(h.cfg.Run.ProbeEvery, DefaultProbeEvery)), reconcile: newKeyGate(0)}
	mux.HandleFunc("GET "+h.base+"checks", h.checks)
	mux.HandleFunc("GET "+h.base+"alerts", h.alertsPage)
	mux.HandleFunc("GET "+h.base+"runs", h.runs)
	mux.HandleFunc("POST "+h.base+"key/probe", h.probeNow)
	mux.HandleFunc("POST "+h.base+"key/reconcile", h.reconcileNow)
}

// --- the key page's buttons -------------------------------------------

// keyRun is the key page's probe and reconcile part.
type keyRun struct {
	// CanProbe: a prober is configured (every signed-in user may probe);
	// CanReconcile: a reconciler is configured and the user is granted
	// reconcile.
	CanProbe, CanReconcile bool
	// Probe and Reconcile are the answer of the button just pressed.
	Probe     *probeView
	Reconcile *reconcileView
}

type probeView struct {
	Tool, Verdict, Error, Evidence, Took string
	Requests                             []ProbeRequest
	WouldStore                           string
	WouldStoreCode                       int
}

type reconcileLine struct {
	Action, Verdict, Error, Evidence string
	Attempts                         int
	Alerts                           []string
}

type reconcileView struct {
	Actor, Took, Summary, Error string
	Decided                     []reconcileLine
	Why                         []string
	Withheld, GivenBack         int
}

type runResultKey struct{}

// withRunResult carries a button's answer to renderKey's page.
func withRunResult(r *http.Request, v keyRun) *http.Request {
	return r.WithContext(context.WithValue(r.Context(), runResultKey{}, v))
}

// keyRunView is the key page's probe and reconcile part for r's user.
func (h *Handler) keyRunView(r *http.Request) keyRun {
	v, _ := r.Context().Value(runResultKey{}).(keyRun)
	v.CanProbe = h.cfg.Run.Probe != nil
	v.CanReconcile = h.cfg.Run.Reconciler != nil && h.may(userOf(r), ActionReconcile)
	return v
}

// refuseRun answers a button that cannot run: the key's page with why,
// and Retry-After when asking again later helps.
func (h *Handler) refuseRun(w http.ResponseWriter, r *http.Request, key string, status int, why string, retryAfter time.Duration) {
	if retryAfter > 0 {
		w.Header().Set("Retry-After", strconv.Itoa(int((retryAfter+time.Second-1)/time.Second)))
	}
	h.renderKey(w, r, key, status, why)
}

// keyToRun reads the key a button runs on; ok is false when it answered
// the request (404 saying why: none, then what the button would have
// done).
func (h *Handler) keyToRun(w http.ResponseWriter, r *http.Request, key, none string) (ledger.Key, bool) {
	ctx, cancel := context.WithTimeout(r.Context(), readTimeout)
	defer cancel()
	k, err := ledger.Get(ctx, h.cfg.Pool, key)
	switch {
	case errors.Is(err, ledger.ErrNotFound):
		h.render(w, r, http.StatusNotFound, "error", "Key", nil, "No key "+strconv.Quote(key)+" in the ledger: "+none)
		return k, false
	case err != nil:
		h.failed(w, r, "reading the key", err)
		return k, false
	}
	return k, true
}

// probeNow probes the key's downstream as `probe run` does and shows the
// answer on the key's page. Any signed-in user may: it reads the
// downstream and writes nothing; one at a time per key, at most one per
// ProbeEvery, each logged with its user.
func (h *Handler) probeNow(w http.ResponseWriter, r *http.Request) {
	f, ok := h.readForm(w, r)
	if !ok {
		return
	}
	user := userOf(r)
	if h.cfg.Run.Probe == nil {
		h.refuseRun(w, r, f.Key, http.StatusServiceUnavailable, "Probe now is not available here: this console was started without the probes (serve's console and `ledgerkeeper console` have them). Nothing was asked.", 0)
		return
	}
	k, ok := h.keyToRun(w, r, f.Key, "nothing to probe (`ledgerkeeper probe run KEY --tool T` probes a key that is not).")
	if !ok {
		return
	}
	release, refused, wait := h.cfg.Run.gates.probe.enter(f.Key, time.Now())
	if refused != "" {
		h.log.Info("console: probe now refused", "user", user, "key", f.Key, "why", refused)
		h.refuseRun(w, r, f.Key, http.StatusTooManyRequests, "Probe not sent: a probe "+refused+". Try again in "+wait.Round(time.Second).String()+".", wait)
		return
	}
	defer release()
	pctx, pcancel := context.WithTimeout(r.Context(), probeTimeout)
	defer pcancel()
	ans, err := h.cfg.Run.Probe(pctx, k)
	if errors.Is(err, ErrNoProbe) {
		h.log.Info("console: probe now: no probe", "user", user, "key", f.Key, "tool", k.Tool)
		h.refuseRun(w, r, f.Key, http.StatusConflict, "Tool "+k.Tool+" has no probe: nothing was asked (configure tools."+k.Tool+".probe).", 0)
		return
	}
	if err != nil {
		h.failed(w, r, "the probe", err)
		return
	}
	h.log.Info("console: probe now", "user", user, "key", f.Key, "tool", k.Tool, "verdict", ans.Verdict,
		"took", ans.Duration.Round(time.Millisecond).String(), "err", h.red.String(ans.Err))
	v := &probeView{Tool: ans.Tool, Verdict: ans.Verdict, Error: h.red.String(ans.Err), Evidence: h.pretty(ans.Evidence),
		Took: ans.Duration.Round(time.Millisecond).String()}
	for _, x := range ans.Requests {
		x.URL = h.red.String(x.URL)
		v.Requests = append(v.Requests, x)
	}
	if o := ans.WouldStore; o != nil {
		v.WouldStore, v.WouldStoreCode = h.pretty(o.Body), o.Code
	}
	h.renderKey(w, withRunResult(r, keyRun{Probe: v}), f.Key, http.StatusOK, "")
}

// reconcileNow runs one reconcile pass restricted to the key, as
// `ledgerkeeper reconcile --key K --actor console:<user>` does, and shows
// its report on the key's page. Every rule of the reconciler applies (the
// breaker, the self-check's trust, leases, holds, the processing window):
// it may decide nothing, and says why.
func (h *Handler) reconcileNow(w http.ResponseWriter, r *http.Request) {
	if !h.granted(w, r, ActionReconcile) {
		return
	}
	f, ok := h.readForm(w, r)
	if !ok {
		return
	}
	user := userOf(r)
	if h.cfg.Run.Reconciler == nil {
		h.refuseRun(w, r, f.Key, http.StatusServiceUnavailable, "Reconcile this key now is not available here: this console was started without the reconciler. Nothing changed.", 0)
		return
	}
	if _, ok := h.keyToRun(w, r, f.Key, "nothing to reconcile. Nothing changed."); !ok {
		return
	}
	if !f.Confirmed {
		h.confirm(w, r, f, "reconcile", "Reconcile this key now", func(k ledger.Key) confirmData {
			return confirmData{Lines: reconcileLines(k)}
		}, nil)
		return
	}
	release, refused, wait := h.cfg.Run.gates.reconcile.enter(f.Key, time.Now())
	if refused != "" {
		h.log.Info("console: reconcile now refused", "user", user, "key", f.Key, "why", refused)
		h.refuseRun(w, r, f.Key, http.StatusTooManyRequests, "Not started: a reconcile pass of this key is "+refused+". Nothing changed.", wait)
		return
	}
	defer release()
	// Once started, the pass finishes (its decisions written, its run
	// recorded) even if the browser goes away.
	ctx, cancelRun := context.WithTimeout(context.WithoutCancel(r.Context()), reconcileTimeout)
	defer cancelRun()
	who := h.actor(user)
	eng, closer, err := h.cfg.Run.Reconciler(ctx, who)
	if err != nil {
		h.failed(w, r, "building the reconciler", err)
		return
	}
	defer func() { _ = closer.Close() }()
	h.log.Info("console: reconcile now", "user", user, "key", f.Key)
	rep, runErr := eng.Run(ctx, reconcile.Options{Keys: []string{f.Key}})
	v := h.reconcileView(f.Key, who, rep, runErr)
	h.log.Info("console: reconcile now done", "user", user, "key", f.Key, "decided", rep.Decided, "summary", v.Summary, "err", v.Error)
	h.renderKey(w, withRunResult(r, keyRun{Reconcile: v}), f.Key, http.StatusOK, "")
}

// reconcileLines is what a pass of one key may change for its retries.
func reconcileLines(k ledger.Key) []string {
	if k.Status != ledger.StatusProcessing {
		return []string{"The key is " + k.Status + ": a reconcile pass leaves settled keys alone, so nothing will change for its retries."}
	}
	return []string{
		"The reconciler probes this key now, under every rule of a scheduled pass (the circuit breaker, the probe's trust, leases, holds, the tool's window): it may decide nothing.",
		"If the probe finds the effect, its outcome is stored and every retry of this key receives it from then on, instead of running " + k.Tool + " again.",
		"If the probe, trusted and witnessed, finds no effect, the key is marked failed_retryable and the next retry runs " + k.Tool + " again.",
		"Otherwise the key stays processing and every retry keeps receiving 409 (in progress) with Retry-After.",
	}
}

func (h *Handler) reconcileView(key, who string, rep reconcile.Report, runErr error) *reconcileView {
	v := &reconcileView{Actor: who, Took: rep.Duration.Round(time.Millisecond).String(), Withheld: rep.Withheld, GivenBack: rep.GivenBack}
	if runErr != nil {
		v.Error = h.red.String(runErr.Error())
	}
	for _, k := range rep.Keys {
		if k.Key != key {
			continue
		}
		v.Decided = append(v.Decided, reconcileLine{Action: k.Action, Verdict: k.Verdict, Error: h.red.String(k.Error),
			Evidence: h.pretty(k.Evidence), Attempts: k.Attempts, Alerts: k.Alerts})
	}
	for _, s := range rep.Skipped {
		if s.Key == key {
			v.Why = append(v.Why, strings.ReplaceAll(s.Action, "_", " "))
		}
	}
	for _, t := range rep.Tools {
		if t.Note != "" {
			v.Why = append(v.Why, t.Tool+": "+h.red.String(t.Note))
		}
		if t.SelfCheck != nil && !t.SelfCheck.Trusted() {
			v.Why = append(v.Why, t.Tool+"'s probe self-check: "+h.red.String(t.SelfCheck.Summary))
		}
	}
	switch {
	case len(v.Decided) > 0:
		var parts []string
		for _, d := range v.Decided {
			parts = append(parts, d.Action)
		}
		v.Summary = "decided: " + strings.Join(parts, ", ")
	case rep.Withheld > 0:
		v.Summary = "probed, but the verdict was withheld (its batch's closing self-check did not pass, or a not_found had no witness): nothing changed"
	case rep.GivenBack > 0:
		v.Summary = "given back without a verdict (paused, stopped or too little lease left): nothing changed"
	default:
		v.Summary = "nothing decided: nothing changed"
	}
	return v
}

// --- the self-checks page ---------------------------------------------

type canaryView struct {
	Key, Source, Actor, Reason string
	At                         *time.Time
}

type checkTool struct {
	Tool    string
	Check   *reconcile.CheckResult
	Breaker *store.Breaker
	// Known: the tool's policy is known (RunConfig.Policy); then HasProbe,
	// SelfCheckDisabled and WitnessNotRequired are its settings and
	// OtherConfig says the stored check was of another probe
	// configuration.
	Known, HasProbe, SelfCheckDisabled, WitnessNotRequired, OtherConfig bool
	// Stale: the check is older than self_check.interval; NextCheck is
	// when it is due again.
	Stale     bool
	NextCheck *time.Time
	Canaries  []canaryView
	// Trusted says whether the probe may decide keys now (Partly: found
	// verdicts yes, not_found ones held); Trust says so in words, Notes
	// add what else holds.
	Trusted, Partly bool
	Trust           string
	Notes           []string
}

type checksData struct {
	Tools    []checkTool
	Interval time.Duration
}

func (h *Handler) checks(w http.ResponseWriter, r *http.Request) {
	ctx, cancel := context.WithTimeout(r.Context(), readTimeout)
	defer cancel()
	db := h.cfg.Pool
	checks, err := reconcile.StoredChecks(ctx, db)
	if err != nil {
		h.failed(w, r, "reading the self-checks", err)
		return
	}
	breakers, err := reconcile.Breakers(ctx, db)
	if err != nil {
		h.failed(w, r, "reading the breakers", err)
		return
	}
	canaries, err := store.Canaries(ctx, db, "")
	if err != nil {
		h.failed(w, r, "reading the canaries", err)
		return
	}
	names := slices.Clone(h.cfg.Run.Tools)
	for _, c := range checks {
		names = append(names, c.Tool)
	}
	for _, b := range breakers {
		names = append(names, b.Tool)
	}
	slices.Sort(names)
	names = slices.Compact(names)
	d := checksData{Interval: h.cfg.Run.SelfCheckInterval}
	for _, name := range names {
		t := checkTool{Tool: name}
		for i := range checks {
			if checks[i].Tool == name {
				c := h.redactCheck(checks[i])
				t.Check = &c
			}
		}
		for i := range breakers {
			if breakers[i].Tool == name {
				b := breakers[i]
				b.LastError = h.red.String(b.LastError)
				t.Breaker = &b
			}
		}
		if h.cfg.Run.Policy != nil {
			p := h.cfg.Run.Policy(name)
			t.Known, t.HasProbe, t.SelfCheckDisabled, t.WitnessNotRequired = true, p.Probe != nil, p.SelfCheckDisabled, p.WitnessNotRequired
			t.OtherConfig = t.Check != nil && p.ProbeFingerprint != "" && t.Check.Fingerprint != "" && t.Check.Fingerprint != p.ProbeFingerprint
			for _, c := range p.Canaries {
				t.Canaries = append(t.Canaries, canaryView{Key: c.Key, Source: "configuration"})
			}
		}
		for _, c := range canaries {
			if c.Tool == name {
				at := c.CreatedAt
				t.Canaries = append(t.Canaries, canaryView{Key: c.Key, Source: "operator", Actor: c.Actor, Reason: h.red.String(c.Reason), At: &at})
			}
		}
		if t.Check != nil && d.Interval > 0 {
			next := t.Check.CheckedAt.Add(d.Interval)
			t.NextCheck = &next
			t.Stale = time.Since(t.Check.CheckedAt) > d.Interval
		}
		h.judgeTrust(&t)
		d.Tools = append(d.Tools, t)
	}
	h.render(w, r, http.StatusOK, "checks", "Self-checks", d, "")
}

// judgeTrust says whether the tool's probe may decide keys now, by the
// rules the reconciler applies (reconcile's admit and bracket): an open
// breaker probes nothing, an untrusted or inconclusive check changes no
// key, a check with no present-side witness holds not_found verdicts.
func (h *Handler) judgeTrust(t *checkTool) {
	b, c := t.Breaker, t.Check
	if b != nil && !b.Open && b.Opens > 0 {
		t.Notes = append(t.Notes, "circuit breaker half-open: the next pass sends one trial probe, which closes it or opens it again")
	}
	if t.Stale {
		t.Notes = append(t.Notes, "the stored check is older than self_check.interval: the next pass checks the probe again")
	}
	if t.OtherConfig {
		t.Notes = append(t.Notes, "the stored check was made with another probe configuration: it vouches for nothing now; the next pass checks the current one first")
	}
	switch {
	case t.Known && !t.HasProbe:
		t.Trust = "no probe: the tool's stuck keys are alerted for a human, never decided"
	case b != nil && b.Open:
		t.Trust = "no: the circuit breaker is open until " + b.OpenUntil.UTC().Format("2006-01-02 15:04:05 UTC") + ": the downstream is not probed and no key of the tool changes"
	case t.Known && t.SelfCheckDisabled:
		t.Trusted = true
		t.Trust = "yes, unchecked: the self-check is disabled (tools." + t.Tool + ".probe.self_check.enabled: false), so its verdicts change keys without one"
	case c == nil:
		t.Trust = "not yet known: no self-check stored; the next pass with due keys checks the probe before it decides any"
	case !c.Trusted():
		t.Trust = "no: the last self-check was " + c.Outcome + ": no key of the tool changes until a check passes (every pass checks again)"
	case t.OtherConfig:
		t.Trust = "not yet known: the probe changed since its last check"
	case c.PresentUnverified && (!t.Known || !t.WitnessNotRequired):
		t.Trusted, t.Partly = true, true
		t.Trust = "found verdicts only: no present-side sample (a recently completed key or a canary) came back found, so not_found verdicts are held, never applied"
	default:
		t.Trusted = true
		t.Trust = "yes: the last self-check passed; each batch of keys is also checked before and after it is probed"
	}
}

// --- the alerts page --------------------------------------------------

type firingView struct {
	alerts.FiringAlert
	SlackActs []store.AuditAct
}

type alertsData struct {
	Firing     []firingView
	NextFiring string
	Messages   []alerts.OutboxRow
	// NextMessages is the next page of messages ("" on the last).
	NextMessages string
	Resolved     []alerts.OutboxRow
	Delivery     alerts.DeliveryHealth
	// Within says how far back Resolved goes, in words.
	Within string
}

// alertsPage lists the firing alerts (a page at a time, keyset on subject
// and reason) with their latest message's delivery and who acted on them
// from Slack; the outbox's messages newest first (keyset on id); and the
// resolutions of the last 24 hours.
func (h *Handler) alertsPage(w http.ResponseWriter, r *http.Request) {
	q := r.URL.Query()
	afterSubject, afterReason := q.Get("after"), q.Get("after_reason")
	before, err := cursorID(q.Get("before"))
	if err != nil || utf8.RuneCountInString(afterSubject) > 200 || len(afterReason) > 32 {
		h.render(w, r, http.StatusBadRequest, "error", "Alerts", nil, "The page's cursor is not one this console made (before is a message id; after a subject): start from the first page.")
		return
	}
	ctx, cancel := context.WithTimeout(r.Context(), readTimeout)
	defer cancel()
	db := h.cfg.Pool
	d := alertsData{Within: fmt.Sprintf("%d hours", int(resolvedWithin.Hours()))}
	firing, err := alerts.FiringAfter(ctx, db, afterSubject, alerts.Reason(afterReason), h.cfg.PageSize+1)
	if err != nil {
		h.failed(w, r, "reading the firing alerts", err)
		return
	}
	if len(firing) > h.cfg.PageSize {
		firing = firing[:h.cfg.PageSize]
		last := firing[len(firing)-1]
		d.NextFiring = h.base + "alerts?" + url.Values{"after": {last.Subject}, "after_reason": {string(last.Reason)}}.Encode()
	}
	var keys []string
	var since []time.Time
	for _, a := range firing {
		if a.Message != nil {
			m := *a.Message
			m.LastError = h.red.String(m.LastError)
			a.Message = &m
		}
		d.Firing = append(d.Firing, firingView{FiringAlert: a})
		if a.Key != "" {
			keys, since = append(keys, a.Key), append(since, a.FirstRaisedAt)
		}
	}
	acts, err := store.ActsSince(ctx, db, "slack:", keys, since, maxSlackActs)
	if err != nil {
		h.failed(w, r, "reading the acts from Slack", err)
		return
	}
	for i := range d.Firing {
		for _, a := range acts {
			if a.Key == d.Firing[i].Key && d.Firing[i].Key != "" && !a.At.Before(d.Firing[i].FirstRaisedAt) {
				d.Firing[i].SlackActs = append(d.Firing[i].SlackActs, a)
			}
		}
	}
	msgs, err := alerts.OutboxBefore(ctx, db, before, h.cfg.PageSize+1)
	if err != nil {
		h.failed(w, r, "reading the alert messages", err)
		return
	}
	if len(msgs) > h.cfg.PageSize {
		msgs = msgs[:h.cfg.PageSize]
		d.NextMessages = h.base + "alerts?before=" + strconv.FormatInt(msgs[len(msgs)-1].ID, 10) + "#messages"
	}
	for i := range msgs {
		msgs[i].LastError = h.red.String(msgs[i].LastError)
		msgs[i].Resolution = h.red.String(msgs[i].Resolution)
	}
	d.Messages = msgs
	if d.Resolved, err = alerts.ResolvedSince(ctx, db, resolvedWithin, h.cfg.PageSize); err != nil {
		h.failed(w, r, "reading the resolved alerts", err)
		return
	}
	for i := range d.Resolved {
		d.Resolved[i].LastError = h.red.String(d.Resolved[i].LastError)
		d.Resolved[i].Resolution = h.red.String(d.Resolved[i].Resolution)
	}
	if d.Delivery, err = alerts.Health(ctx, db); err != nil {
		h.failed(w, r, "reading alert delivery", err)
		return
	}
	d.Delivery.LastError = h.red.String(d.Delivery.LastError)
	h.render(w, r, http.StatusOK, "alerts", "Alerts", d, "")
}

// cursorID reads a keyset cursor that is a row id ("" is the first page).
func cursorID(s string) (int64, error) {
	if s == "" {
		return 0, nil
	}
	n, err := strconv.ParseInt(s, 10, 64)
	if err != nil || n <= 0 {
		return 0, errors.New("not a row id")
	}
	return n, nil
}

// --- the runs page ----------------------------------------------------

// runKinds are the runs page's filters: the passes each lists.
var runKinds = map[string][]string{
	"":          {"reconcile", "purge"},
	"reconcile": {"reconcile"},
	"purge":     {"purge"},
	"alerts":    {"alerts"},
	"all":       {"reconcile", "purge", "alerts"},
}

type runView struct {
	store.ListedRun
	Took string
	// Examined, Decided and GivenBack are "" when the pass's record does
	// not say (a purge examines no key one by one; older reconcile
	// records lack the given back).
	Examined, Decided, GivenBack string
	Outcome, Detail              string
	Failed                       bool
}

type runsData struct {
	Kind string
	Runs []runView
	Next string
}

// runs lists reconcile and purge passes (alerts delivery on request),
// newest first, a page at a time (keyset on id).
func (h *Handler) runs(w http.ResponseWriter, r *http.Request) {
	q := r.URL.Query()
	d := runsData{Kind: q.Get("kind")}
	kinds, ok := runKinds[d.Kind]
	before, err := cursorID(q.Get("before"))
	if !ok || err != nil {
		h.render(w, r, http.StatusBadRequest, "runs", "Runs", d, "kind is reconcile, purge, alerts, all or empty (reconcile and purge); before is a run id")
		return
	}
	ctx, cancel := context.WithTimeout(r.Context(), readTimeout)
	defer cancel()
	runs, err := store.ListRuns(ctx, h.cfg.Pool, kinds, before, h.cfg.PageSize+1)
	if err != nil {
		h.failed(w, r, "reading the passes", err)
		return
	}
	if len(runs) > h.cfg.PageSize {
		runs = runs[:h.cfg.PageSize]
		next := url.Values{"before": {strconv.FormatInt(runs[len(runs)-1].ID, 10)}}
		if d.Kind != "" {
			next.Set("kind", d.Kind)
		}
		d.Next = h.base + "runs?" + next.Encode()
	}
	for _, run := range runs {
		d.Runs = append(d.Runs, h.describeRun(run))
	}
	h.render(w, r, http.StatusOK, "runs", "Runs", d, "")
}

// describeRun reads a pass's record: its stats by kind, its error
// redacted.
func (h *Handler) describeRun(run store.ListedRun) runView {
	run.Error = h.red.String(run.Error)
	v := runView{ListedRun: run, Took: run.FinishedAt.Sub(run.StartedAt).Round(time.Millisecond).String(), Outcome: "ok"}
	switch run.Kind {
	case "reconcile":
		var s struct {
			Stopped      bool           `json:"stopped"`
			Actions      map[string]int `json:"actions"`
			Keys         int            `json:"keys"`
			AlertsRaised int            `json:"alerts_raised"`
			Withheld     *int           `json:"withheld"`
			GivenBack    *int           `json:"given_back"`
		}
		if json.Unmarshal(run.Stats, &s) != nil {
			break
		}
		v.Decided = strconv.Itoa(s.Keys)
		if s.Withheld != nil && s.GivenBack != nil {
			v.Examined = strconv.Itoa(s.Keys + *s.Withheld + *s.GivenBack)
			v.GivenBack = strconv.Itoa(*s.GivenBack)
		}
		var parts []string
		for _, a := range slices.Sorted(maps.Keys(s.Actions)) {
			if n := s.Actions[a]; n > 0 {
				parts = append(parts, fmt.Sprintf("%d %s", n, strings.ReplaceAll(a, "_", " ")))
			}
		}
		if s.Withheld != nil && *s.Withheld > 0 {
			parts = append(parts, fmt.Sprintf("%d withheld", *s.Withheld))
		}
		if s.AlertsRaised > 0 {
			parts = append(parts, fmt.Sprintf("%d alert(s) raised", s.AlertsRaised))
		}
		v.Detail = strings.Join(parts, ", ")
		if s.Stopped {
			v.Outcome = "stopped (graceful: decisions in flight written)"
		}
	case "purge":
		var s expiry.Report // what the purger records
		if json.Unmarshal(run.Stats, &s) != nil {
			break
		}
		v.Decided = fmt.Sprintf("%d purged", s.KeysDeleted)
		v.Detail = fmt.Sprintf("%d batch(es)", s.Batches)
		if s.TimedOutBatches > 0 {
			v.Detail += fmt.Sprintf(", %d timed out", s.TimedOutBatches)
		}
		if s.ExpiredProcessing > 0 {
			v.Detail += fmt.Sprintf(", %d expired processing key(s) kept", s.ExpiredProcessing)
		}
		if s.AlertsRaised > 0 {
			v.Detail += fmt.Sprintf(", %d alert(s) raised", s.AlertsRaised)
		}
		if s.AlreadyRunning {
			v.Outcome = "skipped: another purge held the lock"
		}
		if s.BudgetExhausted {
			v.Outcome = "ran out of retention.max_duration: the next pass carries on"
		}
	case "alerts":
		var s alerts.Report // what serve's delivery job records
		if json.Unmarshal(run.Stats, &s) != nil {
			break
		}
		v.Detail = fmt.Sprintf("%d alert(s) claimed, %d message(s) posted, %d failed, %d pending", s.Claimed, s.Messages, s.FailedMessages, s.Pending)
	}
	if run.Error != "" {
		v.Failed = true
		v.Outcome = "error: " + safetext.ClipRunes(run.Error, 2000)
	}
	return v
}
