package daemon

import (
	"encoding/json"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/ledgerkeeper/ledgerkeeper/internal/config"
	"github.com/ledgerkeeper/ledgerkeeper/reconcile"
)

func envOf(m map[string]string) config.LookupEnv {
	return func(k string) (string, bool) { v, ok := m[k]; return v, ok }
}

// settle is what every command does with a file: decode (config), then
// Settle (the services' defaults and validation).
func settle(t *testing.T, yaml string, env config.LookupEnv) (*config.Config, error) {
	t.Helper()
	c, err := config.Parse("lk.yaml", []byte(yaml), env)
	if err != nil {
		return nil, err
	}
	return c, Settle(c)
}

const full = `database:
  url: ${DB}
schedule:
  reconcile: "@every 30s"
  purge: "@every 1h"
reconcile:
  grace: 10s
  batch_size: 100
  concurrency: 16
  lease: 2m
  alert_after_attempts: 3
  confirm_not_found_after: 0s
defaults:
  processing_window: 30s
tools:
  create_ticket:
    processing_window: 12s
    probe:
      type: http
      url: "http://tickets.internal/v1/tickets?idempotency_key={key}"
      headers: {Authorization: "Bearer ${TICKETS_TOKEN}"}
      timeout: 3s
      match: "data"
      response_code: 201
      response_body: {ticket_id: "id", created_at: "created_at"}
  charge_card:
    processing_window: 20s
    probe:
      type: sql
      database_url: ${PAYMENTS_DATABASE_URL}
      query: "SELECT id AS charge_id, amount_cents FROM charges WHERE idempotency_key = $$1"
      args: [key]
      response_code: 200
retention:
  min_age: 24h
  batch_size: 5000
alerts:
  slack:
    webhook_url: ${SLACK_WEBHOOK_URL}
    channel: "#idempotency-oncall"
  renotify_after: 4h
http:
  listen: ":9464"
`

var fullEnv = envOf(map[string]string{
	"DB":                    "postgres://lk:hunter2@db:5432/lk",
	"TICKETS_TOKEN":         "tok-secret",
	"PAYMENTS_DATABASE_URL": "postgres://pay:pw@pay/pay",
	"SLACK_WEBHOOK_URL":     "https://hooks.slack.com/services/T/B/X",
})

// TestParseDecodesWithoutDefaults: config decodes what the file says and
// nothing more; a zero setting is left for daemon.Settle to fill from the
// services (internal/daemon's TestSettleFull covers the whole file).
func TestSettleFull(t *testing.T) {
	c, err := settle(t, full, fullEnv)
	if err != nil {
		t.Fatalf("parse: %v", err)
	}
	if got := c.Database.URL.Reveal(); got != "postgres://lk:hunter2@db:5432/lk" {
		t.Fatalf("database url = %q", got)
	}
	ct := c.Policy("create_ticket")
	if ct.ProcessingWindow != 12*time.Second || ct.HeartbeatTimeout != 12*time.Second || ct.Probe.Timeout.D() != 3*time.Second {
		t.Fatalf("create_ticket policy = %+v", ct)
	}
	// What is in force is printed: the self-check's switches, the body
	// limit.
	if sc := ct.Probe.SelfCheck; sc.Enabled == nil || !*sc.Enabled || sc.RequireWitness == nil || !*sc.RequireWitness || ct.Probe.MaxBodyBytes != 1<<20 {
		t.Fatalf("create_ticket probe defaults: self_check %+v, max_body_bytes %d", sc, ct.Probe.MaxBodyBytes)
	}
	if got := ct.Probe.Headers["Authorization"].Reveal(); got != "Bearer tok-secret" {
		t.Fatalf("header = %q", got)
	}
	if q := c.Tools["charge_card"].Probe.Query; !strings.Contains(q, "= $1") {
		t.Fatalf("$$ should be a literal $: %q", q)
	}
	other := c.Policy("provision_vm")
	if other.Configured || other.Probe != nil || other.ProcessingWindow != 30*time.Second {
		t.Fatalf("unconfigured tool policy = %+v", other)
	}
	if c.Retention.BatchSize != 5000 || c.Reconcile.Lease != 2*time.Minute || c.Schedule.Alerts != "@every 15s" {
		t.Fatalf("values/defaults wrong: %+v", c)
	}
	// Secrets never print.
	b, _ := json.Marshal(c)
	for _, s := range []string{"hunter2", "tok-secret", "pw@pay", "hooks.slack.com"} {
		if strings.Contains(string(b), s) || strings.Contains(fmt.Sprintf("%v %+v %#v", c, c, c), s) {
			t.Fatalf("secret %q printed", s)
		}
	}
}

