package console

import (
	"cmp"
	"context"
	"embed"
	"errors"
	"fmt"
	"html/template"
	"io/fs"
	"log/slog"
	"net/http"
	"net/netip"
	"path"
	"regexp"
	"slices"
	"strconv"
	"time"

	"github.com/ledgerkeeper/ledgerkeeper/console/uipath"
	"github.com/ledgerkeeper/ledgerkeeper/internal/secret"
	"github.com/ledgerkeeper/ledgerkeeper/operator"
	"github.com/ledgerkeeper/ledgerkeeper/store"
)

// Path is where the console lives on a listener.
const Path = uipath.Root

// LedgerPath is where ledger's console lives in a fleet's (NewFleet):
// /ui/ledgers/NAME/ (uipath.Base, which links from elsewhere use).
func LedgerPath(ledger string) string { return uipath.Base(ledger) }

// ledgerName is what a ledger's name may be (config's rule): it is written
// into URLs as it is.
var ledgerName = regexp.MustCompile(`^[a-z0-9][a-z0-9_-]{0,62}$`)

// Action is one thing a user may be granted.
type Action string

// The actions, as Config.Operators lists them (the same names as Slack's).
const (
	ActionHold         Action = "hold"
	ActionRelease      Action = "release"
	ActionRetryable    Action = "mark_retryable"
	ActionStoreOutcome Action = "store_outcome"
	// ActionReconcile runs one reconcile pass restricted to a key (the
	// console's own: Slack has no such action).
	ActionReconcile Action = "reconcile"
)

// Actions lists every action, for configuration checks.
var Actions = []Action{ActionHold, ActionRelease, ActionRetryable, ActionStoreOutcome, ActionReconcile}

// Auth is how a request's user is known.
type Auth string

// The ways to authenticate.
const (
	// AuthBasic: HTTP Basic, checked against Config.Users' bcrypt hashes.
	AuthBasic Auth = "basic"
	// AuthProxy: the user named by Config.ProxyHeader, believed only from
	// an address in Config.ProxyCIDRs (oauth2-proxy and the like).
	AuthProxy Auth = "proxy"
	// AuthNone: everyone is the user "local"; only on a loopback
	// listener (Config.Loopback).
	AuthNone Auth = "none"
)

// LocalUser is the user of AuthNone.
const LocalUser = "local"

// DefaultExactBelow is the number of keys up to which a listing's count is
// exact; above it the planner's estimate is shown, marked as one.
const DefaultExactBelow = 10000

// Config is what a Handler needs.
type Config struct {
	// Pool is the ledger's database. Required.
	Pool store.Beginner
	// Auth says how users are known. Required.
	Auth Auth
	// Users maps a user name to its bcrypt hash (AuthBasic).
	Users map[string][]byte
	// ProxyHeader names the user (AuthProxy), e.g. X-Forwarded-User.
	ProxyHeader string
	// ProxyCIDRs are the addresses the proxy connects from (AuthProxy):
	// the header of any other peer is not believed.
	ProxyCIDRs []netip.Prefix
	// Loopback: the listener accepts loopback connections only. AuthNone
	// needs it.
	Loopback bool
	// Operators maps a user to the actions it may take; an empty list is
	// every action. A user not in it may only read.
	Operators map[string][]Action
	// Windows is what "in flight" means per tool (serve's configuration:
	// window + grace and heartbeat timeout). Nil: every resolve is
	// refused, as the command line's without a configuration.
	Windows operator.Windows
	// Redactor goes over every body, evidence and error shown or logged;
	// nil: the built-in patterns only.
	Redactor *secret.Redactor
	// Logger; nil discards.
	Logger *slog.Logger
	// ExactBelow: see DefaultExactBelow; 0 is the default.
	ExactBelow int64
	// PageSize is the keys listed per page; 0: 50.
	PageSize int
	// Live configures the overview's auto-refresh and its stuck-keys chart
	// (live.go).
	Live LiveConfig
	// Bulk configures bulk actions by filter (bulk.go).
	Bulk BulkConfig
	// Run gives the console what serve runs: probes and the reconciler,
	// for "probe now" and "reconcile this key now" (run.go).
	Run RunConfig
	// Ledger names the ledger shown when the console is one ledger's of a
	// fleet (NewFleet sets it): its pages are under LedgerPath(Ledger), the
	// audit trail's actor names the ledger beside the user, refusals say
	// which ledger. "": the one ledger, at Path, as ever.
	Ledger string
}

