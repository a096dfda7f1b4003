package daemon

import (
	"cmp"
	"fmt"
	"log/slog"
	"maps"
	"net/http"
	"regexp"
	"slices"
	"strings"

	"github.com/slack-go/slack"

	"github.com/ledgerkeeper/ledgerkeeper/alerts"
	"github.com/ledgerkeeper/ledgerkeeper/interact"
	"github.com/ledgerkeeper/ledgerkeeper/internal/config"
	"github.com/ledgerkeeper/ledgerkeeper/operator"
	"github.com/ledgerkeeper/ledgerkeeper/store"
)

// InteractionsPath is where serve's listener takes Slack's interaction
// requests when alerts.slack.signing_secret is set (the Slack app's
// Interactivity request URL is https://<serve>/slack/interactions).
const InteractionsPath = "/slack/interactions"

// slackUserID is what a Slack user ID looks like: U (or W, on Enterprise
// Grid) and upper-case letters and digits. A display name or an e-mail
// address would never match the user a click comes from.
var slackUserID = regexp.MustCompile(`^[UW][A-Z0-9]{2,20}$`)

// validateInteractive checks alerts.slack's interactivity settings: the
// operators' shape whenever they are given, and what interactive: true
// needs to work (a bot token, an operator, a transport).
func validateInteractive(c *config.Config) []*config.Error {
	var errs []*config.Error
	add := func(path, format string, args ...any) { errs = append(errs, c.ErrorAt(path, format, args...)) }
	s := c.Alerts.Slack
	for _, id := range slices.Sorted(maps.Keys(s.Operators)) {
		op := s.Operators[id]
		base := "alerts.slack.operators." + id
		if !slackUserID.MatchString(id) {
			add(base, "%q is not a Slack user ID (like U012ABCDEF: the member ID in the user's Slack profile, not a name)", id)
		}
		if strings.TrimSpace(op.Name) == "" {
			add(base+".name", "required: the operator's name, recorded in the audit")
		}
		seen := map[string]bool{}
		for i, a := range op.Actions {
			path := fmt.Sprintf("%s.actions[%d]", base, i)
			switch {
			case !slices.Contains(interact.Actions, interact.Action(a)):
				add(path, "unknown action %q (want %s)", a, actionNames())
			case seen[a]:
				add(path, "action %q listed twice", a)
			}
			seen[a] = true
		}
	}
	if t := s.AppToken.Reveal(); t != "" && !strings.HasPrefix(t, "xapp-") {
		add("alerts.slack.app_token", "not an app-level token (xapp-…): create one under the app's Basic Information with the connections:write scope")
	}
	if !s.Interactive {
		return errs
	}
	if s.Token == "" {
		add("alerts.slack.interactive", "needs alerts.slack.token (a bot token): buttons open dialogs and update the alert message, which a webhook cannot")
	}
	if s.WebhookURL != "" {
		add("alerts.slack.webhook_url", "interactive alerts are posted with alerts.slack.token: remove webhook_url (a webhook's message cannot be updated in place)")
	}
	if len(s.Operators) == 0 {
		add("alerts.slack.interactive", "needs alerts.slack.operators: the Slack user IDs allowed to act (nobody else may)")
	}
	if s.AppToken == "" && s.SigningSecret == "" {
		add("alerts.slack.interactive", "needs a transport: alerts.slack.app_token (Socket Mode, no public ingress) or alerts.slack.signing_secret (serve's %s)", InteractionsPath)
	}
	return errs
}

func actionNames() string {
	names := make([]string, len(interact.Actions))
	for i, a := range interact.Actions {
		names[i] = string(a)
	}
	return strings.Join(names, ", ")
}

// InteractiveSummary is one line saying whether Slack interactivity is
// on and through which transport, for `config check` and serve's start-up
// log. It never shows a secret.
func InteractiveSummary(c *config.Config) string {
	s := c.Alerts.Slack
	if !s.Interactive {
		return "Slack actions: off (alerts.slack.interactive: false)"
	}
	return fmt.Sprintf("Slack actions: on, %s; %d operator(s) may act", strings.Join(transports(c), " and "), len(s.Operators))
}

func transports(c *config.Config) []string {
	var t []string
	if c.Alerts.Slack.AppToken != "" {
		t = append(t, "Socket Mode (alerts.slack.app_token)")
	}
	if c.Alerts.Slack.SigningSecret != "" {
		t = append(t, "POST "+InteractionsPath+" on "+c.HTTP.Listen+" (alerts.slack.signing_secret)")
	}
	return t
}

// Interactivity is serve's side of Slack actions: the Handler, and the
// transports configured for it.
type Interactivity struct {
	Handler *interact.Handler
	// HTTP is the /slack/interactions endpoint; nil without a signing
	// secret.
	HTTP http.Handler
	// SocketMode is the Socket Mode transport; nil without an app token.
	SocketMode *interact.SocketMode
}

