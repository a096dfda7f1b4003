package config

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"net/url"
	"os"
	"reflect"
	"strconv"
	"strings"
	"time"

	"go.yaml.in/yaml/v3"

	"github.com/ledgerkeeper/ledgerkeeper/internal/secret"
)

// EnvDatabaseURL overrides database.url.
const EnvDatabaseURL = "LEDGERKEEPER_DATABASE_URL"

// Duration is a time.Duration written as "30s", "2m", "24h".
type Duration time.Duration

// UnmarshalText reads "30s", "2m", "24h" (a `default` tag's text).
func (d *Duration) UnmarshalText(b []byte) error {
	v, err := time.ParseDuration(string(b))
	*d = Duration(v)
	return err
}

// D returns the time.Duration.
func (d Duration) D() time.Duration { return time.Duration(d) }

func (d Duration) String() string { return time.Duration(d).String() }

// MarshalJSON writes the duration as a string.
func (d Duration) MarshalJSON() ([]byte, error) { return json.Marshal(d.String()) }

// Secret is a string that never prints its contents: fmt, slog and JSON
// all see secret.Mask ("[redacted]"), the mask every other output uses for
// a registered secret. Reveal returns the value for the one place that
// needs it.
type Secret string

// Reveal returns the secret's value.
func (s Secret) Reveal() string { return string(s) }

// String masks the value.
func (s Secret) String() string {
	if s == "" {
		return ""
	}
	return secret.Mask
}

// MarshalJSON masks the value.
func (s Secret) MarshalJSON() ([]byte, error) { return json.Marshal(s.String()) }

// Format masks the value for every fmt verb, %#v included.
func (s Secret) Format(f fmt.State, _ rune) { _, _ = io.WriteString(f, s.String()) }

// LookupEnv reads the environment; tests substitute their own.
type LookupEnv func(string) (string, bool)

// Redactor returns the redactor that holds every secret of this
// configuration: each value a ${VAR} expanded to (wherever it stands: a
// token inside a probe URL's query counts), each value read from a *_file
// twin, each Secret-typed setting (database and probe URLs, Slack webhook,
// bot token, app-level token and signing secret, header values, with their
// passwords and words), and the database URL given by flag or environment.
// Every output (logs, errors, audit evidence, Slack, `config check`,
// `--json`) goes through it. It is never nil.
func (c *Config) Redactor() *secret.Redactor {
	if c.redactor == nil {
		c.redactor = secret.New()
	}
	return c.redactor
}

// Default returns the built-in configuration (no file), with env applied.
func Default(env LookupEnv) (*Config, error) {
	c := &Config{redactor: secret.New()}
	if err := c.finish(env); err != nil {
		return nil, err
	}
	return c, nil
}

// Load reads, expands and decodes a file. Defaults and validation are
// daemon.Settle's.
func Load(path string, env LookupEnv) (*Config, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, &Error{File: path, Msg: fmt.Sprintf("cannot read: %v", err)}
	}
	return Parse(path, data, env)
}

// Parse is Load for bytes already read; file names them in errors.
func Parse(file string, data []byte, env LookupEnv) (*Config, error) {
	c, err := ParseAll(file, data, env)
	if err != nil {
		return nil, err
	}
	return c, nil
}

// LoadAll is Load that keeps going after errors in the file's structure;
// see ParseAll.
func LoadAll(path string, env LookupEnv) (*Config, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, &Error{File: path, Msg: fmt.Sprintf("cannot read: %v", err)}
	}
	return ParseAll(path, data, env)
}

