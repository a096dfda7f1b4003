// Package config decodes and locates ledgerkeeper's YAML configuration.
//
// Decoding is strict: an unknown key (with a did-you-mean), a value of the
// wrong type, a bad duration is an error that names the file, the line
// and the key path, and ParseAll reports every one in one run. `${VAR}` in
// a scalar expands from the environment (`$$` is a literal `$`); secrets
// may come from `*_file` twins instead. Secret values are of type Secret,
// which never prints its contents. Every value a ${VAR} expanded to in a
// text setting, every value read from a `*_file` twin and every Secret
// setting is registered in the configuration's Redactor, which every
// output goes through.
//
// Config is the file's layout. The sections a service reads whole are the
// service's own types (reconcile: reconcile.Config, self_check:
// reconcile.SelfCheckConfig, retention: expiry.Config), declaring each
// setting once with its default and bounds (internal/settings); the other
// sections are declared here the same way. internal/daemon.Settle applies
// the defaults and the checks and maps their refusals back to
// `file:line: key` with ErrorAt.
package config

import (
	"encoding/json"
	"fmt"
	"math"
	"net/netip"
	"net/url"
	"sort"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/robfig/cron/v3"

	"github.com/ledgerkeeper/ledgerkeeper/expiry"
	"github.com/ledgerkeeper/ledgerkeeper/internal/secret"
	"github.com/ledgerkeeper/ledgerkeeper/internal/settings"
	"github.com/ledgerkeeper/ledgerkeeper/reconcile"
)

// Config is the whole configuration file.
type Config struct {
	Database  Database                  `yaml:"database" json:"database"`
	Schedule  Schedule                  `yaml:"schedule" json:"schedule"`
	Reconcile reconcile.Config          `yaml:"reconcile" json:"reconcile"`
	Defaults  ToolDefaults              `yaml:"defaults" json:"defaults"`
	Tools     map[string]Tool           `yaml:"tools" json:"tools"`
	SelfCheck reconcile.SelfCheckConfig `yaml:"self_check" json:"self_check"`
	Retention expiry.Config             `yaml:"retention" json:"retention"`
	Alerts    Alerts                    `yaml:"alerts" json:"alerts"`
	HTTP      HTTP                      `yaml:"http" json:"http"`
	Console   Console                   `yaml:"console" json:"console"`
	Log       Log                       `yaml:"log" json:"log"`

	// File is where the configuration came from ("" for built-in defaults).
	File string `yaml:"-" json:"file,omitempty"`
	// lines maps a key path ("reconcile.grace") to its line in File.
	lines map[string]int
	// redactor holds every secret value of this configuration (see
	// Redactor in load.go); the ledgers' configurations share it.
	redactor *secret.Redactor
	// ledgers are the ledgers section's entries (ledgers.go).
	ledgers []Ledger
	// In a ledger's configuration: its name, the lines of its entry in
	// File, and whether it names its own database.
	ledgerName           string
	ledgerFrom, ledgerTo int
	ownURL               bool
}

// Database says where the ledger lives.
type Database struct {
	// URL is a PostgreSQL connection URL. Overridden by --database-url and
	// LEDGERKEEPER_DATABASE_URL.
	URL     Secret `yaml:"url" json:"url"`
	URLFile string `yaml:"url_file" json:"url_file,omitempty"`
	// MaxConns bounds the pool. Default: reconcile.concurrency + 4.
	MaxConns int `yaml:"max_conns" json:"max_conns" min:"0"`
	// Schema is the PostgreSQL schema the ledger's tables are in, written
	// into every statement (never left to search_path, so it holds behind
	// a transaction-mode pooler). Empty: the tables follow search_path,
	// as they always did. A ledgers.NAME entry sets it with schema.
	Schema string `yaml:"schema" json:"schema,omitempty"`
}

// Schedule holds robfig/cron specs for `serve`.
type Schedule struct {
	Reconcile string `yaml:"reconcile" json:"reconcile" default:"@every 30s"`
	Purge     string `yaml:"purge" json:"purge" default:"@every 1h"`
	Alerts    string `yaml:"alerts" json:"alerts" default:"@every 15s"`
}