// BuildInteractivity builds what alerts.slack configures for Slack
// actions: nil when alerts.slack.interactive is off. windows is what "in
// flight" means per tool (the engine's Windows, as the CLI's resolve
// uses). The Slack client takes the bot token and alerts.slack.api_url;
// Socket Mode opens its connections there too.
func BuildInteractivity(c *config.Config, pool store.Pool, windows operator.Windows, logger *slog.Logger) (*Interactivity, error) {
	return buildInteractivity(c, interact.Config{Pool: pool, Windows: windows}, logger)
}

// BuildFleetInteractivity is BuildInteractivity for a serve process that
// keeps several ledgers: one Handler and one set of transports (the Slack
// app of top's alerts.slack, which every ledger's alerts go through) over
// every ledger. Each ledger's dispatcher names its ledger in its controls
// (alerts.Config.Ledger = LedgerTarget.Name), and an action acts on that
// ledger's Pool with its Windows only; a control naming another ledger, or
// none, changes nothing. The seen-set is kept in the first ledger by name.
// nil when alerts.slack.interactive is off.
func BuildFleetInteractivity(top *config.Config, ledgers []LedgerTarget, logger *slog.Logger) (*Interactivity, error) {
	if !top.Alerts.Slack.Interactive {
		return nil, nil
	}
	if len(ledgers) == 0 {
		return nil, top.ErrorAt("ledgers", "Slack actions need at least one ledger")
	}
	books := make(map[string]interact.Ledger, len(ledgers))
	for _, l := range ledgers {
		if err := alerts.CheckLedgerName(l.Name); err != nil {
			return nil, top.ErrorAt("ledgers", "%v", err)
		}
		if _, dup := books[l.Name]; dup {
			return nil, top.ErrorAt("ledgers."+l.Name, "ledger %s given twice", l.Name)
		}
		if l.Pool == nil {
			return nil, top.ErrorAt("ledgers."+l.Name, "ledger %s has no database pool", l.Name)
		}
		books[l.Name] = interact.Ledger{Pool: l.Pool, Windows: l.Windows}
	}
	return buildInteractivity(top, interact.Config{Ledgers: books}, logger)
}

// buildInteractivity builds the Handler over what base names (its Pool
// and Windows, or its Ledgers) with the rest of c's alerts.slack, and the
// transports.
func buildInteractivity(c *config.Config, base interact.Config, logger *slog.Logger) (*Interactivity, error) {
	s := c.Alerts.Slack
	if !s.Interactive {
		return nil, nil
	}
	api := cmp.Or(s.APIURL, slack.APIURL)
	httpClient := &http.Client{Timeout: cmp.Or(s.Timeout.D(), alerts.DefaultSlackTimeout)}
	ops := make(map[string]interact.Operator, len(s.Operators))
	for id, op := range s.Operators {
		o := interact.Operator{Name: op.Name}
		for _, a := range op.Actions {
			o.Actions = append(o.Actions, interact.Action(a))
		}
		ops[id] = o
	}
	cfg := base
	cfg.Slack = slack.New(s.Token.Reveal(), slack.OptionAPIURL(api), slack.OptionHTTPClient(httpClient))
	cfg.HTTPClient = httpClient
	cfg.Operators = ops
	cfg.Redactor = c.Redactor()
	cfg.Logger = logger
	h, err := interact.New(cfg)
	if err != nil {
		return nil, c.ErrorAt("alerts.slack", "%v", err)
	}
	in := &Interactivity{Handler: h}
	if s.SigningSecret != "" {
		in.HTTP = h.HTTPHandler(s.SigningSecret.Reveal())
	}
	if s.AppToken != "" {
		in.SocketMode, err = interact.NewSocketMode(h, interact.SocketModeConfig{
			AppToken:   s.AppToken.Reveal(),
			APIURL:     api,
			HTTPClient: httpClient,
			Logger:     logger,
		})
		if err != nil {
			return nil, c.ErrorAt("alerts.slack.app_token", "%v", err)
		}
	}
	return in, nil
}

// Routes are the HTTP routes Slack actions add to serve's listener.
func (in *Interactivity) Routes() map[string]http.Handler {
	if in == nil || in.HTTP == nil {
		return nil
	}
	return map[string]http.Handler{"POST " + InteractionsPath: in.HTTP}
}

// Services are the long-running parts Slack actions add to serve, in the
// order they stop: Socket Mode first (it finishes the interactions in
// hand), then the Handler (it sends their answers and updates, retried,
// within its stop grace). The listener shuts down after both: a request
// reaching /slack/interactions meanwhile is answered 503, nothing done.
func (in *Interactivity) Services() []Service {
	if in == nil {
		return nil
	}
	if in.SocketMode == nil {
		return []Service{in.Handler}
	}
	return []Service{in.SocketMode, in.Handler}
}

// LogAttrs describe the interactivity for serve's start-up line: the
// transports and the number of operators, never a secret.
func (in *Interactivity) LogAttrs(c *config.Config) []any {
	var names []string
	if in.SocketMode != nil {
		names = append(names, "socket_mode")
	}
	if in.HTTP != nil {
		names = append(names, "http "+InteractionsPath)
	}
	return []any{"transports", strings.Join(names, ", "), "operators", len(c.Alerts.Slack.Operators)}
}