// ParseAll is Parse that does not stop at errors in the file's structure
// (unknown keys, wrong types, bad durations, unreadable secret files): it
// returns them all (Errors) together with the configuration decoded so
// far, every key in error left at its zero value and every secret found
// registered with its Redactor, so that the caller can run the semantic
// checks too and report every error in one run. The configuration is nil
// only when the file is not YAML at all.
func ParseAll(file string, data []byte, env LookupEnv) (*Config, error) {
	if env == nil {
		env = os.LookupEnv
	}
	c := &Config{File: file, lines: map[string]int{}, redactor: secret.New()}
	var root yaml.Node
	dec := yaml.NewDecoder(bytes.NewReader(data))
	if err := dec.Decode(&root); err != nil && !errors.Is(err, io.EOF) {
		return nil, &Error{File: file, Line: yamlErrLine(err), Msg: "invalid YAML: " + strings.TrimPrefix(err.Error(), "yaml: ")}
	}
	var errs Errors
	var ledgersNode, top *yaml.Node
	if root.Kind == yaml.DocumentNode && len(root.Content) == 1 {
		// The ledgers section is decoded per ledger, each entry over the
		// rest of the file (ledgers.go).
		top, ledgersNode = withoutKey(root.Content[0], "ledgers")
		d := &decoder{file: file, env: env, lines: c.lines, red: c.redactor}
		d.decode(top, reflect.ValueOf(c).Elem(), "")
		errs = append(errs, d.errs...)
	}
	if err := c.finish(env); err != nil {
		var more Errors
		if !errors.As(err, &more) {
			return nil, err
		}
		errs = append(errs, more...)
	}
	if ledgersNode != nil {
		c.lines["ledgers"] = ledgersNode.Line
		errs = append(errs, c.decodeLedgers(ledgersNode, top, env)...)
	}
	if len(errs) > 0 {
		errs.SortByLine()
		return c, errs
	}
	return c, nil
}

// finish applies env overrides, reads *_file secrets and registers them.
func (c *Config) finish(env LookupEnv) error {
	if env == nil {
		env = os.LookupEnv
	}
	red := c.Redactor()
	if v, ok := env(EnvDatabaseURL); ok && v != "" {
		c.Database.URL = Secret(v)
	}
	var errs Errors
	readSecret := func(path string, file string, dst *Secret) {
		if file == "" {
			return
		}
		if *dst != "" {
			errs = append(errs, c.errAt(path, "set both the value and its _file twin: choose one"))
			return
		}
		b, err := os.ReadFile(file)
		if err != nil {
			errs = append(errs, c.errAt(path, "cannot read secret file: %v", err))
			return
		}
		*dst = Secret(strings.TrimRight(string(b), "\r\n"))
		red.Register(dst.Reveal())
	}
	readSecret("database.url_file", c.Database.URLFile, &c.Database.URL)
	readSecret("alerts.slack.webhook_url_file", c.Alerts.Slack.WebhookURLFile, &c.Alerts.Slack.WebhookURL)
	readSecret("alerts.slack.token_file", c.Alerts.Slack.TokenFile, &c.Alerts.Slack.Token)
	readSecret("alerts.slack.app_token_file", c.Alerts.Slack.AppTokenFile, &c.Alerts.Slack.AppToken)
	readSecret("alerts.slack.signing_secret_file", c.Alerts.Slack.SigningSecretFile, &c.Alerts.Slack.SigningSecret)
	for name, t := range c.Tools {
		if t.Probe == nil {
			continue
		}
		base := "tools." + name + ".probe."
		readSecret(base+"database_url_file", t.Probe.DatabaseURLFile, &t.Probe.DatabaseURL)
		for h, f := range t.Probe.HeadersFile {
			if t.Probe.Headers == nil {
				t.Probe.Headers = map[string]Secret{}
			}
			v := t.Probe.Headers[h]
			readSecret(base+"headers_file."+h, f, &v)
			t.Probe.Headers[h] = v
		}
	}
	// Registered even when something else is wrong: the caller may still
	// print errors that quote them (ParseAll).
	c.registerSecrets()
	errs = append(errs, c.checkRateLimits()...)
	errs = append(errs, c.checkCanaries()...)
	if len(errs) > 0 {
		return errs
	}
	return nil
}

// registerSecrets registers every Secret-typed setting, literal or not: a
// secret written into the file itself is no less a secret. A header value
// also registers its words long enough to be a credential ("Bearer
// abc123…": the token alone may be quoted by a downstream).
func (c *Config) registerSecrets() {
	red := c.Redactor()
	s := c.Alerts.Slack
	red.Register(c.Database.URL.Reveal(), s.WebhookURL.Reveal(), s.Token.Reveal(), s.AppToken.Reveal(), s.SigningSecret.Reveal())
	if u, err := url.Parse(c.Alerts.Slack.WebhookURL.Reveal()); err == nil && len(u.Path) >= 16 {
		// The path is the webhook's secret, whatever host prints it, and
		// its last long segment is the token itself.
		red.Register(u.Path)
		for _, seg := range strings.Split(u.Path, "/") {
			if len(seg) >= 12 {
				red.Register(seg)
			}
		}
	}
	for _, t := range c.Tools {
		if t.Probe == nil {
			continue
		}
		red.Register(t.Probe.DatabaseURL.Reveal())
		for _, v := range t.Probe.Headers {
			red.Register(v.Reveal())
			for _, w := range strings.FieldsFunc(v.Reveal(), func(r rune) bool { return r == ' ' || r == ',' || r == ';' || r == '=' }) {
				if len(w) >= 8 {
					red.Register(w)
				}
			}
		}
	}
}