// TestSettleErrors: each service's refusal comes back as file:line: key.
// The decoding errors are internal/config's TestParseErrors.
func TestSettleErrors(t *testing.T) {
	tests := []struct {
		name string
		yaml string
		want string // substring of the error, including file:line
	}{
		{"unknown probe type", "tools:\n  t:\n    probe:\n      type: grpc\n", `lk.yaml:4: tools.t.probe.type: unknown probe type "grpc"`},
		{"missing probe type", "tools:\n  t:\n    probe:\n      url: http://x/\n", `lk.yaml:3: tools.t.probe.type: required`},
		{"http without url", "tools:\n  t:\n    probe:\n      type: http\n", `lk.yaml:3: tools.t.probe.url: required`},
		{"sql without query", "tools:\n  t:\n    probe:\n      type: sql\n      database_url: postgres://x/y\n", `tools.t.probe.query: required`},
		{"sql bad arg", "tools:\n  t:\n    probe:\n      type: sql\n      database_url: postgres://x/y\n      query: select 1\n      args: [key, secret]\n", `lk.yaml:7: tools.t.probe.args[1]: must be key, tool or request.PATH`},
		{"templated host", "tools:\n  t:\n    probe:\n      type: http\n      url: \"http://{key}.example/\"\n", `lk.yaml:5: tools.t.probe.url: host "{key}.example" must be literal`},
		{"floor under window", "tools:\n  t:\n    processing_window: 2h\nretention:\n  min_age: 1h\n", `lk.yaml:5: retention.min_age: retention floor 1h0m0s is shorter than tool t's processing window`},
		{"api url without slash", "alerts:\n  slack:\n    token: x\n    channel: c\n    api_url: http://127.0.0.1:1/api\n", `lk.yaml:5: alerts.slack.api_url: must end in "/"`},
		{"token without channel", "alerts:\n  slack:\n    token: x\n", `alerts.slack.channel: required`},
		{"jsonpath match", "tools:\n  t:\n    probe:\n      type: http\n      url: http://x/{key}\n      match: \"$.data\"\n", `lk.yaml:6: tools.t.probe.match: "$.data" looks like JSONPath (it has a '$', '[' or ']'); paths here are dotted: write "data"`},
		{"jsonpath index", "tools:\n  t:\n    probe:\n      type: http\n      url: http://x/{key}\n      match: \"data[0]\"\n", `lk.yaml:6: tools.t.probe.match: "data[0]" looks like JSONPath`},
		{"json pointer match", "tools:\n  t:\n    probe:\n      type: http\n      url: http://x/{key}\n      match: /data/items\n", `lk.yaml:6: tools.t.probe.match: "/data/items" is a JSON Pointer; paths here are dotted: write "data.items"`},
		{"jsonpath mapping", "tools:\n  t:\n    probe:\n      type: http\n      url: http://x/{key}\n      match: data\n      response_body:\n        code: code\n        id: \"$.data[0].id\"\n", `lk.yaml:9: tools.t.probe.response_body.id: "$.data[0].id" looks like JSONPath (it has a '$', '[' or ']'); paths here are dotted: write "data.0.id"`},
		{"json pointer sql mapping", "tools:\n  t:\n    probe:\n      type: sql\n      database_url: postgres://x/y\n      query: select 1\n      response_body: {id: /details/id}\n", `lk.yaml:7: tools.t.probe.response_body.id: "/details/id" is a JSON Pointer; paths here are dotted: write "details.id"`},
		{"sql delete", "tools:\n  t:\n    probe:\n      type: sql\n      database_url: postgres://x/y\n      query: DELETE FROM charges\n", `lk.yaml:6: tools.t.probe.query: query starts with "DELETE": a probe runs one SELECT`},
		{"sql simple protocol", "tools:\n  t:\n    probe:\n      type: sql\n      database_url: \"postgres://u:s3cret@h/db?default_query_exec_mode=simple_protocol\"\n      query: select 1\n", `lk.yaml:5: tools.t.probe.database_url: database_url sets default_query_exec_mode=simple_protocol, which probes refuse`},
		{"cooldown above max", "reconcile:\n  breaker:\n    cooldown: 1h\n", `lk.yaml:2: reconcile.breaker.max_cooldown: must not be shorter than reconcile.breaker.cooldown (1h0m0s)`},
		{"too many self-check samples", "self_check:\n  samples: 50\n", `lk.yaml:2: self_check.samples: at most 20`},
		{"negative self-check samples", "self_check:\n  samples: -1\n", `lk.yaml:2: self_check.samples: must be positive`},
		{"negative batch size", "reconcile:\n  batch_size: -1\n", `lk.yaml:2: reconcile.batch_size: must be positive, got -1`},
		{"batch size too large", "reconcile:\n  batch_size: 20000\n", `lk.yaml:2: reconcile.batch_size: at most 10000, got 20000`},
		{"backoff max under base", "reconcile:\n  backoff_base: 1h\n  backoff_max: 1m\n", `lk.yaml:3: reconcile.backoff_max: must not be shorter than reconcile.backoff_base (1h0m0s)`},
		{"negative tool concurrency", "tools:\n  t:\n    concurrency: -2\n", `lk.yaml:3: tools.t.concurrency: must be positive, got -2`},
		{"duty cycle", "retention:\n  duty_cycle: 1.5\n", `lk.yaml:2: retention.duty_cycle: must be in (0, 1], got 1.5`},
		{"negative retention batch", "retention:\n  batch_size: -5\n", `lk.yaml:2: retention.batch_size: must be positive, got -5`},
		{"bad cron", "schedule:\n  purge: \"every hour\"\n", `lk.yaml:2: schedule.purge: bad cron spec "every hour"`},
		{"log level", "log:\n  level: loud\n", `lk.yaml:2: log.level: must be debug, info, warn or error, got "loud"`},
		{"log format", "log:\n  format: xml\n", `lk.yaml:2: log.format: must be text or json, got "xml"`},
		{"negative max conns", "database:\n  max_conns: -1\n", `lk.yaml:2: database.max_conns: must be positive, got -1`},
		{"webhook not http", "alerts:\n  slack:\n    webhook_url: ftp://x/y\n", `lk.yaml:3: alerts.slack.webhook_url: must be an http(s) URL`},
		{"token without channel names the token", "alerts:\n  slack:\n    token: x\n", `alerts.slack.channel: required with alerts.slack.token`},
		{"probe timeout vs lease", "reconcile:\n  lease: 10s\ntools:\n  t:\n    probe:\n      type: go\n      timeout: 5s\n", `lk.yaml:7: tools.t.probe.timeout: probe timeout 5s must be well under half of reconcile.lease (10s)`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := settle(t, tt.yaml, envOf(nil))
			if err == nil {
				t.Fatalf("no error, want %q", tt.want)
			}
			if !strings.Contains(err.Error(), tt.want) {
				t.Fatalf("error = %q\nwant it to contain %q", err, tt.want)
			}
		})
	}
}