// ProbeSelfCheck is one probe's self-check settings
// (tools.T.probe.self_check).
type ProbeSelfCheck struct {
	// Enabled: false acts on the probe's verdicts unchecked. Dangerous: a
	// probe broken on day one marks keys retryable whose effect happened.
	// Default true.
	Enabled *bool `yaml:"enabled" json:"enabled,omitempty"`
	// Canaries are effects known to exist downstream (a ticket kept for
	// the purpose): present-side witnesses the self-check probes besides
	// the keys the tool server completed, for a tool that completes few.
	// Each key is unique within the tool.
	Canaries []Canary `yaml:"canaries" json:"canaries,omitempty"`
	// RequireWitness: false applies not_found verdicts even when no sample
	// of the self-checks around them came back found. Dangerous: a probe
	// that finds nothing (a typo'd path answering 404) is then believed.
	// Default true.
	RequireWitness *bool `yaml:"require_witness" json:"require_witness,omitempty"`
}

// MaxCanaryKeyLen bounds a canary's key, as the ledger bounds an
// Idempotency-Key.
const MaxCanaryKeyLen = 128

// Canary is one tools.T.probe.self_check.canaries entry.
type Canary struct {
	// Key is the idempotency key as the probe addresses the effect.
	// Required, at most MaxCanaryKeyLen characters.
	Key string `yaml:"key" json:"key"`
	// Request is the request body the probe's {request.PATH} placeholders
	// (or sql args) read; a mapping, written as YAML. Optional.
	Request JSONObject `yaml:"request" json:"request,omitempty"`
}

// JSONObject is a YAML mapping held as the JSON object it denotes (a
// request body). ${VAR} expands in its scalars, as everywhere.
type JSONObject json.RawMessage

// MarshalJSON writes the object itself.
func (o JSONObject) MarshalJSON() ([]byte, error) {
	if len(o) == 0 {
		return []byte("null"), nil
	}
	return o, nil
}

// ToolDefaults apply to every tool that does not override them, and to keys
// of tools absent from `tools`.
type ToolDefaults struct {
	ProcessingWindow Duration `yaml:"processing_window" json:"processing_window"`
	// HeartbeatTimeout: a key whose heartbeat_at is younger is in flight.
	// Default: the processing window.
	HeartbeatTimeout Duration `yaml:"heartbeat_timeout" json:"heartbeat_timeout"`
}

// Tool is one tool's policy.
type Tool struct {
	ProcessingWindow Duration `yaml:"processing_window" json:"processing_window"`
	HeartbeatTimeout Duration `yaml:"heartbeat_timeout" json:"heartbeat_timeout"`
	// DownstreamDedupWindow is how long the downstream itself deduplicates
	// (Stripe: 24h). Past it, not_found escalates instead of marking the key
	// failed_retryable. Zero: no such horizon.
	DownstreamDedupWindow Duration `yaml:"downstream_dedup_window" json:"downstream_dedup_window"`
	// Concurrency bounds this tool's probes in flight. Default: the global
	// reconcile.concurrency.
	Concurrency int    `yaml:"concurrency" json:"concurrency" min:"0"`
	Probe       *Probe `yaml:"probe" json:"probe,omitempty"`
}

// Probe configures a built-in probe ("http" or "sql"), or names a probe
// registered from Go ("go").
type Probe struct {
	Type string `yaml:"type" json:"type"`
	// http
	URL          string            `yaml:"url" json:"url,omitempty"`
	Method       string            `yaml:"method" json:"method,omitempty"`
	Headers      map[string]Secret `yaml:"headers" json:"headers,omitempty"`
	HeadersFile  map[string]string `yaml:"headers_file" json:"headers_file,omitempty"`
	Match        string            `yaml:"match" json:"match,omitempty"`
	MaxBodyBytes int64             `yaml:"max_body_bytes" json:"max_body_bytes,omitempty"`
	// sql
	DatabaseURL     Secret   `yaml:"database_url" json:"database_url,omitempty"`
	DatabaseURLFile string   `yaml:"database_url_file" json:"database_url_file,omitempty"`
	Query           string   `yaml:"query" json:"query,omitempty"`
	Args            []string `yaml:"args" json:"args,omitempty"`
	// both
	Timeout      Duration          `yaml:"timeout" json:"timeout"`
	ResponseCode int               `yaml:"response_code" json:"response_code,omitempty"`
	ResponseBody map[string]string `yaml:"response_body" json:"response_body,omitempty"`
	// NotFoundBody (http) is what a 404's JSON body must say for the 404
	// to be absence, e.g. {path: error.code, equals: ticket_not_found}.
	// Both fields are required when the block is present.
	NotFoundBody *NotFoundBody `yaml:"not_found_body" json:"not_found_body,omitempty"`
	// NotFoundOn404 (http) is json (default: a 404 is absence only with a
	// JSON body) or any (every 404, even a router's error page; dangerous).
	NotFoundOn404 string `yaml:"not_found_on_404" json:"not_found_on_404,omitempty"`
	// SelfCheck tunes the self-check of this probe.
	SelfCheck ProbeSelfCheck `yaml:"self_check" json:"self_check"`
	// RateLimit bounds the probes one process sends to this downstream.
	// Absent: no limit.
	RateLimit *RateLimit `yaml:"rate_limit" json:"rate_limit,omitempty"`
}