// SetDatabaseURL applies the --database-url flag (highest precedence).
func (c *Config) SetDatabaseURL(u string) {
	if u != "" {
		c.Database.URL = Secret(u)
		c.Redactor().Register(u)
		c.setLedgersDatabaseURL(u)
	}
}

func yamlErrLine(err error) int {
	s := err.Error()
	if i := strings.Index(s, "line "); i >= 0 {
		rest := s[i+5:]
		j := 0
		for j < len(rest) && rest[j] >= '0' && rest[j] <= '9' {
			j++
		}
		n, _ := strconv.Atoi(rest[:j])
		return n
	}
	return 0
}

// decoder maps a yaml.Node tree onto Go values by their yaml tags. It exists
// instead of yaml's own Decode so that every error names the key path and
// line, unknown keys are errors, and ${VAR} expands in scalars only (never
// in the YAML text, so a secret cannot change the document's structure).
type decoder struct {
	file  string
	env   LookupEnv
	lines map[string]int
	errs  Errors
	// red receives every value a ${VAR} expanded to in a text setting.
	red *secret.Redactor
}

var (
	durationType      = reflect.TypeOf(Duration(0))
	timeDurationType  = reflect.TypeOf(time.Duration(0))
	slackOperatorType = reflect.TypeOf(SlackOperator{})
	jsonObjectType    = reflect.TypeOf(JSONObject(nil))
)

func (d *decoder) fail(n *yaml.Node, path, format string, args ...any) {
	d.errs = append(d.errs, &Error{File: d.file, Line: n.Line, Path: path, Msg: fmt.Sprintf(format, args...)})
}

func join(base, key string) string {
	if base == "" {
		return key
	}
	return base + "." + key
}

func (d *decoder) decode(n *yaml.Node, v reflect.Value, path string) {
	if _, ok := d.lines[path]; !ok && path != "" {
		d.lines[path] = n.Line
	}
	if n.Kind == yaml.AliasNode {
		n = n.Alias
	}
	if n.Kind == yaml.ScalarNode && n.Tag == "!!null" {
		return // key present without a value: keep the default
	}
	if v.Type() == slackOperatorType && n.Kind == yaml.ScalarNode {
		// The shorthand `U012ABC: alice`: the name, every action allowed.
		d.lines[path+".name"] = n.Line
		d.scalar(n, v.FieldByName("Name"), path+".name")
		return
	}
	if v.Type() == jsonObjectType {
		d.jsonObject(n, v, path)
		return
	}
	switch v.Kind() {
	case reflect.Pointer:
		if v.IsNil() {
			v.Set(reflect.New(v.Type().Elem()))
		}
		d.decode(n, v.Elem(), path)
	case reflect.Struct:
		if n.Kind != yaml.MappingNode {
			d.fail(n, path, "expected a mapping, got %s", kindName(n))
			return
		}
		fields := map[string]reflect.Value{}
		var names []string
		for i := 0; i < v.NumField(); i++ {
			tag := strings.Split(v.Type().Field(i).Tag.Get("yaml"), ",")[0]
			if tag == "" || tag == "-" {
				continue
			}
			fields[tag] = v.Field(i)
			names = append(names, tag)
		}
		seen := map[string]bool{}
		for i := 0; i+1 < len(n.Content); i += 2 {
			k, val := n.Content[i], n.Content[i+1]
			p := join(path, k.Value)
			f, ok := fields[k.Value]
			if !ok {
				d.fail(k, p, "unknown key%s", suggest(k.Value, names))
				continue
			}
			if seen[k.Value] {
				d.fail(k, p, "key given twice")
				continue
			}
			seen[k.Value] = true
			d.lines[p] = k.Line
			d.decode(val, f, p)
		}
	case reflect.Map:
		if n.Kind != yaml.MappingNode {
			d.fail(n, path, "expected a mapping, got %s", kindName(n))
			return
		}
		if v.IsNil() {
			v.Set(reflect.MakeMap(v.Type()))
		}
		for i := 0; i+1 < len(n.Content); i += 2 {
			k, val := n.Content[i], n.Content[i+1]
			p := join(path, k.Value)
			if k.Value == "" {
				d.fail(k, p, "empty key")
				continue
			}
			if v.MapIndex(reflect.ValueOf(k.Value)).IsValid() {
				d.fail(k, p, "key given twice")
				continue
			}
			elem := reflect.New(v.Type().Elem()).Elem()
			d.lines[p] = k.Line
			d.decode(val, elem, p)
			v.SetMapIndex(reflect.ValueOf(k.Value), elem)
		}
	case reflect.Slice:
		if n.Kind != yaml.SequenceNode {
			d.fail(n, path, "expected a list, got %s", kindName(n))
			return
		}
		s := reflect.MakeSlice(v.Type(), len(n.Content), len(n.Content))
		for i, item := range n.Content {
			d.decode(item, s.Index(i), fmt.Sprintf("%s[%d]", path, i))
		}
		v.Set(s)
	default:
		d.scalar(n, v, path)
	}
}