// TestSettleReportsEveryError: one run names every problem, in line order,
// those of two services together.
func TestSettleReportsEveryError(t *testing.T) {
	_, err := settle(t, "reconcile:\n  batch_size: -1\nretention:\n  duty_cycle: 2\nlog:\n  level: loud\n", envOf(nil))
	want := "lk.yaml:2: reconcile.batch_size: must be positive, got -1\n" +
		"lk.yaml:4: retention.duty_cycle: must be in (0, 1], got 2\n" +
		"lk.yaml:6: log.level: must be debug, info, warn or error, got \"loud\""
	if err == nil || err.Error() != want {
		t.Fatalf("error = %v\nwant %s", err, want)
	}
}

func TestSettleErrorsNeverCarrySecrets(t *testing.T) {
	y := "alerts:\n  slack:\n    webhook_url: ${HOOK}\n"
	_, err := settle(t, y, envOf(map[string]string{"HOOK": "ftp://user:s3cret@h/x"}))
	if err == nil || strings.Contains(err.Error(), "s3cret") {
		t.Fatalf("error = %v", err)
	}
}

// TestEmptyFileIsDefaults: the defaults are the services' own constants.
func TestEmptyFileIsDefaults(t *testing.T) {
	c, err := settle(t, "", envOf(nil))
	if err != nil {
		t.Fatal(err)
	}
	if c.Reconcile.BatchSize != reconcile.DefaultConfig().BatchSize || c.HTTP.Listen != ":9464" ||
		c.Retention.MinAge != 24*time.Hour || c.Database.MaxConns != 16+4 {
		t.Fatalf("defaults not applied: %+v", c)
	}
}