// NotFoundBody is tools.T.probe.not_found_body: the member of a 404's
// JSON body that says the effect is absent.
type NotFoundBody struct {
	// Path is a dotted path into the body, e.g. error.code.
	Path string `yaml:"path" json:"path"`
	// Equals is what the member holds: a string equal to it, or a number
	// or boolean whose JSON text equals it.
	Equals string `yaml:"equals" json:"equals"`
}

// RateLimit is a probe's token bucket (tools.T.probe.rate_limit). It holds
// per process: N serve replicas send up to N times RPS, so divide the
// downstream's allowance by the replica count.
type RateLimit struct {
	// RPS is probes per second, > 0 (fractions allowed: 0.5 is one every
	// two seconds). Required in a rate_limit block.
	RPS float64 `yaml:"rps" json:"rps"`
	// Burst is how many probes may start at once after a quiet spell,
	// >= 1. Default 1.
	Burst int `yaml:"burst" json:"burst"`
}

// checkRateLimits refuses a rate limit the prober cannot keep: rps must be
// a finite number above zero (omit the block for no limit), burst at least
// 1 when set.
func (c *Config) checkRateLimits() Errors {
	var errs Errors
	for _, name := range c.ToolNames() {
		t := c.Tools[name]
		if t.Probe == nil || t.Probe.RateLimit == nil {
			continue
		}
		rl, base := t.Probe.RateLimit, "tools."+name+".probe.rate_limit"
		if !(rl.RPS > 0) || math.IsInf(rl.RPS, 0) {
			errs = append(errs, c.errAt(base+".rps", "must be a number of probes per second above 0, got %v (omit rate_limit for no limit)", rl.RPS))
		}
		if _, set := c.lines[base+".burst"]; rl.Burst < 0 || (set && rl.Burst == 0) {
			errs = append(errs, c.errAt(base+".burst", "must be at least 1, got %d", rl.Burst))
		}
	}
	return errs
}

// checkCanaries refuses a canary the self-check could not probe: a key
// that is missing, too long, or given twice within the tool.
func (c *Config) checkCanaries() Errors {
	var errs Errors
	for _, name := range c.ToolNames() {
		t := c.Tools[name]
		if t.Probe == nil {
			continue
		}
		seen := map[string]int{}
		for i, cn := range t.Probe.SelfCheck.Canaries {
			path := fmt.Sprintf("tools.%s.probe.self_check.canaries[%d].key", name, i)
			switch {
			case cn.Key == "":
				errs = append(errs, c.errAt(path, "required: the idempotency key of an effect known to exist downstream"))
			case utf8.RuneCountInString(cn.Key) > MaxCanaryKeyLen:
				errs = append(errs, c.errAt(path, "longer than %d characters", MaxCanaryKeyLen))
			default:
				if j, dup := seen[cn.Key]; dup {
					errs = append(errs, c.errAt(path, "key %q given twice (also canaries[%d])", cn.Key, j))
				} else {
					seen[cn.Key] = i
				}
			}
		}
	}
	return errs
}

// SelfCheckEnabled reports whether the probe's verdicts are vetted by the
// self-check (the default).
func (p *Probe) SelfCheckEnabled() bool { return p.SelfCheck.Enabled == nil || *p.SelfCheck.Enabled }