func (d *decoder) scalar(n *yaml.Node, v reflect.Value, path string) {
	if n.Kind != yaml.ScalarNode {
		d.fail(n, path, "expected a single value, got %s", kindName(n))
		return
	}
	raw, vals, err := expand(n.Value, d.env)
	if err != nil {
		d.fail(n, path, "%v", err)
		return
	}
	// shown is the value an error may quote: never an expanded one (the
	// variable may hold a secret set in the wrong place).
	shown := fmt.Sprintf("%q", raw)
	if len(vals) > 0 {
		shown = fmt.Sprintf("%q (as expanded from the environment)", n.Value)
	}
	if v.Type() == durationType || v.Type() == timeDurationType {
		dur, err := time.ParseDuration(raw)
		if err != nil || dur < 0 {
			d.fail(n, path, "bad duration %s (want e.g. 30s, 5m, 24h)", shown)
			return
		}
		v.SetInt(int64(dur))
		return
	}
	switch v.Kind() {
	case reflect.String:
		// Text settings register what ${VAR} put in them, wherever they
		// stand (a token in a probe URL's query); numbers, booleans and
		// durations are not secrets, and masking "30" everywhere would
		// ruin every output.
		d.red.Register(vals...)
		v.SetString(raw)
	case reflect.Int, reflect.Int64:
		i, err := strconv.ParseInt(raw, 10, 64)
		if err != nil {
			d.fail(n, path, "expected an integer, got %s", shown)
			return
		}
		v.SetInt(i)
	case reflect.Float64:
		f, err := strconv.ParseFloat(raw, 64)
		if err != nil {
			d.fail(n, path, "expected a number, got %s", shown)
			return
		}
		v.SetFloat(f)
	case reflect.Bool:
		b, err := strconv.ParseBool(raw)
		if err != nil {
			d.fail(n, path, "expected true or false, got %s", shown)
			return
		}
		v.SetBool(b)
	default:
		panic(fmt.Sprintf("config: unsupported field type %s at %s", v.Type(), path))
	}
}

// jsonObject decodes a mapping into the JSON object it denotes. Scalars
// keep their YAML types (a quoted "12" stays a string); ${VAR} expands in
// them as in any scalar, the result staying a string.
func (d *decoder) jsonObject(n *yaml.Node, v reflect.Value, path string) {
	if n.Kind != yaml.MappingNode {
		d.fail(n, path, "expected a mapping (a JSON object), got %s", kindName(n))
		return
	}
	doc, ok := d.jsonValue(n, path)
	if !ok {
		return
	}
	b, err := json.Marshal(doc)
	if err != nil {
		d.fail(n, path, "cannot be written as JSON: %v", err)
		return
	}
	v.SetBytes(b)
}

