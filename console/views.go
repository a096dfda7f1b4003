package console

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"html/template"
	"io/fs"
	"maps"
	"net/http"
	"net/url"
	"path"
	"slices"
	"strconv"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/ledgerkeeper/ledgerkeeper/alerts"
	"github.com/ledgerkeeper/ledgerkeeper/console/uipath"
	"github.com/ledgerkeeper/ledgerkeeper/ledger"
	"github.com/ledgerkeeper/ledgerkeeper/operator"
	"github.com/ledgerkeeper/ledgerkeeper/reconcile"
	"github.com/ledgerkeeper/ledgerkeeper/store"
)

// maxKeyRunes is idempotency_keys.key's width: anything longer names no key.
const maxKeyRunes = 128

var funcs = template.FuncMap{
	"ts": func(t any) string {
		switch v := t.(type) {
		case time.Time:
			if v.IsZero() {
				return ""
			}
			return v.UTC().Format("2006-01-02 15:04:05 UTC")
		case *time.Time:
			if v == nil {
				return ""
			}
			return v.UTC().Format("2006-01-02 15:04:05 UTC")
		}
		return ""
	},
	"age":     func(d time.Duration) string { return d.Round(time.Second).String() },
	"seconds": func(s float64) string { return (time.Duration(s * float64(time.Second))).Round(time.Second).String() },
	"rfc3339": func(t time.Time) string { return t.UTC().Format(time.RFC3339Nano) },
	// keyURL and base are each Handler's own (parsePages): its key pages
	// and its path, under which every link, form and asset is.
	"keyURL": func(string) string { return "" },
	"base":   func() string { return "" },
	"deref": func(p *string) string {
		if p == nil {
			return ""
		}
		return *p
	},
}

// keyURL is key's page.
func (h *Handler) keyURL(key string) string { return uipath.Key(h.cfg.Ledger, key) }

// parsePages parses every page of ledger's console ("": the one ledger's),
// its links under uipath.Base(ledger).
func parsePages(ledger string) (map[string]*template.Template, error) {
	fm := maps.Clone(funcs)
	fm["keyURL"] = func(key string) string { return uipath.Key(ledger, key) }
	fm["base"] = func() string { return uipath.Base(ledger) }
	pages := map[string]*template.Template{}
	names, err := fs.Glob(templateFS, "templates/*.html")
	if err != nil {
		return nil, err
	}
	for _, name := range names {
		p := strings.TrimSuffix(path.Base(name), ".html")
		if p == "base" {
			continue
		}
		t, err := template.New(p).Funcs(fm).ParseFS(templateFS, "templates/base.html", name)
		if err != nil {
			return nil, fmt.Errorf("console: template %s: %w", p, err)
		}
		pages[p] = t
	}
	return pages, nil
}

// doneText is what an action's redirect may say it did (?done=): fixed
// texts, so a crafted link cannot make the console say anything else.
var doneText = map[string]string{
	"hold":      "put on hold",
	"release":   "released",
	"retryable": "marked retryable",
	"outcome":   "outcome stored",
}

// page is what every page's template receives.
type page struct {
	Title string
	User  string
	// Done says what an action did (after its redirect); Err why a
	// request was refused.
	Done string
	Err  string
	Data any
	// Ledger is the ledger shown, in a fleet's console ("" alone);
	// Ledgers the switcher: every ledger, each linking to this page of it.
	Ledger  string
	Ledgers []ledgerLink
	// FleetRoot: a page of the fleet's own (its overview), not of a
	// ledger's: the main navigation is the fleet's.
	FleetRoot bool
}

func (h *Handler) render(w http.ResponseWriter, r *http.Request, status int, name, title string, data any, errText string) {
	h.renderPage(w, status, name, page{Title: title, User: userOf(r), Done: doneText[r.URL.Query().Get("done")], Err: errText, Data: data,
		Ledger: h.cfg.Ledger, Ledgers: h.switcher(r)})
}