// WitnessRequired reports whether a not_found needs a sample seen found in
// the self-checks around it (the default).
func (p *Probe) WitnessRequired() bool {
	return p.SelfCheck.RequireWitness == nil || *p.SelfCheck.RequireWitness
}

// Alerts configures notification.
type Alerts struct {
	Slack Slack `yaml:"slack" json:"slack"`
	// RenotifyAfter: a key alerted for a reason is not alerted again for
	// the same reason sooner.
	RenotifyAfter Duration `yaml:"renotify_after" json:"renotify_after"`
	// MaxKeysPerMessage bounds the keys listed in one grouped message.
	MaxKeysPerMessage int `yaml:"max_keys_per_message" json:"max_keys_per_message" min:"0"`
	// RunbookURL is the base link of runbook.md, for per-reason sections.
	RunbookURL string `yaml:"runbook_url" json:"runbook_url,omitempty"`
}

// Slack is where alerts go: an incoming webhook, or a bot token + channel.
type Slack struct {
	WebhookURL     Secret `yaml:"webhook_url" json:"webhook_url"`
	WebhookURLFile string `yaml:"webhook_url_file" json:"webhook_url_file,omitempty"`
	Token          Secret `yaml:"token" json:"token"`
	TokenFile      string `yaml:"token_file" json:"token_file,omitempty"`
	Channel        string `yaml:"channel" json:"channel,omitempty"`
	// APIURL points the Web API client elsewhere (a proxy, a test server).
	// It must end in "/".
	APIURL string `yaml:"api_url" json:"api_url,omitempty"`
	// Timeout bounds one call to Slack. Default 10s.
	Timeout Duration `yaml:"timeout" json:"timeout"`

	// Interactive draws action buttons on alert messages and handles the
	// clicks (package interact). Default false: interactivity is off
	// unless configured. It needs Token (a webhook message cannot be
	// updated, and views.open takes a bot token), Operators, and a
	// transport: AppToken or SigningSecret.
	Interactive bool `yaml:"interactive" json:"interactive"`
	// AppToken is the app-level token (xapp-…, scope connections:write)
	// for Socket Mode: an outbound WebSocket, no public ingress. The
	// default transport when set.
	AppToken     Secret `yaml:"app_token" json:"app_token"`
	AppTokenFile string `yaml:"app_token_file" json:"app_token_file,omitempty"`
	// SigningSecret verifies requests to serve's POST /slack/interactions
	// (the app's Interactivity request URL).
	SigningSecret     Secret `yaml:"signing_secret" json:"signing_secret"`
	SigningSecretFile string `yaml:"signing_secret_file" json:"signing_secret_file,omitempty"`
	// Operators maps a Slack user ID (U012ABC) to the operator it is; only
	// they may act. In YAML either `U012ABC: alice` or `U012ABC: {name:
	// alice, actions: [inspect, hold]}`.
	Operators map[string]SlackOperator `yaml:"operators" json:"operators,omitempty"`
}

// SlackOperator is one Slack user allowed to act from an alert message.
// A plain scalar in YAML is the Name alone (every action allowed).
type SlackOperator struct {
	// Name is recorded in the audit beside the actor slack:<user id>.
	Name string `yaml:"name" json:"name"`
	// Actions limits what the user may do (inspect, hold, release,
	// mark_retryable, store_outcome). Empty: all of them.
	Actions []string `yaml:"actions" json:"actions,omitempty"`
}

// HTTP is the daemon's own listener.
type HTTP struct {
	Listen  string      `yaml:"listen" json:"listen" default:":9464"`
	Console HTTPConsole `yaml:"console" json:"console"`
}

// HTTPConsole says whether serve's listener serves the web console.
type HTTPConsole struct {
	// Enabled mounts the console at /ui/ on http.listen. Default true
	// (daemon.Settle fills it, so config check prints what is in force).
	Enabled *bool `yaml:"enabled" json:"enabled"`
}

// ConsoleEnabled reports whether serve mounts the console (the default).
func (h HTTP) ConsoleEnabled() bool { return h.Console.Enabled == nil || *h.Console.Enabled }