// TestSettleAcceptsEveryArgSource: key, tool and request.PATH all bind.
func TestSettleAcceptsEveryArgSource(t *testing.T) {
	y := "tools:\n  t:\n    probe:\n      type: sql\n      database_url: postgres://x/y\n      query: select 1\n      args: [key, tool, request.order.id]\n"
	if _, err := settle(t, y, envOf(nil)); err != nil {
		t.Fatalf("settle: %v", err)
	}
}

// In a fleet each ledger has a pool of its own, small by default (its
// decision writers, its leases and one more), while one ledger keeps the
// pool it always had; a max_conns set at the top level or in an entry wins.
func TestAFleetLedgersPoolIsSmallUnlessSet(t *testing.T) {
	const yaml = `database:
  url: postgres://top/db
ledgers:
  quiet:
    schema: quiet
  busy:
    schema: busy
    reconcile: {concurrency: 64}
  sized:
    schema: sized
    max_conns: 9
`
	c, err := settle(t, yaml, func(string) (string, bool) { return "", false })
	if err != nil {
		t.Fatal(err)
	}
	want := map[string]int{"quiet": 4, "busy": 6, "sized": 9}
	for name, n := range want {
		l, err := c.Ledger(name)
		if err != nil {
			t.Fatal(err)
		}
		if l.Database.MaxConns != n {
			t.Errorf("ledgers.%s: max_conns %d, want %d", name, l.Database.MaxConns, n)
		}
	}
	top, err := settle(t, "database:\n  url: postgres://top/db\n  max_conns: 12\nledgers:\n  a: {schema: a}\n  b: {schema: b}\n", func(string) (string, bool) { return "", false })
	if err != nil {
		t.Fatal(err)
	}
	if a, _ := top.Ledger("a"); a.Database.MaxConns != 12 {
		t.Errorf("database.max_conns 12 at the top level: ledgers.a has %d, want 12", a.Database.MaxConns)
	}
	one, err := settle(t, "database:\n  url: postgres://top/db\n", func(string) (string, bool) { return "", false })
	if err != nil {
		t.Fatal(err)
	}
	if one.Database.MaxConns != 20 {
		t.Errorf("one ledger: max_conns %d, want 20 (reconcile.concurrency + 4)", one.Database.MaxConns)
	}
}
