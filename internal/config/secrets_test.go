package config

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/ledgerkeeper/ledgerkeeper/internal/secret"
)

// Every value a ${VAR} expanded to, every *_file value and every Secret
// setting is registered; nothing else is.
func TestLoadRegistersEverySecretValue(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	tokenFile := filepath.Join(dir, "slack-token")
	if err := os.WriteFile(tokenFile, []byte("xoxb-from-file-777\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	headerFile := filepath.Join(dir, "hdr")
	if err := os.WriteFile(headerFile, []byte("hdr-from-file-888"), 0o600); err != nil {
		t.Fatal(err)
	}
	yaml := fmt.Sprintf(`database:
  url: ${DB}
tools:
  tickets:
    probe:
      type: http
      url: "http://tickets.internal/v1/tickets?idempotency_key={key}&api_key=${TICKETS_TOKEN}"
      headers: {Authorization: "Bearer ${HEADER_TOKEN}", X-Literal: "literal-header-secret"}
      headers_file: {X-From-File: %q}
      match: data
  charges:
    probe:
      type: sql
      database_url: ${PAYMENTS_DATABASE_URL}
      query: "SELECT 1 WHERE $$1 <> ''"
      args: [key]
alerts:
  slack:
    token_file: %q
    channel: "#c"
    webhook_url: "https://hooks.slack.com/services/T0/B0/LITERALHOOKPART"
log:
  level: info
`, headerFile, tokenFile)
	cfg, err := Parse("lk.yaml", []byte(yaml), env(map[string]string{
		"DB":                    "postgres://ledger:db-pass-111@db:5432/ledger",
		"TICKETS_TOKEN":         "tickets-token-222",
		"HEADER_TOKEN":          "header-token-333",
		"PAYMENTS_DATABASE_URL": "host=pay user=p password=pay-pass-444 dbname=pay",
	}))
	if err != nil {
		t.Fatal(err)
	}
	cfg.SetDatabaseURL("postgres://ledger:flag-pass-555@db/ledger")
	red := cfg.Redactor()
	for _, s := range []string{
		"db-pass-111", "tickets-token-222", "header-token-333", "pay-pass-444", "flag-pass-555",
		"xoxb-from-file-777", "hdr-from-file-888", "literal-header-secret", "LITERALHOOKPART",
	} {
		if got := red.String("before " + s + " after"); strings.Contains(got, s) {
			t.Errorf("%s not registered: %q", s, got)
		}
	}
	// The URL around the token is no secret: it stays readable.
	if got := red.String(cfg.Tools["tickets"].Probe.URL); got != "http://tickets.internal/v1/tickets?idempotency_key={key}&api_key="+secret.Mask {
		t.Errorf("probe URL redacted to %q", got)
	}
	// The effective settings, as `config check --json` prints them.
	b, err := json.Marshal(cfg)
	if err != nil {
		t.Fatal(err)
	}
	out := string(red.JSON(b))
	// Whole values (and their telling parts), never bare digits: the
	// temporary directory's random name may contain "333".
	for _, s := range []string{"pass-111", "token-222", "token-333", "pass-444", "pass-555", "file-777", "file-888", "literal-header", "LITERALHOOK"} {
		if strings.Contains(out, s) {
			t.Errorf("effective settings show %s: %s", s, out)
		}
	}
	if !strings.Contains(out, `"level":"info"`) {
		t.Errorf("a literal setting was redacted: %s", out)
	}
}

func TestEnvDatabaseURLIsRegistered(t *testing.T) {
	t.Parallel()
	cfg, err := Default(env(map[string]string{EnvDatabaseURL: "postgres://u:env-pass-999@h/db"}))
	if err != nil {
		t.Fatal(err)
	}
	if got := cfg.Redactor().String("pgx: env-pass-999"); strings.Contains(got, "env-pass-999") {
		t.Fatalf("got %q", got)
	}
}

// A typed setting's error never quotes what a variable expanded to.
func TestTypedErrorsDoNotQuoteExpandedValues(t *testing.T) {
	t.Parallel()
	_, err := Parse("lk.yaml", []byte("reconcile:\n  grace: ${G}\n  batch_size: ${B}\n"), env(map[string]string{"G": "oops-secret-1", "B": "oops-secret-2"}))
	if err == nil {
		t.Fatal("bad values accepted")
	}
	msg := err.Error()
	if strings.Contains(msg, "oops-secret") || !strings.Contains(msg, `lk.yaml:2: reconcile.grace: bad duration "${G}" (as expanded from the environment)`) {
		t.Fatalf("error: %s", msg)
	}
}

// Secret-typed settings print with the one mask.
func TestSecretPrintsTheRedactorsMask(t *testing.T) {
	t.Parallel()
	s := Secret("x-value")
	b, _ := json.Marshal(s)
	if fmt.Sprint(s) != secret.Mask || fmt.Sprintf("%#v", s) != secret.Mask || string(b) != `"`+secret.Mask+`"` {
		t.Fatalf("%v %#v %s", s, s, b)
	}
}
