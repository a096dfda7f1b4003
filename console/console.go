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
	"slices"
	"strconv"
	"time"

	"github.com/ledgerkeeper/ledgerkeeper/internal/secret"
	"github.com/ledgerkeeper/ledgerkeeper/operator"
	"github.com/ledgerkeeper/ledgerkeeper/store"
)

// Path is where the console lives on a listener.
const Path = "/ui/"

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
}

// New builds a Handler, or says which setting cannot work.
func New(cfg Config) (*Handler, error) {
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
	h := &Handler{cfg: cfg, log: cfg.Logger, red: cfg.Redactor}
	if h.log == nil {
		h.log = slog.New(slog.DiscardHandler)
	}
	h.cfg.ExactBelow = cmp.Or(cfg.ExactBelow, DefaultExactBelow)
	h.cfg.PageSize = cmp.Or(cfg.PageSize, 50)
	var err error
	if h.auth, err = newAuthenticator(cfg); err != nil {
		return nil, err
	}
	if h.pages, err = parsePages(); err != nil {
		return nil, err
	}
	mux := http.NewServeMux()
	if err := serveStatic(mux); err != nil {
		return nil, err
	}
	mux.HandleFunc("GET "+Path+"{$}", h.overview)
	mux.HandleFunc("GET "+Path+"keys", h.keys)
	mux.HandleFunc("GET "+Path+"key", h.key)
	mux.HandleFunc("POST "+Path+"key/hold", h.hold)
	mux.HandleFunc("POST "+Path+"key/release", h.release)
	mux.HandleFunc("POST "+Path+"key/retryable", h.retryable)
	mux.HandleFunc("POST "+Path+"key/outcome", h.outcome)
	h.routesLive(mux)
	h.routesBulk(mux)
	h.routesRun(mux)
	// Cross-site POSTs (Sec-Fetch-Site, else Origin against Host) are
	// refused before authentication or any handler: a browser carries a
	// user's Basic credentials to a forged form as readily as to ours.
	cop := http.NewCrossOriginProtection()
	cop.SetDenyHandler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		h.log.Warn("console: cross-origin request refused", "method", r.Method, "path", r.URL.Path)
		http.Error(w, "cross-origin request refused: nothing changed", http.StatusForbidden)
	}))
	h.root = cop.Handler(h.authenticate(mux))
	return h, nil
}

// staticTypes are the embedded assets' content types, by extension: a file
// of any other kind is not served.
var staticTypes = map[string]string{
	".css": "text/css; charset=utf-8",
	".js":  "text/javascript; charset=utf-8",
}

// serveStatic serves each embedded asset by its own name: no directory
// listing, no other path.
func serveStatic(mux *http.ServeMux) error {
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
		mux.HandleFunc("GET "+Path+"static/"+name, func(w http.ResponseWriter, _ *http.Request) {
			w.Header().Set("Content-Type", ctype)
			_, _ = w.Write(body)
		})
		return nil
	})
}

// ServeHTTP serves the console's pages under Path.
func (h *Handler) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	hd := w.Header()
	// Scripts, styles and images from the console's own files only (no
	// inline script or style); fetches to the console only; forms post to
	// it only; never framed.
	hd.Set("Content-Security-Policy", "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self'; connect-src 'self'; form-action 'self'; frame-ancestors 'none'; base-uri 'none'")
	hd.Set("X-Content-Type-Options", "nosniff")
	hd.Set("Referrer-Policy", "same-origin")
	hd.Set("X-Frame-Options", "DENY")
	hd.Set("Cache-Control", "no-store")
	h.root.ServeHTTP(w, r)
}

type userKey struct{}

// userOf is the request's authenticated user.
func userOf(r *http.Request) string {
	u, _ := r.Context().Value(userKey{}).(string)
	return u
}

func (h *Handler) authenticate(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		user, status, why := h.auth.user(r)
		if status != 0 {
			switch {
			case status == http.StatusUnauthorized && h.cfg.Auth == AuthBasic:
				w.Header().Set("WWW-Authenticate", `Basic realm="ledgerkeeper console", charset="UTF-8"`)
			case status == http.StatusTooManyRequests:
				w.Header().Set("Retry-After", strconv.Itoa(int(signInWindow.Seconds())))
			}
			h.log.Info("console: request not authenticated", "path", r.URL.Path, "status", status, "why", why)
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

// actor is the audit trail's name for a console user.
func actor(user string) string { return "console:" + user }

// readTimeout bounds a page's reads and an action's transaction.
const readTimeout = 10 * time.Second
