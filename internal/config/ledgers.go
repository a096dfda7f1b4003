package config

import (
	"errors"
	"fmt"
	"reflect"
	"regexp"
	"sort"

	"go.yaml.in/yaml/v3"

	"github.com/ledgerkeeper/ledgerkeeper/ledger"
)

// DefaultLedger names the one ledger of a configuration without a ledgers
// section.
const DefaultLedger = "default"

// Ledger is one ledger the process keeps: a schema of a database and the
// settings its services run with.
type Ledger struct {
	// Name is the ledger's key in the ledgers section (DefaultLedger
	// without one): it labels metrics, Slack messages and actions, audit
	// rows' actors and the console's URLs.
	Name string
	// Config is the ledger's whole configuration: the top level's settings
	// with the ledger's own over them. Its Database.Schema is the ledger's
	// schema ("": the tables follow search_path, as a single-ledger
	// deployment always had them).
	*Config
}

// LedgerSettings are the keys a ledgers.NAME entry may set. The others
// (http, console, log, alerts) belong to the process: one listener, one
// console, one Slack app serve every ledger.
var LedgerSettings = []string{"database_url", "database_url_file", "max_conns", "schema",
	"database", "schedule", "reconcile", "defaults", "tools", "self_check", "retention"}

var ledgerName = regexp.MustCompile(`^[a-z0-9][a-z0-9_-]{0,62}$`)

// Ledgers is every ledger of the configuration, sorted by name: those of
// the ledgers section, or one named DefaultLedger that is the whole
// configuration.
func (c *Config) Ledgers() []Ledger {
	if len(c.ledgers) == 0 {
		return []Ledger{{Name: DefaultLedger, Config: c}}
	}
	return c.ledgers
}

// LedgerName is the name of the ledger this configuration is the whole
// configuration of (a ledgers.NAME entry's), "" for the file's top level.
func (c *Config) LedgerName() string { return c.ledgerName }

// Fleet says whether the configuration has a ledgers section.
func (c *Config) Fleet() bool { return len(c.ledgers) > 0 }

// LedgerNames are the ledgers' names, sorted.
func (c *Config) LedgerNames() []string {
	var out []string
	for _, l := range c.Ledgers() {
		out = append(out, l.Name)
	}
	return out
}

// Ledger is the ledger named name, or an error that lists the ledgers
// (with the nearest name when it looks like a typo).
func (c *Config) Ledger(name string) (Ledger, error) {
	for _, l := range c.Ledgers() {
		if l.Name == name {
			return l, nil
		}
	}
	return Ledger{}, fmt.Errorf("no ledger %q in the configuration%s", name, suggest(name, c.LedgerNames()))
}