// Console is the web console's access (package console): who signs in and
// how, who may act, and where it is reached.
type Console struct {
	// Auth is basic (users and bcrypt hashes), proxy (a trusted header
	// from ProxyCIDRs) or none (loopback listeners only).
	Auth string `yaml:"auth" json:"auth" default:"basic" oneof:"basic proxy none"`
	// Users maps a user name to its bcrypt hash (auth basic); a value may
	// be ${VAR}.
	Users map[string]Secret `yaml:"users" json:"users,omitempty"`
	// UsersFile holds more users, one name:bcrypt-hash a line (htpasswd
	// -B's form).
	UsersFile string `yaml:"users_file" json:"users_file,omitempty"`
	// ProxyHeader names the user (auth proxy).
	ProxyHeader string `yaml:"proxy_header" json:"proxy_header" default:"X-Forwarded-User"`
	// ProxyCIDRs are the proxy's addresses: the header of any other peer
	// is not believed.
	ProxyCIDRs []string `yaml:"proxy_cidrs" json:"proxy_cidrs,omitempty"`
	// Operators maps a user to the actions it may take (hold, release,
	// mark_retryable, store_outcome, reconcile); an empty list is all of them.
	// Everyone else reads only.
	Operators map[string][]string `yaml:"operators" json:"operators,omitempty"`
	// PublicURL is where people reach the console (https://lk.example.com):
	// Slack alerts link to their keys' pages under it.
	PublicURL string `yaml:"public_url" json:"public_url,omitempty"`
	// Listen is `ledgerkeeper console`'s own address (serve uses
	// http.listen).
	Listen string `yaml:"listen" json:"listen" default:"127.0.0.1:9465"`
	// BulkLimit is the most keys one bulk action (hold, release, mark
	// retryable by filter) takes; a filter selecting more is refused.
	// The form carries every key and the acts run key by key in one
	// request, hence the maximum (console.MaxBulkLimit).
	BulkLimit int `yaml:"bulk_limit" json:"bulk_limit" default:"500" min:"1" max:"10000"`
}

// CheckSettings refuses console settings no request could pass: a proxy
// CIDR that does not parse, auth proxy without CIDRs, a public URL that is
// not http(s).
func (c *Console) CheckSettings(r *settings.Report) {
	for _, cidr := range c.ProxyCIDRs {
		if _, err := netip.ParsePrefix(cidr); err != nil {
			r.Field(&c.ProxyCIDRs, "%q is not a CIDR (like 10.0.0.0/8 or 192.0.2.7/32)", cidr)
		}
	}
	if c.Auth == "proxy" && len(c.ProxyCIDRs) == 0 {
		r.Field(&c.ProxyCIDRs, "required with auth proxy: the proxy's addresses (a header from anyone else is not believed)")
	}
	if u := c.PublicURL; u != "" {
		if pu, err := url.Parse(u); err != nil || (pu.Scheme != "http" && pu.Scheme != "https") || pu.Host == "" {
			r.Field(&c.PublicURL, "must be an http(s) URL (where people reach the console)")
		}
	}
}

// Log configures log/slog output on stderr.
type Log struct {
	// Level is the least level logged.
	Level string `yaml:"level" json:"level" default:"info" oneof:"debug info warn error"`
	// Format is text (logfmt) or json.
	Format string `yaml:"format" json:"format" default:"text" oneof:"text json"`
}

// ToolPolicy is the effective policy for one tool name, configured or not.
type ToolPolicy struct {
	Name                  string
	Configured            bool
	ProcessingWindow      time.Duration
	HeartbeatTimeout      time.Duration
	DownstreamDedupWindow time.Duration
	Concurrency           int
	Probe                 *Probe
	RetentionMinAge       time.Duration
}

// Policy returns the effective policy for tool: its own settings, or the
// defaults (and no probe) for a tool absent from `tools`. Its durations are
// the effective ones once daemon.Settle has filled the defaults.
func (c *Config) Policy(tool string) ToolPolicy {
	p := ToolPolicy{
		Name:             tool,
		ProcessingWindow: c.Defaults.ProcessingWindow.D(),
		HeartbeatTimeout: c.Defaults.HeartbeatTimeout.D(),
		Concurrency:      c.Reconcile.Concurrency,
		RetentionMinAge:  c.Retention.MinAge,
	}
	if t, ok := c.Tools[tool]; ok {
		p.Configured = true
		p.ProcessingWindow = t.ProcessingWindow.D()
		p.HeartbeatTimeout = t.HeartbeatTimeout.D()
		p.DownstreamDedupWindow = t.DownstreamDedupWindow.D()
		p.Concurrency = t.Concurrency
		p.Probe = t.Probe
	}
	if r, ok := c.Retention.Tools[tool]; ok && r.MinAge > 0 {
		p.RetentionMinAge = r.MinAge
	}
	return p
}