// jsonValue converts a YAML node to what encoding/json writes; ok is false
// after an error was recorded.
func (d *decoder) jsonValue(n *yaml.Node, path string) (any, bool) {
	if n.Kind == yaml.AliasNode {
		n = n.Alias
	}
	switch n.Kind {
	case yaml.MappingNode:
		m := make(map[string]any, len(n.Content)/2)
		ok := true
		for i := 0; i+1 < len(n.Content); i += 2 {
			k, val := n.Content[i], n.Content[i+1]
			p := join(path, k.Value)
			if k.Kind != yaml.ScalarNode || k.ShortTag() == "!!merge" {
				d.fail(k, p, "a member name must be a plain string")
				ok = false
				continue
			}
			if _, dup := m[k.Value]; dup {
				d.fail(k, p, "key given twice")
				ok = false
				continue
			}
			x, good := d.jsonValue(val, p)
			m[k.Value], ok = x, ok && good
		}
		return m, ok
	case yaml.SequenceNode:
		s := make([]any, len(n.Content))
		ok := true
		for i, item := range n.Content {
			x, good := d.jsonValue(item, fmt.Sprintf("%s[%d]", path, i))
			s[i], ok = x, ok && good
		}
		return s, ok
	}
	raw, vals, err := expand(n.Value, d.env)
	if err != nil {
		d.fail(n, path, "%v", err)
		return nil, false
	}
	switch n.ShortTag() {
	case "!!null":
		return nil, true
	case "!!bool", "!!int", "!!float":
		var x any
		if err := n.Decode(&x); err != nil {
			d.fail(n, path, "%v", err)
			return nil, false
		}
		if f, isFloat := x.(float64); isFloat && (math.IsInf(f, 0) || math.IsNaN(f)) {
			d.fail(n, path, "%s is not a JSON number", n.Value)
			return nil, false
		}
		return x, true
	}
	d.red.Register(vals...)
	return raw, true
}

func kindName(n *yaml.Node) string {
	switch n.Kind {
	case yaml.MappingNode:
		return "a mapping"
	case yaml.SequenceNode:
		return "a list"
	default:
		return fmt.Sprintf("%q", n.Value)
	}
}

// expand replaces ${VAR} with the variable's value; $$ is a literal $. An
// unset variable is an error (naming the variable, never a value). vals
// are the values substituted, for the redactor.
func expand(s string, env LookupEnv) (out string, vals []string, err error) {
	if !strings.Contains(s, "$") {
		return s, nil, nil
	}
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		if s[i] != '$' {
			b.WriteByte(s[i])
			continue
		}
		if i+1 < len(s) && s[i+1] == '$' {
			b.WriteByte('$')
			i++
			continue
		}
		if i+1 < len(s) && s[i+1] == '{' {
			end := strings.IndexByte(s[i+2:], '}')
			if end < 0 {
				return "", nil, fmt.Errorf("unterminated ${ in value")
			}
			name := s[i+2 : i+2+end]
			if name == "" {
				return "", nil, fmt.Errorf("empty ${} in value")
			}
			val, ok := env(name)
			if !ok {
				return "", nil, fmt.Errorf("environment variable %s is not set", name)
			}
			b.WriteString(val)
			vals = append(vals, val)
			i += 2 + end
			continue
		}
		b.WriteByte('$')
	}
	return b.String(), vals, nil
}

// suggest proposes the closest known key, for typos.
func suggest(got string, known []string) string {
	best, bestD := "", 3
	for _, k := range known {
		if dd := distance(got, k); dd < bestD {
			best, bestD = k, dd
		}
	}
	if best == "" {
		return " (known: " + strings.Join(known, ", ") + ")"
	}
	return fmt.Sprintf(" (did you mean %q?)", best)
}

func distance(a, b string) int {
	prev := make([]int, len(b)+1)
	cur := make([]int, len(b)+1)
	for j := range prev {
		prev[j] = j
	}
	for i := 1; i <= len(a); i++ {
		cur[0] = i
		for j := 1; j <= len(b); j++ {
			cost := 1
			if a[i-1] == b[j-1] {
				cost = 0
			}
			cur[j] = min(prev[j]+1, cur[j-1]+1, prev[j-1]+cost)
		}
		prev, cur = cur, prev
	}
	return prev[len(b)]
}
