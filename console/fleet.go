package console

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"net/url"
	"slices"
	"strings"
	"sync"

	"github.com/ledgerkeeper/ledgerkeeper/alerts"
	"github.com/ledgerkeeper/ledgerkeeper/reconcile"
	"github.com/ledgerkeeper/ledgerkeeper/store"
)

// FleetLedger is one ledger of a fleet's console.
type FleetLedger struct {
	// Name is the ledger's name (lower-case letters, digits, '-' and '_',
	// at most 63 characters): its pages are under LedgerPath(Name).
	Name string
	// Config is the ledger's console: Pool, Windows, Operators (the grants
	// that apply to this ledger: OperatorsOn), Live, Bulk, Run, ExactBelow
	// and PageSize. How users sign in (Auth, Users, ProxyHeader,
	// ProxyCIDRs, Loopback), the Redactor and the Logger are the fleet's,
	// whatever is set here; Ledger is Name.
	Config Config
}

// Fleet serves the console of several ledgers behind one sign-in: each
// ledger's pages under LedgerPath(name), as a Handler alone serves one
// ledger's under Path, and at Path itself the fleet's overview (every
// ledger with its stuck keys). One authenticator and one cross-origin
// check stand in front of all of them. It is safe for concurrent use.
type Fleet struct {
	names   []string
	ledgers map[string]*Handler
	// front draws the fleet's own pages (the overview, "no such
	// ledger") at Path.
	front *Handler
	root  http.Handler
}

// NewFleet builds the console of ledgers (at least one, each named once).
// front says how users sign in (Auth, Users, ProxyHeader, ProxyCIDRs,
// Loopback) and gives the Redactor and the Logger; its Pool, Operators
// and the other settings of one ledger are not used. The error says which
// setting or ledger cannot work.
func NewFleet(front Config, ledgers []FleetLedger) (*Fleet, error) {
	if len(ledgers) == 0 {
		return nil, errors.New("console: a fleet needs at least one ledger")
	}
	f := &Fleet{ledgers: map[string]*Handler{}}
	for _, l := range ledgers {
		if l.Name == "" {
			return nil, errors.New("console: a ledger of the fleet has no name")
		}
		if _, dup := f.ledgers[l.Name]; dup {
			return nil, fmt.Errorf("console: ledger %s given twice", l.Name)
		}
		cfg := l.Config
		cfg.Ledger = l.Name
		cfg.Auth, cfg.Users, cfg.ProxyHeader, cfg.ProxyCIDRs, cfg.Loopback = front.Auth, front.Users, front.ProxyHeader, front.ProxyCIDRs, front.Loopback
		cfg.Redactor, cfg.Logger = front.Redactor, front.Logger
		h, err := newPages(cfg)
		if err != nil {
			return nil, fmt.Errorf("ledger %s: %w", l.Name, err)
		}
		h.fleet = f
		f.ledgers[l.Name] = h
		f.names = append(f.names, l.Name)
	}
	slices.Sort(f.names)
	log := front.Logger
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	pages, err := parsePages("")
	if err != nil {
		return nil, err
	}
	f.front = &Handler{cfg: Config{Redactor: front.Redactor}, log: log, red: front.Redactor, pages: pages, base: Path, fleet: f}
	auth, err := newAuthenticator(front)
	if err != nil {
		return nil, err
	}
	mux := http.NewServeMux()
	if err := serveStatic(mux, Path); err != nil {
		return nil, err
	}
	mux.HandleFunc("GET "+Path+"{$}", f.overview)
	for name, h := range f.ledgers {
		mux.Handle(LedgerPath(name), h.mux)
	}
	// Any other path under Path, an unknown ledger's included.
	mux.HandleFunc(Path, f.notFound)
	f.root = protect(log, front.Auth, auth, mux)
	return f, nil
}

// ServeHTTP serves the fleet's console under Path.
func (f *Fleet) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	secureHeaders(w.Header())
	f.root.ServeHTTP(w, r)
}

