package daemon

import (
	"fmt"
	"log/slog"
	"maps"
	"net"
	"net/http"
	"net/netip"
	"os"
	"slices"
	"strings"
	"time"

	"github.com/ledgerkeeper/ledgerkeeper/console"
	"github.com/ledgerkeeper/ledgerkeeper/internal/config"
	"github.com/ledgerkeeper/ledgerkeeper/operator"
	"github.com/ledgerkeeper/ledgerkeeper/store"
)

// validateConsole checks the console section beyond its tags: the users
// (inline and the users file: names, bcrypt hashes, each named once) and the
// operators' names and grants (actions, LEDGER:ACTION and LEDGER:* naming
// a ledger of the configuration).
func validateConsole(c *config.Config) []*config.Error {
	var errs []*config.Error
	add := func(path, format string, args ...any) { errs = append(errs, c.ErrorAt(path, format, args...)) }
	if _, err := consoleUsers(c); err != nil {
		errs = append(errs, err)
	}
	for _, user := range slices.Sorted(maps.Keys(c.Console.Operators)) {
		base := "console.operators." + user
		if err := console.ValidUser(user); err != nil {
			add(base, "%v", err)
		}
		seen := map[string]bool{}
		for i, a := range c.Console.Operators[user] {
			path := fmt.Sprintf("%s[%d]", base, i)
			g, err := console.ParseGrant(a)
			switch {
			case err != nil:
				add(path, "%v", err)
			case seen[a]:
				add(path, "action %q listed twice", a)
			case g.Ledger != "" && !inheritsConsole(c):
				if _, err := c.Ledger(g.Ledger); err != nil {
					add(path, "%q: %v", a, err)
				}
			}
			seen[a] = true
		}
	}
	return errs
}

// inheritsConsole says whether c is one ledger's configuration of a fleet's:
// its console section is the top level's, whose own check names the
// ledgers a grant may be limited to (c knows only itself).
func inheritsConsole(c *config.Config) bool { return c.LedgerName() != "" }

// consoleUsers gathers console.users and console.users_file; an error is
// located at the setting (and the file's line) that is wrong. A hash never
// appears in an error.
func consoleUsers(c *config.Config) (map[string][]byte, *config.Error) {
	users := map[string][]byte{}
	if f := c.Console.UsersFile; f != "" {
		fh, err := os.Open(f) //nolint:gosec // G304: the path is the operator's own setting, console.users_file
		if err != nil {
			return nil, c.ErrorAt("console.users_file", "%v", err)
		}
		defer fh.Close()
		if users, err = console.ParseUsers(fh); err != nil {
			return nil, c.ErrorAt("console.users_file", "%s: %v", f, err)
		}
	}
	for _, name := range slices.Sorted(maps.Keys(c.Console.Users)) {
		path := "console.users." + name
		if err := console.ValidUser(name); err != nil {
			return nil, c.ErrorAt(path, "%v", err)
		}
		hash := c.Console.Users[name].Reveal()
		if parsed, err := console.ParseUsers(strings.NewReader(name + ":" + hash)); err != nil || len(parsed) != 1 {
			return nil, c.ErrorAt(path, "not a bcrypt hash (make one with htpasswd -nB %s)", name)
		}
		if _, dup := users[name]; dup {
			return nil, c.ErrorAt(path, "user %s is also in console.users_file", name)
		}
		users[name] = []byte(hash)
	}
	return users, nil
}

// Loopback reports whether a listen address accepts loopback connections
// only: a host that is a loopback address, or localhost.
func Loopback(listen string) bool {
	host, _, err := net.SplitHostPort(listen)
	if err != nil {
		return false
	}
	if host == "localhost" {
		return true
	}
	a, err := netip.ParseAddr(host)
	return err == nil && a.IsLoopback()
}

// ConsoleOption gives the console what only the process serving it knows
// (serve's reconcile engine), beyond the configuration.
type ConsoleOption func(*console.Config)

// WithProbePauses gives the console the engine's probe pauses
// (reconcile.Engine.ProbePauses), shown on the overview with the ledger's
// (every replica's); without it the overview shows the ledger's only.
func WithProbePauses(pauses func() map[string]time.Time) ConsoleOption {
	return func(cc *console.Config) { cc.Live.ProbePauses = pauses }
}