// decodeLedgers decodes the ledgers section n: each entry is the top
// level's mapping (root, without its ledgers key) with the entry's keys
// merged over it, decoded as a whole configuration. Errors inside an entry
// name its key path under ledgers.NAME.
func (c *Config) decodeLedgers(n, root *yaml.Node, env LookupEnv) Errors {
	var errs Errors
	fail := func(node *yaml.Node, path, format string, args ...any) {
		errs = append(errs, &Error{File: c.File, Line: node.Line, Path: path, Msg: fmt.Sprintf(format, args...)})
	}
	if n.Kind != yaml.MappingNode {
		fail(n, "ledgers", "must be a mapping of ledger name to its settings, got %s", kindName(n))
		return errs
	}
	if len(n.Content) == 0 {
		fail(n, "ledgers", "is empty: name at least one ledger, or leave the section out for one ledger")
		return errs
	}
	for i := 0; i+1 < len(n.Content); i += 2 {
		k, v := n.Content[i], n.Content[i+1]
		name := k.Value
		base := "ledgers." + name
		if !ledgerName.MatchString(name) {
			fail(k, base, "a ledger's name is lower-case letters, digits, '-' and '_', starting with a letter or digit, at most 63 characters (it appears in URLs and metric labels)")
			continue
		}
		if v.Kind != yaml.MappingNode {
			fail(v, base, "must be a mapping of settings, got %s", kindName(v))
			continue
		}
		over, ownURL, bad := ledgerOverlay(v, base, c.File)
		errs = append(errs, bad...)
		top := root
		if ownURL {
			// The top level's url or url_file is not this ledger's: drop
			// both before the ledger's own are merged in, so that setting
			// one of them here is not "both the value and its _file twin".
			rest, db := withoutKey(root, "database")
			if db != nil {
				db, _ = withoutKey(db, "url")
				db, _ = withoutKey(db, "url_file")
				rest.Content = append(rest.Content, &yaml.Node{Kind: yaml.ScalarNode, Tag: "!!str", Value: "database", Line: db.Line}, db)
			}
			top = rest
		}
		merged := mergeNodes(top, over)
		lc := &Config{File: c.File, lines: map[string]int{}, redactor: c.redactor, ledgerName: name,
			ledgerFrom: k.Line, ledgerTo: lastLine(v)}
		lenv := env
		if ownURL {
			// The ledger's own database is not the one of
			// $LEDGERKEEPER_DATABASE_URL, which is the top level's.
			lenv = func(key string) (string, bool) {
				if key == EnvDatabaseURL {
					return "", false
				}
				return env(key)
			}
		}
		d := &decoder{file: c.File, env: lenv, lines: lc.lines, red: c.redactor}
		d.decode(merged, reflect.ValueOf(lc).Elem(), "")
		for _, e := range d.errs {
			if lc.own(e.Line) {
				e.Path = lc.ledgerPath(e.Path)
				errs = append(errs, e)
			} // else: the top level's own error, reported once by its decode
		}
		lc.ownURL = ownURL
		if err := lc.finish(lenv); err != nil {
			var more Errors
			if errors.As(err, &more) {
				for _, e := range more {
					if lc.own(e.Line) {
						errs = append(errs, e)
					}
				}
			} else {
				errs = append(errs, &Error{File: c.File, Line: k.Line, Path: base, Msg: err.Error()})
			}
		}
		if lc.Database.Schema != "" {
			if err := ledger.CheckSchema(lc.Database.Schema); err != nil {
				errs = append(errs, lc.errAt("database.schema", "%v", err))
			}
		}
		c.ledgers = append(c.ledgers, Ledger{Name: name, Config: lc})
	}
	sort.Slice(c.ledgers, func(i, j int) bool { return c.ledgers[i].Name < c.ledgers[j].Name })
	errs = append(errs, c.checkLedgerPlaces()...)
	return errs
}

// checkLedgerPlaces refuses two ledgers in one schema of one database: they
// would reconcile, purge and alert on each other's keys.
func (c *Config) checkLedgerPlaces() Errors {
	var errs Errors
	seen := map[string]string{}
	for _, l := range c.ledgers {
		place := l.Database.URL.Reveal() + "\x00" + l.Database.Schema
		if other, ok := seen[place]; ok {
			schema := l.Database.Schema
			if schema == "" {
				schema = "the default schema"
			}
			errs = append(errs, l.errAt("database.schema", "ledgers %s and %s are in the same database and schema (%s): give each its own schema", other, l.Name, schema))
			continue
		}
		seen[place] = l.Name
	}
	return errs
}

// SetLedgerDatabaseURL applies --database-url to the ledgers that do not
// name their own database.
func (c *Config) setLedgersDatabaseURL(u string) {
	for _, l := range c.ledgers {
		if !l.ownURL {
			l.Database.URL = Secret(u)
		}
	}
}

// own says whether line is inside this ledger's entry.
func (c *Config) own(line int) bool {
	return c.ledgerName != "" && line >= c.ledgerFrom && line <= c.ledgerTo
}

// ledgerPath is path as written in the file: under ledgers.NAME for a key
// of the ledger's entry.
func (c *Config) ledgerPath(path string) string {
	if c.ledgerName == "" {
		return path
	}
	if path == "database.url" || path == "database.url_file" || path == "database.max_conns" || path == "database.schema" {
		return "ledgers." + c.ledgerName + "." + map[string]string{
			"database.url": "database_url", "database.url_file": "database_url_file",
			"database.max_conns": "max_conns", "database.schema": "schema"}[path]
	}
	return "ledgers." + c.ledgerName + "." + path
}