// Ledgers are the fleet's ledgers' names, sorted.
func (f *Fleet) Ledgers() []string { return slices.Clone(f.names) }

func (f *Fleet) notFound(w http.ResponseWriter, r *http.Request) {
	what := "No such page in the console."
	if rest, ok := strings.CutPrefix(r.URL.Path, Path+"ledgers/"); ok {
		name, _, _ := strings.Cut(rest, "/")
		what = "No ledger " + fmt.Sprintf("%q", name) + " in this console: choose one of the ledgers above."
	}
	p := page{Title: "Not found", User: userOf(r), Err: what, FleetRoot: true, Ledgers: f.links("", nil)}
	f.front.renderPage(w, http.StatusNotFound, "error", p)
}

// links are the switcher's: every ledger, each at rel (a page's path
// under a ledger's, with its query q), current marked.
func (f *Fleet) links(current string, pageOf func(name string) string) []ledgerLink {
	out := make([]ledgerLink, 0, len(f.names))
	for _, n := range f.names {
		u := LedgerPath(n)
		if pageOf != nil {
			u = pageOf(n)
		}
		out = append(out, ledgerLink{Name: n, URL: u, Current: n == current})
	}
	return out
}

// ledgerLink is one ledger in the switcher.
type ledgerLink struct {
	Name, URL string
	Current   bool
}

// switchPages are the pages the switcher keeps when it changes ledger
// (with their query: the filter, the key); from any other (an action's
// answer) it goes to the other ledger's overview.
var switchPages = []string{"", "keys", "key", "checks", "alerts", "runs", "bulk"}

// switchDrop are the query's parameters that belong to one ledger's page
// of a list (a cursor) or to an answer (done): not carried over.
var switchDrop = []string{"after", "after_reason", "before", "done"}

// switcher is the page's ledger switcher: nil outside a fleet.
func (h *Handler) switcher(r *http.Request) []ledgerLink {
	if h.fleet == nil {
		return nil
	}
	rel := strings.TrimPrefix(r.URL.Path, h.base)
	if r.Method != http.MethodGet || !slices.Contains(switchPages, rel) {
		return h.fleet.links(h.cfg.Ledger, nil)
	}
	q := url.Values{}
	for k, v := range r.URL.Query() {
		if !slices.Contains(switchDrop, k) {
			q[k] = v
		}
	}
	query := ""
	if len(q) > 0 {
		query = "?" + q.Encode()
	}
	return h.fleet.links(h.cfg.Ledger, func(name string) string { return LedgerPath(name) + rel + query })
}

// fleetLedgerView is one ledger's line on the fleet's overview.
type fleetLedgerView struct {
	Name, URL string
	// InWindow, Stuck, FailedRetryable and Held sum the ledger's tools'.
	InWindow, Stuck, FailedRetryable, Held int
	// Firing counts firing alerts, up to maxFiring (FiringMore: more).
	Firing     int
	FiringMore bool
	// OpenBreakers are the tools whose breaker is open.
	OpenBreakers []string
	// Err says the ledger could not be read (logged).
	Err string
}

// overview is the fleet's first page: every ledger with its counts, read
// at once (each within readTimeout); a ledger that cannot be read is said
// to be so, the others shown.
func (f *Fleet) overview(w http.ResponseWriter, r *http.Request) {
	views := make([]fleetLedgerView, len(f.names))
	var wg sync.WaitGroup
	for i, name := range f.names {
		wg.Go(func() { views[i] = f.ledgers[name].fleetLine(r.Context(), userOf(r)) })
	}
	wg.Wait()
	p := page{Title: "Ledgers", User: userOf(r), FleetRoot: true, Data: views}
	f.front.renderPage(w, http.StatusOK, "fleet", p)
}