//go:embed templates/*.html
var templateFS embed.FS

//go:embed static
var staticFS embed.FS

// Handler serves the console. It is safe for concurrent use.
type Handler struct {
	cfg   Config
	log   *slog.Logger
	red   *secret.Redactor
	pages map[string]*template.Template
	auth  authenticator
	root  http.Handler
	// base is where the pages are: Path, or LedgerPath(cfg.Ledger).
	base string
	// mux routes the pages under base; root is it behind the cross-origin
	// check and authentication (a fleet's own, for a ledger of one).
	mux *http.ServeMux
	// fleet is the fleet this console is one ledger's of (its switcher);
	// nil alone.
	fleet *Fleet
}

// New builds a Handler, or says which setting cannot work.
func New(cfg Config) (*Handler, error) {
	h, err := newPages(cfg)
	if err != nil {
		return nil, err
	}
	if h.auth, err = newAuthenticator(cfg); err != nil {
		return nil, err
	}
	h.root = protect(h.log, cfg.Auth, h.auth, h.mux)
	return h, nil
}

// newPages builds a Handler's pages and routes, under its base, without
// the authentication in front of them (New's, or a fleet's).
func newPages(cfg Config) (*Handler, error) {
	if cfg.Pool == nil {
		return nil, errors.New("console: a database pool is required")
	}
	for user, acts := range cfg.Operators {
		for _, a := range acts {
			if !slices.Contains(Actions, a) {
				return nil, fmt.Errorf("console: operator %s: unknown action %q (known: hold, release, mark_retryable, store_outcome, reconcile)", user, a)
			}
		}
	}
	h := &Handler{cfg: cfg, log: cfg.Logger, red: cfg.Redactor, base: Path}
	if cfg.Ledger != "" {
		if !ledgerName.MatchString(cfg.Ledger) {
			return nil, fmt.Errorf("console: ledger name %q: lower-case letters, digits, '-' and '_', at most 63 characters", cfg.Ledger)
		}
		h.base = LedgerPath(cfg.Ledger)
	}
	if h.log == nil {
		h.log = slog.New(slog.DiscardHandler)
	}
	h.cfg.ExactBelow = cmp.Or(cfg.ExactBelow, DefaultExactBelow)
	h.cfg.PageSize = cmp.Or(cfg.PageSize, 50)
	var err error
	if h.pages, err = parsePages(cfg.Ledger); err != nil {
		return nil, err
	}
	mux := http.NewServeMux()
	if err := serveStatic(mux, h.base); err != nil {
		return nil, err
	}
	mux.HandleFunc("GET "+h.base+"{$}", h.overview)
	mux.HandleFunc("GET "+h.base+"keys", h.keys)
	mux.HandleFunc("GET "+h.base+"key", h.key)
	mux.HandleFunc("POST "+h.base+"key/hold", h.hold)
	mux.HandleFunc("POST "+h.base+"key/release", h.release)
	mux.HandleFunc("POST "+h.base+"key/retryable", h.retryable)
	mux.HandleFunc("POST "+h.base+"key/outcome", h.outcome)
	h.routesLive(mux)
	h.routesBulk(mux)
	h.routesRun(mux)
	h.mux = mux
	return h, nil
}