// ledgerOverlay turns a ledgers.NAME entry into the mapping merged over the
// top level: database_url, database_url_file, max_conns and schema go under
// database; the sections are kept; process-wide keys are refused.
func ledgerOverlay(v *yaml.Node, base, file string) (over *yaml.Node, ownURL bool, errs Errors) {
	over = &yaml.Node{Kind: yaml.MappingNode, Tag: "!!map", Line: v.Line}
	db := &yaml.Node{Kind: yaml.MappingNode, Tag: "!!map", Line: v.Line}
	for i := 0; i+1 < len(v.Content); i += 2 {
		k, val := v.Content[i], v.Content[i+1]
		switch k.Value {
		case "database_url", "database_url_file", "max_conns", "schema":
			key := map[string]string{"database_url": "url", "database_url_file": "url_file", "max_conns": "max_conns", "schema": "schema"}[k.Value]
			db.Content = append(db.Content, &yaml.Node{Kind: yaml.ScalarNode, Tag: "!!str", Value: key, Line: k.Line, Column: k.Column}, val)
			ownURL = ownURL || k.Value == "database_url" || k.Value == "database_url_file"
		case "database":
			if val.Kind == yaml.MappingNode {
				for j := 0; j+1 < len(val.Content); j += 2 {
					if kk := val.Content[j].Value; kk == "url" || kk == "url_file" {
						ownURL = true
					}
				}
				db.Content = append(db.Content, val.Content...)
				continue
			}
			over.Content = append(over.Content, k, val)
		case "schedule", "reconcile", "defaults", "tools", "self_check", "retention":
			over.Content = append(over.Content, k, val)
		case "http", "console", "log", "alerts", "ledgers":
			errs = append(errs, &Error{File: file, Line: k.Line, Path: base + "." + k.Value,
				Msg: "belongs to the process, not to one ledger (one listener, console and Slack app serve every ledger): set it at the top level"})
		default:
			errs = append(errs, &Error{File: file, Line: k.Line, Path: base + "." + k.Value,
				Msg: "unknown ledger setting" + suggest(k.Value, LedgerSettings)})
		}
	}
	if len(db.Content) > 0 {
		over.Content = append(over.Content, &yaml.Node{Kind: yaml.ScalarNode, Tag: "!!str", Value: "database", Line: v.Line}, db)
	}
	return over, ownURL, errs
}

// mergeNodes is base with over's keys over it: a key in both whose values
// are mappings is merged the same way, any other value of over replaces
// base's. Neither node is changed.
func mergeNodes(base, over *yaml.Node) *yaml.Node {
	if base == nil || base.Kind != yaml.MappingNode || over.Kind != yaml.MappingNode {
		return over
	}
	out := &yaml.Node{Kind: yaml.MappingNode, Tag: base.Tag, Line: base.Line, Column: base.Column}
	out.Content = append(out.Content, base.Content...)
	for i := 0; i+1 < len(over.Content); i += 2 {
		k, v := over.Content[i], over.Content[i+1]
		found := false
		for j := 0; j+1 < len(out.Content); j += 2 {
			if out.Content[j].Value == k.Value {
				out.Content[j+1] = mergeNodes(out.Content[j+1], v)
				found = true
				break
			}
		}
		if !found {
			out.Content = append(out.Content, k, v)
		}
	}
	return out
}

// lastLine is the last line n spans.
func lastLine(n *yaml.Node) int {
	last := n.Line
	for _, c := range n.Content {
		if l := lastLine(c); l > last {
			last = l
		}
	}
	return last
}

// withoutKey is mapping n without key (nil if n is not a mapping), and
// key's value node (nil when absent).
func withoutKey(n *yaml.Node, key string) (rest, val *yaml.Node) {
	if n == nil || n.Kind != yaml.MappingNode {
		return n, nil
	}
	rest = &yaml.Node{Kind: n.Kind, Tag: n.Tag, Line: n.Line, Column: n.Column}
	for i := 0; i+1 < len(n.Content); i += 2 {
		if n.Content[i].Value == key {
			val = n.Content[i+1]
			continue
		}
		rest.Content = append(rest.Content, n.Content[i], n.Content[i+1])
	}
	return rest, val
}