// fleetLine reads the ledger's line of the fleet's overview.
func (h *Handler) fleetLine(ctx context.Context, user string) fleetLedgerView {
	v := fleetLedgerView{Name: h.cfg.Ledger, URL: h.base}
	ctx, cancel := context.WithTimeout(ctx, readTimeout)
	defer cancel()
	fail := func(what string, err error) fleetLedgerView {
		h.log.Error("console: fleet overview: "+what, "ledger", h.cfg.Ledger, "user", user, "err", h.red.Error(err))
		v.Err = what + " failed: the database did not answer (see serve's log)"
		return v
	}
	counts, err := store.StatsWith(ctx, h.cfg.Pool, h.storeWindows(), store.StatsOptions{})
	if err != nil {
		return fail("reading the counts", err)
	}
	for _, t := range counts.Tools {
		v.InWindow += t.InWindow
		v.Stuck += t.Stuck
		v.FailedRetryable += t.FailedRetryable
		v.Held += t.Held
	}
	firing, err := alerts.OpenKeyAlerts(ctx, h.cfg.Pool, maxFiring+1)
	if err != nil {
		return fail("reading the firing alerts", err)
	}
	v.Firing, v.FiringMore = min(len(firing), maxFiring), len(firing) > maxFiring
	breakers, err := reconcile.Breakers(ctx, h.cfg.Pool)
	if err != nil {
		return fail("reading the breakers", err)
	}
	for _, b := range breakers {
		if b.Open {
			v.OpenBreakers = append(v.OpenBreakers, b.Tool)
		}
	}
	return v
}

// Grant is one entry of console.operators: an action, on every ledger or
// on one.
type Grant struct {
	// Ledger is the ledger the grant is limited to; "": every ledger.
	Ledger string
	// Action is what is granted; "": every action (LEDGER:*).
	Action Action
}

// ParseGrant reads an entry of console.operators: an action ("hold": on
// every ledger), "LEDGER:ACTION" ("billing:hold": on that ledger only) or
// "LEDGER:*" (every action on that ledger). Whether the ledger exists is
// the caller's to check; the error says what else is wrong.
func ParseGrant(entry string) (Grant, error) {
	name, act, scoped := strings.Cut(entry, ":")
	if !scoped {
		if !slices.Contains(Actions, Action(entry)) {
			return Grant{}, fmt.Errorf("unknown action %q (want hold, release, mark_retryable, store_outcome or reconcile; LEDGER:ACTION or LEDGER:* for one ledger; an empty list is all of them)", entry)
		}
		return Grant{Action: Action(entry)}, nil
	}
	if !ledgerName.MatchString(name) {
		return Grant{}, fmt.Errorf("%q: %q is not a ledger's name (lower-case letters, digits, '-' and '_')", entry, name)
	}
	if act == "*" {
		return Grant{Ledger: name}, nil
	}
	if !slices.Contains(Actions, Action(act)) {
		return Grant{}, fmt.Errorf("%q: unknown action %q (want hold, release, mark_retryable, store_outcome, reconcile, or * for all of them on ledger %s)", entry, act, name)
	}
	return Grant{Ledger: name, Action: Action(act)}, nil
}

// OperatorsOn is Config.Operators of ledger's console from the grants of
// console.operators (ops: user to entries, see ParseGrant): a user whose
// list is empty may take every action on every ledger; otherwise the
// actions granted on every ledger and those on this one. A user granted
// nothing on the ledger is absent (may only read it); one granted
// everything on it (LEDGER:*) has an empty list.
func OperatorsOn(ops map[string][]string, ledger string) (map[string][]Action, error) {
	out := map[string][]Action{}
	for user, entries := range ops {
		if len(entries) == 0 {
			out[user] = []Action{}
			continue
		}
		var acts []Action
		all, some := false, false
		for _, e := range entries {
			g, err := ParseGrant(e)
			if err != nil {
				return nil, fmt.Errorf("console: operator %s: %w", user, err)
			}
			if g.Ledger != "" && g.Ledger != ledger {
				continue
			}
			some = true
			if g.Action == "" {
				all = true
			} else if !slices.Contains(acts, g.Action) {
				acts = append(acts, g.Action)
			}
		}
		switch {
		case all:
			out[user] = []Action{}
		case some:
			out[user] = acts
		}
	}
	return out, nil
}