// protect puts the cross-origin check and authentication in front of
// next. Cross-site POSTs (Sec-Fetch-Site, else Origin against Host) are
// refused before authentication or any handler: a browser carries a user's
// Basic credentials to a forged form as readily as to ours.
func protect(log *slog.Logger, kind Auth, auth authenticator, next http.Handler) http.Handler {
	cop := http.NewCrossOriginProtection()
	cop.SetDenyHandler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		log.Warn("console: cross-origin request refused", "method", r.Method, "path", r.URL.Path)
		http.Error(w, "cross-origin request refused: nothing changed", http.StatusForbidden)
	}))
	return cop.Handler(authenticate(log, kind, auth, next))
}

// staticTypes are the embedded assets' content types, by extension: a file
// of any other kind is not served.
var staticTypes = map[string]string{
	".css": "text/css; charset=utf-8",
	".js":  "text/javascript; charset=utf-8",
}

// serveStatic serves each embedded asset by its own name: no directory
// listing, no other path.
func serveStatic(mux *http.ServeMux, base string) error {
	static, err := fs.Sub(staticFS, "static")
	if err != nil {
		return err
	}
	return fs.WalkDir(static, ".", func(name string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		ctype, ok := staticTypes[path.Ext(name)]
		if !ok {
			return nil
		}
		body, err := fs.ReadFile(static, name)
		if err != nil {
			return err
		}
		mux.HandleFunc("GET "+base+"static/"+name, func(w http.ResponseWriter, _ *http.Request) {
			w.Header().Set("Content-Type", ctype)
			_, _ = w.Write(body)
		})
		return nil
	})
}

// ServeHTTP serves the console's pages under Path (LedgerPath of its
// ledger when Config.Ledger names one).
func (h *Handler) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	secureHeaders(w.Header())
	h.root.ServeHTTP(w, r)
}

// secureHeaders are every answer's.
func secureHeaders(hd http.Header) {
	// Scripts, styles and images from the console's own files only (no
	// inline script or style); fetches to the console only; forms post to
	// it only; never framed.
	hd.Set("Content-Security-Policy", "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self'; connect-src 'self'; form-action 'self'; frame-ancestors 'none'; base-uri 'none'")
	hd.Set("X-Content-Type-Options", "nosniff")
	hd.Set("Referrer-Policy", "same-origin")
	hd.Set("X-Frame-Options", "DENY")
	hd.Set("Cache-Control", "no-store")
}

type userKey struct{}

// userOf is the request's authenticated user.
func userOf(r *http.Request) string {
	u, _ := r.Context().Value(userKey{}).(string)
	return u
}

func authenticate(log *slog.Logger, kind Auth, auth authenticator, next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		user, status, why := auth.user(r)
		if status != 0 {
			switch {
			case status == http.StatusUnauthorized && kind == AuthBasic:
				w.Header().Set("WWW-Authenticate", `Basic realm="ledgerkeeper console", charset="UTF-8"`)
			case status == http.StatusTooManyRequests:
				w.Header().Set("Retry-After", strconv.Itoa(int(signInWindow.Seconds())))
			}
			log.Info("console: request not authenticated", "path", r.URL.Path, "status", status, "why", why)
			http.Error(w, why, status)
			return
		}
		next.ServeHTTP(w, r.WithContext(context.WithValue(r.Context(), userKey{}, user)))
	})
}

// may reports whether user is granted a.
func (h *Handler) may(user string, a Action) bool {
	acts, ok := h.cfg.Operators[user]
	return ok && (len(acts) == 0 || slices.Contains(acts, a))
}

// actor is the audit trail's name for a console user: console:<user>, and
// in a fleet's console the ledger beside it, "console:alice (ledger
// billing)".
func (h *Handler) actor(user string) string {
	if h.cfg.Ledger != "" {
		return "console:" + user + " (ledger " + h.cfg.Ledger + ")"
	}
	return "console:" + user
}

// readTimeout bounds a page's reads and an action's transaction.
const readTimeout = 10 * time.Second