// renderPage draws page name with p.
func (h *Handler) renderPage(w http.ResponseWriter, status int, name string, p page) {
	var buf bytes.Buffer
	if err := h.pages[name].ExecuteTemplate(&buf, "base", p); err != nil {
		h.log.Error("console: render", "page", name, "err", h.red.Error(err))
		http.Error(w, "the page could not be drawn (see serve's log)", http.StatusInternalServerError)
		return
	}
	w.Header().Set("Content-Type", "text/html; charset=utf-8")
	w.WriteHeader(status)
	_, _ = w.Write(buf.Bytes())
}

// failed answers a read that failed: the error is logged, redacted; the
// user is told to look there.
func (h *Handler) failed(w http.ResponseWriter, r *http.Request, what string, err error) {
	h.log.Error("console: "+what, "user", userOf(r), "err", h.red.Error(err))
	h.render(w, r, http.StatusInternalServerError, "error", "Error", nil, what+" failed: the database did not answer (see serve's log). Nothing changed.")
}

// toolView is one tool's line on the overview.
type toolView struct {
	store.ToolStats
	Breaker       *store.Breaker
	Check         *reconcile.CheckResult
	FiringAlerts  int
	OldestStuckAt *time.Time
}

// maxFiring is how many firing alerts the overview lists and counts.
const maxFiring = 200

type overviewData struct {
	Tools     []toolView
	Estimated bool
	Runs      []store.Run
	Delivery  alerts.DeliveryHealth
	Firing    []alerts.OpenAlert
	// FiringMore: more alerts fire than Firing lists (and counts).
	FiringMore bool
	// Workers are the Citus workers whose shards_unreachable alert fires:
	// keys on their shards wait for them.
	Workers []string
	// Partial says what the page could not read because a Citus worker is
	// down (the counts and holds read every shard); the rest is shown.
	Partial string
	Holds   []store.Hold
	// Live is the live part's own: charts, probe pauses (live.go).
	Live liveView
}

func (h *Handler) storeWindows() store.Windows {
	if h.cfg.Windows == nil {
		return func(string) (time.Duration, time.Duration) { return 0, 0 }
	}
	return store.Windows(h.cfg.Windows)
}

func (h *Handler) overview(w http.ResponseWriter, r *http.Request) {
	d, what, err := h.loadOverview(r.Context())
	if err != nil {
		h.failed(w, r, what, err)
		return
	}
	h.render(w, r, http.StatusOK, "overview", "Overview", d, "")
}

// loadOverview reads what the overview shows (the page and its live part,
// live.go); on failure, what names the read that failed.
func (h *Handler) loadOverview(ctx context.Context) (d overviewData, what string, err error) {
	ctx, cancel := context.WithTimeout(ctx, readTimeout)
	defer cancel()
	db := h.cfg.Pool
	counts, err := store.StatsWith(ctx, db, h.storeWindows(), store.StatsOptions{})
	partial := ""
	if err != nil && store.NodeUnreachable(err) {
		// A Citus worker is down: the rest of the page still answers.
		partial, err = "the counts per tool", nil
	}
	if err != nil {
		return d, "reading the counts", err
	}
	breakers, err := reconcile.Breakers(ctx, db)
	if err != nil {
		return d, "reading the breakers", err
	}
	checks, err := reconcile.StoredChecks(ctx, db)
	if err != nil {
		return d, "reading the self-checks", err
	}
	d = overviewData{Estimated: counts.Estimated, Partial: partial}
	if d.Runs, err = store.LastRuns(ctx, db); err != nil {
		return d, "reading the last passes", err
	}
	if d.Delivery, err = alerts.Health(ctx, db); err != nil {
		return d, "reading alert delivery", err
	}
	d.Delivery.LastError = h.red.String(d.Delivery.LastError)
	if d.Firing, err = alerts.OpenKeyAlerts(ctx, db, maxFiring+1); err != nil {
		return d, "reading the firing alerts", err
	}
	if d.Workers, err = alerts.OpenNodeAlerts(ctx, db); err != nil {
		return d, "reading the firing alerts", err
	}
	if d.Holds, err = store.ListHolds(ctx, db); err != nil && store.NodeUnreachable(err) {
		d.Partial, err = strings.TrimPrefix(d.Partial+" and the holds", " and "), nil
	}
	if err != nil {
		return d, "reading the holds", err
	}
	if len(d.Firing) > maxFiring {
		d.Firing, d.FiringMore = d.Firing[:maxFiring], true
	}
	for _, t := range counts.Tools {
		v := toolView{ToolStats: t, OldestStuckAt: t.OldestStuckClaimedAt}
		for i := range breakers {
			if breakers[i].Tool == t.Tool {
				b := breakers[i]
				b.LastError = h.red.String(b.LastError)
				v.Breaker = &b
			}
		}
		for i := range checks {
			if checks[i].Tool == t.Tool {
				c := h.redactCheck(checks[i])
				v.Check = &c
			}
		}
		for _, a := range d.Firing {
			if a.Tool == t.Tool {
				v.FiringAlerts++
			}
		}
		d.Tools = append(d.Tools, v)
	}
	if err = h.loadLive(ctx, &d); err != nil {
		return d, "reading the stuck-keys samples", err
	}
	return d, "", nil
}

