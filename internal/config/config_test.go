package config

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

func env(m map[string]string) LookupEnv {
	return func(k string) (string, bool) { v, ok := m[k]; return v, ok }
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

var fullEnv = env(map[string]string{
	"DB":                    "postgres://lk:hunter2@db:5432/lk",
	"TICKETS_TOKEN":         "tok-secret",
	"PAYMENTS_DATABASE_URL": "postgres://pay:pw@pay/pay",
	"SLACK_WEBHOOK_URL":     "https://hooks.slack.com/services/T/B/X",
})

// TestParseDecodesWithoutDefaults: config decodes what the file says and
// nothing more; a zero setting is left for daemon.Settle to fill from the
// services (internal/daemon's TestSettleFull covers the whole file).
func TestParseDecodesWithoutDefaults(t *testing.T) {
	c, err := Parse("lk.yaml", []byte(full), fullEnv)
	if err != nil {
		t.Fatalf("parse: %v", err)
	}
	if got := c.Database.URL.Reveal(); got != "postgres://lk:hunter2@db:5432/lk" {
		t.Fatalf("database url = %q", got)
	}
	if got := c.Tools["create_ticket"].Probe.Headers["Authorization"].Reveal(); got != "Bearer tok-secret" {
		t.Fatalf("header = %q", got)
	}
	if q := c.Tools["charge_card"].Probe.Query; !strings.Contains(q, "= $1") {
		t.Fatalf("$$ should be a literal $: %q", q)
	}
	if c.Retention.BatchSize != 5000 || c.Reconcile.Lease != 2*time.Minute || c.Schedule.Alerts != "" || c.Tools["create_ticket"].HeartbeatTimeout != 0 {
		t.Fatalf("values wrong, or defaults applied by the decoder: %+v", c)
	}
	// Secrets never print.
	b, _ := json.Marshal(c)
	for _, s := range []string{"hunter2", "tok-secret", "pw@pay", "hooks.slack.com"} {
		if strings.Contains(string(b), s) || strings.Contains(fmt.Sprintf("%v %+v %#v", c, c, c), s) {
			t.Fatalf("secret %q printed", s)
		}
	}
}

func TestParseErrors(t *testing.T) {
	tests := []struct {
		name string
		yaml string
		want string // substring of the error, including file:line
	}{
		{"unknown top key", "databse:\n  url: x\n", `lk.yaml:1: databse: unknown key (did you mean "database"?)`},
		{"misspelled nested key", "reconcile:\n  grace: 10s\n  batchsize: 3\n", `lk.yaml:3: reconcile.batchsize: unknown key (did you mean "batch_size"?)`},
		{"bad duration", "reconcile:\n  grace: 10x\n", `lk.yaml:2: reconcile.grace: bad duration "10x"`},
		{"negative duration", "reconcile:\n  lease: -1s\n", `lk.yaml:2: reconcile.lease: bad duration`},
		{"wrong type", "reconcile:\n  batch_size: many\n", `lk.yaml:2: reconcile.batch_size: expected an integer, got "many"`},
		{"mapping for scalar", "reconcile:\n  batch_size: {a: 1}\n", `lk.yaml:2: reconcile.batch_size: expected a single value`},
		{"unset env", "database:\n  url: ${NOPE}\n", `lk.yaml:2: database.url: environment variable NOPE is not set`},
		{"invalid yaml", "reconcile:\n  grace: [\n", `lk.yaml:`},
		{"duplicate key", "reconcile:\n  grace: 1s\n  grace: 2s\n", `reconcile.grace`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := Parse("lk.yaml", []byte(tt.yaml), env(nil))
			if err == nil {
				t.Fatalf("no error, want %q", tt.want)
			}
			if !strings.Contains(err.Error(), tt.want) {
				t.Fatalf("error = %q\nwant it to contain %q", err, tt.want)
			}
		})
	}
}

func TestSecretFiles(t *testing.T) {
	dir := t.TempDir()
	tok := filepath.Join(dir, "tok")
	if err := os.WriteFile(tok, []byte("xoxb-file\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	y := fmt.Sprintf("alerts:\n  slack:\n    token_file: %s\n    channel: c\ntools:\n  t:\n    probe:\n      type: http\n      url: http://x/{key}\n      headers_file: {Authorization: %s}\n", tok, tok)
	c, err := Parse("lk.yaml", []byte(y), env(nil))
	if err != nil {
		t.Fatal(err)
	}
	if c.Alerts.Slack.Token.Reveal() != "xoxb-file" || c.Tools["t"].Probe.Headers["Authorization"].Reveal() != "xoxb-file" {
		t.Fatalf("secret files not read: %+v", c.Alerts.Slack)
	}

	y = "alerts:\n  slack:\n    token: a\n    token_file: /nonexistent\n    channel: c\n"
	_, err = Parse("lk.yaml", []byte(y), env(nil))
	var errs Errors
	if !errors.As(err, &errs) || !strings.Contains(err.Error(), "lk.yaml:4: alerts.slack.token_file") {
		t.Fatalf("err = %v", err)
	}
}

func TestEnvOverridesDatabaseURL(t *testing.T) {
	c, err := Parse("lk.yaml", []byte("database:\n  url: postgres://file/db\n"), env(map[string]string{EnvDatabaseURL: "postgres://env/db"}))
	if err != nil {
		t.Fatal(err)
	}
	if c.Database.URL.Reveal() != "postgres://env/db" {
		t.Fatalf("url = %q", c.Database.URL.Reveal())
	}
	c.SetDatabaseURL("postgres://flag/db")
	if c.Database.URL.Reveal() != "postgres://flag/db" {
		t.Fatalf("url = %q", c.Database.URL.Reveal())
	}
}

func TestExpandNeverChangesStructure(t *testing.T) {
	// A value holding YAML syntax stays one scalar.
	c, err := Parse("lk.yaml", []byte("alerts:\n  slack:\n    channel: ${CH}\n    token: t\n"), env(map[string]string{"CH": "x\nhttp:\n  listen: evil"}))
	if err != nil {
		t.Fatal(err)
	}
	if c.HTTP.Listen != "" || !strings.HasPrefix(c.Alerts.Slack.Channel, "x\nhttp:") {
		t.Fatalf("expansion changed the document: %+v", c)
	}
}