// BuildConsole builds the web console from the configuration, for a
// listener on listen (auth none needs a loopback one). windows is what "in
// flight" means per tool (the engine's, as Slack's and the CLI's resolve
// use). An error is located at the setting that is wrong.
//
// The grants are those of console.operators that apply to the one ledger
// (config.DefaultLedger: an entry limited to a ledger, LEDGER:ACTION, counts
// when it names that one).
func BuildConsole(c *config.Config, pool store.Beginner, windows operator.Windows, listen string, logger *slog.Logger, opts ...ConsoleOption) (*console.Handler, error) {
	front, err := consoleFront(c, listen, logger)
	if err != nil {
		return nil, err
	}
	cc, err := ledgerConsole(c, config.DefaultLedger, pool, windows)
	if err != nil {
		return nil, err
	}
	cc.Auth, cc.Users, cc.ProxyHeader, cc.ProxyCIDRs, cc.Loopback = front.Auth, front.Users, front.ProxyHeader, front.ProxyCIDRs, front.Loopback
	cc.Redactor, cc.Logger = front.Redactor, front.Logger
	h, err := console.New(withOptions(opts, cc))
	if err != nil {
		return nil, c.ErrorAt("console.auth", "%v", err)
	}
	return h, nil
}

// consoleFront is how users sign in to the console (and its redactor and
// logger), from c's console section, for a listener on listen.
func consoleFront(c *config.Config, listen string, logger *slog.Logger) (console.Config, error) {
	users, cerr := consoleUsers(c)
	if cerr != nil {
		return console.Config{}, cerr
	}
	var cidrs []netip.Prefix
	for _, s := range c.Console.ProxyCIDRs {
		p, err := netip.ParsePrefix(s)
		if err != nil {
			return console.Config{}, c.ErrorAt("console.proxy_cidrs", "%q is not a CIDR", s)
		}
		cidrs = append(cidrs, p.Masked())
	}
	return console.Config{
		Auth:        console.Auth(c.Console.Auth),
		Users:       users,
		ProxyHeader: c.Console.ProxyHeader,
		ProxyCIDRs:  cidrs,
		Loopback:    Loopback(listen),
		Redactor:    c.Redactor(),
		Logger:      logger,
	}, nil
}

// ledgerConsole is one ledger's part of the console: its database, its
// windows, the grants on it (console.operators of top) and the bulk limit.
func ledgerConsole(top *config.Config, ledger string, pool store.Beginner, windows operator.Windows) (console.Config, error) {
	ops, err := console.OperatorsOn(top.Console.Operators, ledger)
	if err != nil {
		return console.Config{}, top.ErrorAt("console.operators", "%v", err)
	}
	return console.Config{
		Pool:      pool,
		Operators: ops,
		Windows:   windows,
		Bulk:      console.BulkConfig{Limit: top.Console.BulkLimit},
	}, nil
}

// withOptions is cfg with opts applied.
func withOptions(opts []ConsoleOption, cfg console.Config) console.Config {
	for _, o := range opts {
		o(&cfg)
	}
	return cfg
}

// ConsoleSummary is one line saying how the console is reached, for
// serve's start-up log and `ledgerkeeper console`. It never shows a secret.
func ConsoleSummary(c *config.Config, listen string) string {
	users, _ := consoleUsers(c)
	who := fmt.Sprintf("auth %s", c.Console.Auth)
	switch c.Console.Auth {
	case string(console.AuthBasic):
		who += fmt.Sprintf(", %d user(s)", len(users))
		if len(users) == 0 {
			who += ": nobody can sign in until console.users or console.users_file names someone"
		}
	case string(console.AuthProxy):
		who += " (" + c.Console.ProxyHeader + " from " + strings.Join(c.Console.ProxyCIDRs, ", ") + ")"
	}
	return fmt.Sprintf("console: %s on %s, %s; %d operator(s) may act", console.Path, listen, who, len(c.Console.Operators))
}

// consoleWarnings names, for `config check`, a console setting that is
// valid but cannot serve as configured: auth none with serve's console on a
// listener that is not loopback (serve refuses to start it).
func consoleWarnings(c *config.Config) []string {
	if c.Console.Auth == string(console.AuthNone) && c.HTTP.ConsoleEnabled() && c.HTTP.Listen != "" && !Loopback(c.HTTP.Listen) {
		return []string{c.ErrorAt("console.auth", "none: serve refuses to start with its console on http.listen %s, which is not loopback; set http.console.enabled: false for serve (ledgerkeeper console serves on console.listen), or use basic or proxy", c.HTTP.Listen).Error()}
	}
	return nil
}