func (h *Handler) redactCheck(c reconcile.CheckResult) reconcile.CheckResult {
	c.Summary = h.red.String(c.Summary)
	redact := func(s reconcile.SampleCheck) reconcile.SampleCheck {
		s.Error = h.red.String(s.Error)
		s.Evidence = h.red.JSON(s.Evidence)
		return s
	}
	c.Absent = redact(c.Absent)
	c.Samples = slices.Clone(c.Samples)
	for i := range c.Samples {
		c.Samples[i] = redact(c.Samples[i])
	}
	return c
}

type keysData struct {
	filterForm
	Keys       []store.ListedKey
	Count      store.KeyCount
	ExactBelow int64
	Next       string // the next page's URL, "" on the last
	// Bulk offers the filter's bulk actions the user is granted (bulk.go).
	Bulk bulkLinks
}

// keys lists keys by tool, status, key prefix, hold, age and attempts, a
// page at a time (keyset pagination: ?after=<last key of the page>).
func (h *Handler) keys(w http.ResponseWriter, r *http.Request) {
	q := r.URL.Query()
	ff, err := h.parseFilter(q)
	d := keysData{filterForm: ff, ExactBelow: h.cfg.ExactBelow}
	if err != nil {
		h.render(w, r, http.StatusBadRequest, "keys", "Keys", d, err.Error()+".")
		return
	}
	f := ff.f
	ctx, cancel := context.WithTimeout(r.Context(), readTimeout)
	defer cancel()
	keys, more, err := store.ListKeys(ctx, h.cfg.Pool, f, q.Get("after"), h.cfg.PageSize)
	if errors.Is(err, ledger.ErrInvalid) {
		h.render(w, r, http.StatusBadRequest, "keys", "Keys", d, err.Error())
		return
	}
	if err != nil {
		h.failed(w, r, "listing keys", err)
		return
	}
	if d.Count, err = store.CountKeys(ctx, h.cfg.Pool, f, h.cfg.ExactBelow); err != nil {
		h.failed(w, r, "counting keys", err)
		return
	}
	d.Keys = keys
	d.Bulk = h.bulkOffers(userOf(r), q)
	if more {
		next := url.Values{}
		for k, v := range q {
			if k != "after" {
				next[k] = v
			}
		}
		next.Set("after", keys[len(keys)-1].Key)
		d.Next = h.base + "keys?" + next.Encode()
	}
	h.render(w, r, http.StatusOK, "keys", "Keys", d, "")
}

// event is one line of a key's timeline.
type event struct {
	At    time.Time
	Kind  string // claim, heartbeat, audit, hold, alert
	Actor string
	What  string
	// Detail is evidence or an error, redacted and indented.
	Detail string
}

type keyData struct {
	In       operator.Inspection
	Request  string
	Response string
	Timeline []event
	// The grants, which decide the forms drawn; each POST checks again.
	CanHold, CanRelease, CanRetryable, CanStoreOutcome bool
	// ClaimedAt is the claim the page shows, carried by its forms.
	ClaimedAt string
	// Run is the probe and reconcile part (run.go).
	Run keyRun
}

func (h *Handler) key(w http.ResponseWriter, r *http.Request) {
	key := r.URL.Query().Get("key")
	h.renderKey(w, r, key, http.StatusOK, "")
}

