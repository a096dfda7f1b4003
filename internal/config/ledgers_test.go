package config

import (
	"strings"
	"testing"
)

const fleetYAML = `database:
  url: postgres://top/db
reconcile:
  concurrency: 4
tools:
  create_ticket:
    processing_window: 5m
ledgers:
  billing:
    schema: billing
    reconcile:
      concurrency: 9
    tools:
      charge_card:
        processing_window: 2m
  support:
    database_url: ${SUPPORT_DB}
    schema: support
`

// A ledger is the top level with its own settings over it: sections merge
// key by key, tools add to the top level's, database_url replaces the
// top level's URL (and $LEDGERKEEPER_DATABASE_URL, which is the top
// level's), and a ledger without one inherits it.
func TestLedgersInheritTheTopLevelAndOverrideIt(t *testing.T) {
	c, err := Parse("lk.yaml", []byte(fleetYAML), env(map[string]string{"SUPPORT_DB": "postgres://support/db", EnvDatabaseURL: "postgres://env/db"}))
	if err != nil {
		t.Fatal(err)
	}
	if !c.Fleet() || strings.Join(c.LedgerNames(), ",") != "billing,support" {
		t.Fatalf("ledgers = %v", c.LedgerNames())
	}
	b, err := c.Ledger("billing")
	if err != nil {
		t.Fatal(err)
	}
	s, _ := c.Ledger("support")
	if b.Database.Schema != "billing" || b.Database.URL.Reveal() != "postgres://env/db" {
		t.Errorf("billing: schema %q url %q, want billing and the top level's (from the environment)", b.Database.Schema, b.Database.URL.Reveal())
	}
	if s.Database.Schema != "support" || s.Database.URL.Reveal() != "postgres://support/db" {
		t.Errorf("support: schema %q url %q, want its own", s.Database.Schema, s.Database.URL.Reveal())
	}
	if b.Reconcile.Concurrency != 9 || s.Reconcile.Concurrency != 4 {
		t.Errorf("concurrency billing %d support %d, want 9 and the inherited 4", b.Reconcile.Concurrency, s.Reconcile.Concurrency)
	}
	if len(b.Tools) != 2 || len(s.Tools) != 1 || b.Tools["charge_card"].ProcessingWindow.D().Minutes() != 2 {
		t.Errorf("tools billing %v support %v", b.ToolNames(), s.ToolNames())
	}
	c.SetDatabaseURL("postgres://flag/db")
	if b.Database.URL.Reveal() != "postgres://flag/db" || s.Database.URL.Reveal() != "postgres://support/db" {
		t.Errorf("--database-url: billing %q support %q, want the flag's for billing only", b.Database.URL.Reveal(), s.Database.URL.Reveal())
	}
	if _, err := c.Ledger("biling"); err == nil || !strings.Contains(err.Error(), `did you mean "billing"`) {
		t.Errorf("Ledger(biling) = %v, want a did-you-mean", err)
	}
}

// A file without a ledgers section is one ledger named default: the
// whole configuration, in search_path.
func TestAFileWithoutLedgersIsTheDefaultLedger(t *testing.T) {
	c, err := Parse("lk.yaml", []byte("database:\n  url: postgres://x/db\n"), env(nil))
	if err != nil {
		t.Fatal(err)
	}
	ls := c.Ledgers()
	if c.Fleet() || len(ls) != 1 || ls[0].Name != DefaultLedger || ls[0].Config != c || ls[0].Database.Schema != "" {
		t.Fatalf("ledgers = %+v", ls)
	}
}

func TestLedgerErrorsNameTheirKeyUnderTheLedger(t *testing.T) {
	for _, tc := range []struct{ name, yaml, want string }{
		{"unknown setting", "ledgers:\n  a:\n    schemaa: x\n", `lk.yaml:3: ledgers.a.schemaa: unknown ledger setting (did you mean "schema"?)`},
		{"process-wide key", "ledgers:\n  a:\n    http:\n      listen: \":1\"\n", `lk.yaml:3: ledgers.a.http: belongs to the process`},
		{"bad type inside", "ledgers:\n  a:\n    reconcile:\n      concurrency: many\n", `lk.yaml:4: ledgers.a.reconcile.concurrency: expected an integer`},
		{"bad name", "ledgers:\n  Billing:\n    schema: b\n", `lk.yaml:2: ledgers.Billing: a ledger's name is lower-case`},
		{"bad schema", "ledgers:\n  a:\n    schema: \"x; DROP\"\n", `ledgers.a.schema: schema "x; DROP"`},
		{"same place", "database:\n  url: postgres://x/db\nledgers:\n  a:\n    schema: s\n  b:\n    schema: s\n", `ledgers a and b are in the same database and schema (s)`},
		{"empty", "ledgers: {}\n", `lk.yaml:1: ledgers: is empty`},
		{"not a mapping", "ledgers:\n  - a\n", `ledgers: must be a mapping`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := Parse("lk.yaml", []byte(tc.yaml), env(nil))
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("error = %v\nwant it to contain %q", err, tc.want)
			}
		})
	}
}

// A secret of one ledger (its own database URL) is registered with the
// redactor every output goes through.
func TestALedgersSecretsAreRedacted(t *testing.T) {
	c, err := Parse("lk.yaml", []byte("ledgers:\n  a:\n    database_url: postgres://u:hunter2-ledger-a@h/db\n"), env(nil))
	if err != nil {
		t.Fatal(err)
	}
	if got := c.Redactor().String("connect postgres://u:hunter2-ledger-a@h/db failed"); strings.Contains(got, "hunter2") {
		t.Fatalf("redacted: %q", got)
	}
}