// ToolNames returns the configured tools, sorted.
func (c *Config) ToolNames() []string {
	names := make([]string, 0, len(c.Tools))
	for n := range c.Tools {
		names = append(names, n)
	}
	sort.Strings(names)
	return names
}

// Error is a configuration error at a place in a file.
type Error struct {
	File string
	Line int
	Path string
	Msg  string
}

func (e *Error) Error() string {
	var b strings.Builder
	if e.File != "" {
		b.WriteString(e.File)
		if e.Line > 0 {
			fmt.Fprintf(&b, ":%d", e.Line)
		}
		b.WriteString(": ")
	}
	if e.Path != "" {
		b.WriteString(e.Path)
		b.WriteString(": ")
	}
	b.WriteString(e.Msg)
	return b.String()
}

// Errors is every problem found in one file.
type Errors []*Error

func (es Errors) Error() string {
	parts := make([]string, len(es))
	for i, e := range es {
		parts[i] = e.Error()
	}
	return strings.Join(parts, "\n")
}

func (c *Config) errAt(path, format string, args ...any) *Error {
	line := c.lineOf(path)
	shown := path
	if c.ledgerName != "" {
		if c.own(line) {
			shown = c.ledgerPath(path)
		} else {
			shown = path + " (as ledger " + c.ledgerName + " inherits it)"
		}
	}
	return &Error{File: c.File, Line: line, Path: shown, Msg: fmt.Sprintf(format, args...)}
}

// lineOf returns the line of path, or of its nearest ancestor present.
func (c *Config) lineOf(path string) int {
	for p := path; p != ""; {
		if l, ok := c.lines[p]; ok {
			return l
		}
		i := strings.LastIndexByte(p, '.')
		if i < 0 {
			break
		}
		p = p[:i]
	}
	return 0
}

// CheckSettings refuses a schedule that robfig/cron cannot parse.
func (s *Schedule) CheckSettings(r *settings.Report) {
	parser := cron.NewParser(cron.Minute | cron.Hour | cron.Dom | cron.Month | cron.Dow | cron.Descriptor)
	for _, spec := range []*string{&s.Reconcile, &s.Purge, &s.Alerts} {
		if _, err := parser.Parse(*spec); err != nil {
			r.Field(spec, "bad cron spec %q: %v", *spec, err)
		}
	}
}

// CheckSettings refuses Slack settings no client can use: an API URL that
// is not http(s) or does not end in "/", a webhook URL that is not
// http(s), a bot token without a channel.
func (s *Slack) CheckSettings(r *settings.Report) {
	if u := s.APIURL; u != "" {
		if pu, err := url.Parse(u); err != nil || (pu.Scheme != "http" && pu.Scheme != "https") || pu.Host == "" {
			r.Field(&s.APIURL, "must be an http(s) URL")
		} else if !strings.HasSuffix(u, "/") {
			r.Field(&s.APIURL, "must end in \"/\" (slack-go appends the method name)")
		}
	}
	if s.Token != "" && s.Channel == "" {
		r.Field(&s.Channel, "required with %s", settings.Ref(&s.Token))
	}
	if w := s.WebhookURL; w != "" {
		if pu, err := url.Parse(w.Reveal()); err != nil || (pu.Scheme != "http" && pu.Scheme != "https") || pu.Host == "" {
			r.Field(&s.WebhookURL, "must be an http(s) URL")
		}
	}
}

// SortByLine orders errors by their line in the file, for reading.
func (es Errors) SortByLine() {
	sort.SliceStable(es, func(i, j int) bool { return es[i].Line < es[j].Line })
}

// ErrorAt builds an error at a key path of this configuration, with the
// key's line, for problems found after decoding: the services' validation
// (internal/daemon maps their field errors here) and building probes.
func (c *Config) ErrorAt(path, format string, args ...any) *Error {
	return c.errAt(path, format, args...)
}