// renderKey draws key's page with status and an error line (a refusal).
func (h *Handler) renderKey(w http.ResponseWriter, r *http.Request, key string, status int, errText string) {
	if key == "" || utf8.RuneCountInString(key) > maxKeyRunes {
		h.render(w, r, http.StatusBadRequest, "error", "Key", nil, "No key given, or one longer than 128 characters: no such key.")
		return
	}
	ctx, cancel := context.WithTimeout(r.Context(), readTimeout)
	defer cancel()
	in, err := operator.Inspect(ctx, h.cfg.Pool, operator.InspectRequest{Key: key, Windows: h.cfg.Windows})
	if errors.Is(err, operator.ErrNoKey) {
		h.render(w, r, http.StatusNotFound, "error", "Key", nil, "No key "+strconv.Quote(key)+" in the ledger, and no audit trail of one.")
		return
	}
	if err != nil {
		h.failed(w, r, "reading the key", err)
		return
	}
	user := userOf(r)
	d := keyData{In: in, Request: h.pretty(in.Key.RequestBody), Response: h.pretty(in.Key.ResponseBody),
		Timeline: h.timeline(in), CanHold: h.may(user, ActionHold), CanRelease: h.may(user, ActionRelease),
		CanRetryable: h.may(user, ActionRetryable), CanStoreOutcome: h.may(user, ActionStoreOutcome), Run: h.keyRunView(r)}
	if !in.Key.ClaimedAt.IsZero() {
		d.ClaimedAt = in.Key.ClaimedAt.UTC().Format(time.RFC3339Nano)
	}
	h.render(w, r, status, "key", key, d, errText)
}

// pretty is a JSON body redacted and indented for reading.
func (h *Handler) pretty(doc json.RawMessage) string {
	if len(doc) == 0 {
		return ""
	}
	doc = h.red.JSON(doc)
	var buf bytes.Buffer
	if json.Indent(&buf, doc, "", "  ") != nil {
		return h.red.String(string(doc))
	}
	return buf.String()
}

// timeline puts the key's claim, heartbeat, audit trail (probes with their
// evidence, decisions, holds, operators' acts from the command line, Slack
// and the console), hold and open alerts on one line of time, oldest first.
func (h *Handler) timeline(in operator.Inspection) []event {
	var ev []event
	k := in.Key
	if !k.CreatedAt.IsZero() {
		ev = append(ev, event{At: k.CreatedAt, Kind: "claim", What: "first claimed by the tool server"})
		if !k.ClaimedAt.Equal(k.CreatedAt) {
			ev = append(ev, event{At: k.ClaimedAt, Kind: "claim", What: "claimed again by a retry (the current attempt)"})
		}
		if k.HeartbeatAt != nil {
			ev = append(ev, event{At: *k.HeartbeatAt, Kind: "heartbeat", What: "last heartbeat of the attempt"})
		}
		if k.Status != ledger.StatusProcessing {
			ev = append(ev, event{At: k.UpdatedAt, Kind: "status", What: "now " + k.Status})
		}
	}
	for _, a := range in.History {
		what := a.Action
		if a.Verdict != "" && a.Verdict != "operator" {
			what = "probe said " + a.Verdict + ": " + a.Action
		}
		if a.Attempt > 0 {
			what += fmt.Sprintf(" (attempt %d)", a.Attempt)
		}
		detail := h.pretty(a.Evidence)
		if a.Error != "" {
			detail = strings.TrimSpace(h.red.String(a.Error) + "\n" + detail)
		}
		ev = append(ev, event{At: a.CreatedAt, Kind: "audit", Actor: a.Actor, What: what, Detail: detail})
	}
	if in.Hold != nil {
		ev = append(ev, event{At: in.Hold.CreatedAt, Kind: "hold", Actor: in.Hold.Actor, What: "on hold (in force)", Detail: h.red.String(in.Hold.Reason)})
	}
	for _, a := range in.Alerts {
		ev = append(ev, event{At: a.LastRaisedAt, Kind: "alert", What: "alert firing: " + string(a.Reason)})
	}
	slices.SortStableFunc(ev, func(a, b event) int { return a.At.Compare(b.At) })
	return ev
}