// ConsoleCheckSummary is `config check`'s line about serve's console: off,
// or how it is reached on http.listen.
func ConsoleCheckSummary(c *config.Config) string {
	if !c.HTTP.ConsoleEnabled() {
		return "console: off in serve (http.console.enabled: false)"
	}
	return ConsoleSummary(c, c.HTTP.Listen)
}

// ConsoleRoutes adds the web console to serve's routes (at console.Path on
// http.listen) when http.console.enabled, and logs how it is reached;
// routes is returned as it is otherwise. An error is located at the
// setting that is wrong.
func ConsoleRoutes(c *config.Config, pool store.Beginner, windows operator.Windows, logger *slog.Logger, routes map[string]http.Handler, opts ...ConsoleOption) (map[string]http.Handler, error) {
	if !c.HTTP.ConsoleEnabled() || c.HTTP.Listen == "" {
		return routes, nil
	}
	h, err := BuildConsole(c, pool, windows, c.HTTP.Listen, logger, opts...)
	if err != nil {
		return nil, err
	}
	out := maps.Clone(routes)
	if out == nil {
		out = map[string]http.Handler{}
	}
	out[console.Path] = h
	logger.Info("console on", "summary", ConsoleSummary(c, c.HTTP.Listen))
	return out, nil
}

// BuildFleetConsole builds the console of several ledgers (console.Fleet)
// from the top level's console section, for a listener on listen: each
// ledger's pages under /ui/ledgers/NAME/ on its own pool and windows, with
// the grants of console.operators that apply to it, and perLedger's
// options (nil: none) for it, such as WithProbePauses and WithRun of the
// ledger's engine. An error is located at the setting that is wrong.
func BuildFleetConsole(top *config.Config, ledgers []LedgerTarget, listen string, logger *slog.Logger, perLedger func(name string) []ConsoleOption) (*console.Fleet, error) {
	front, err := consoleFront(top, listen, logger)
	if err != nil {
		return nil, err
	}
	var fl []console.FleetLedger
	for _, t := range ledgers {
		cc, err := ledgerConsole(top, t.Name, t.Pool, t.Windows)
		if err != nil {
			return nil, err
		}
		var opts []ConsoleOption
		if perLedger != nil {
			opts = perLedger(t.Name)
		}
		fl = append(fl, console.FleetLedger{Name: t.Name, Config: withOptions(opts, cc)})
	}
	f, err := console.NewFleet(front, fl)
	if err != nil {
		return nil, top.ErrorAt("console.auth", "%v", err)
	}
	return f, nil
}

// FleetConsoleRoutes adds the web console of every ledger to serve's routes
// (at console.Path on http.listen) when http.console.enabled, and logs how
// it is reached; routes is returned as it is otherwise. With a ledgers
// section it is the fleet's console (BuildFleetConsole: the overview at
// /ui/, each ledger under /ui/ledgers/NAME/); without one, ledgers is the
// one ledger and its console is ConsoleRoutes's at /ui/, exactly. An error
// is located at the setting that is wrong.
func FleetConsoleRoutes(top *config.Config, ledgers []LedgerTarget, logger *slog.Logger, routes map[string]http.Handler, perLedger func(name string) []ConsoleOption) (map[string]http.Handler, error) {
	if !top.HTTP.ConsoleEnabled() || top.HTTP.Listen == "" {
		return routes, nil
	}
	if !top.Fleet() {
		if len(ledgers) != 1 {
			return nil, fmt.Errorf("console: a configuration without a ledgers section keeps one ledger, not %d", len(ledgers))
		}
		var opts []ConsoleOption
		if perLedger != nil {
			opts = perLedger(ledgers[0].Name)
		}
		return ConsoleRoutes(top, ledgers[0].Pool, ledgers[0].Windows, logger, routes, opts...)
	}
	f, err := BuildFleetConsole(top, ledgers, top.HTTP.Listen, logger, perLedger)
	if err != nil {
		return nil, err
	}
	out := maps.Clone(routes)
	if out == nil {
		out = map[string]http.Handler{}
	}
	out[console.Path] = f
	logger.Info("console on", "summary", ConsoleSummary(top, top.HTTP.Listen), "ledgers", strings.Join(f.Ledgers(), ", "))
	return out, nil
}
