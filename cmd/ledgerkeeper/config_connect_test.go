package main

import (
	"fmt"
	"net/url"
	"strings"
	"testing"

	"github.com/ledgerkeeper/ledgerkeeper/internal/pgtest"
)

// TestConfigCheckRefusesJSONPath: the JSONPath spelling of a match path,
// which once read every ticket as absent, is refused with its place and
// the dotted form.
func TestConfigCheckRefusesJSONPath(t *testing.T) {
	t.Parallel()
	tk := newTickets(t)
	f := writeFile(t, "jsonpath.yaml", fmt.Sprintf(`tools:
  create_ticket:
    probe:
      type: http
      url: "%s/v1/tickets?idempotency_key={key}"
      match: "$.data"
      response_body: {ticket_id: "/id"}
`, tk.srv.URL))
	code, _, stderr := cli(t, "config", "check", "--config", f)
	if code != 2 ||
		!strings.Contains(stderr, f+`:6: tools.create_ticket.probe.match: "$.data" looks like JSONPath (it has a '$', '[' or ']'); paths here are dotted: write "data"`) ||
		!strings.Contains(stderr, f+`:7: tools.create_ticket.probe.response_body.ticket_id: "/id" is a JSON Pointer; paths here are dotted: write "id"`) {
		t.Fatalf("code %d, stderr %q", code, stderr)
	}
	if tk.hits != 0 {
		t.Fatalf("config check sent %d requests to the downstream", tk.hits)
	}
}

// sqlProbeConfig is a configuration with one sql probe; query, args and
// response_body are YAML flow values. The probe's keys stand on fixed
// lines: query 7, args 8, response_body 9.
func sqlProbeConfig(t *testing.T, dsn, query, args, body string) string {
	t.Helper()
	return writeFile(t, "sql.yaml", fmt.Sprintf(`tools:
  charge_card:
    probe:
      type: sql
      database_url: %q
      timeout: 3s
      query: %q
      args: %s
      response_body: %s
`, dsn, strings.ReplaceAll(query, "$", "$$"), args, body))
}

// TestConfigCheckConnect: --connect prepares each sql probe's query on its
// real downstream; without it nothing connects.
func TestConfigCheckConnect(t *testing.T) {
	t.Parallel()
	db := pgtest.NewEmpty(t)
	db.Exec(t, `CREATE TABLE charges (id text PRIMARY KEY, idempotency_key text NOT NULL, amount_cents bigint NOT NULL)`)
	db.Exec(t, `INSERT INTO charges VALUES ('ch_1', 'k-1', 1200), ('ch_2', 'k-2', 500)`)
	const query = "SELECT id AS charge_id, amount_cents FROM charges WHERE idempotency_key = $1"
	// The same server, as a role that does not exist: it answers, and
	// refuses.
	noUser, err := url.Parse(db.URL)
	if err != nil {
		t.Fatal(err)
	}
	noUser.User = url.User("nouser")

	tests := []struct {
		name              string
		dsn, query        string
		args, body        string
		want              int
		stdout, stderr    string
		stderrWithout     string // must not appear in stderr
		withoutConnectRun bool   // also exits 0 without --connect
	}{
		{name: "good", dsn: db.URL, query: query, args: "[key]", body: "{charge_id: charge_id, cents: amount_cents}",
			want: 0, stdout: "# --connect: tool charge_card: sql probe's query prepared on its downstream"},
		{name: "wrong parameter count", dsn: db.URL, query: query, args: "[key, tool]", body: "{charge_id: charge_id}",
			want: 2, stderr: ":8: tools.charge_card.probe.args: sql probe of tool charge_card: the query has 1 parameter(s) ($1…$1) but args has 2 entries", withoutConnectRun: true},
		{name: "missing mapped column", dsn: db.URL, query: query, args: "[key]", body: "{charge_id: charge_id, url: receipt_url}",
			want: 2, stderr: `:9: tools.charge_card.probe.response_body.url: sql probe of tool charge_card: no column "receipt_url" among the query's result columns (charge_id, amount_cents)`, withoutConnectRun: true},
		{name: "two statements", dsn: db.URL, query: query + "; DELETE FROM charges", args: "[key]", body: "{}",
			want: 2, stderr: ":7: tools.charge_card.probe.query: sql probe of tool charge_card: PostgreSQL refuses the query: ERROR: cannot insert multiple commands into a prepared statement (SQLSTATE 42601)", withoutConnectRun: true},
		{name: "unreachable", dsn: "postgres://prober:unre4chable-pw@127.0.0.1:1/payments?connect_timeout=2", query: query, args: "[key]", body: "{}",
			want: 1, stderr: "could not verify every sql probe:\n  tool charge_card (tools.charge_card.probe.database_url): sql probe: cannot reach the downstream database", stderrWithout: "unre4chable-pw", withoutConnectRun: true},
		{name: "refused: unknown role", dsn: noUser.String(), query: query, args: "[key]", body: "{}",
			want: 1, stderr: `sql probe: the downstream database refused the connection (check the user, password and database name in database_url): failed to connect to`, stderrWithout: "cannot reach", withoutConnectRun: true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			f := sqlProbeConfig(t, tt.dsn, tt.query, tt.args, tt.body)
			code, stdout, stderr := cli(t, "config", "check", "--config", f, "--connect")
			if code != tt.want || !strings.Contains(stdout, tt.stdout) || !strings.Contains(stderr, tt.stderr) ||
				(tt.stderr != "" && tt.stderr[0] == ':' && !strings.Contains(stderr, f+tt.stderr)) ||
				(tt.stderrWithout != "" && strings.Contains(stderr+stdout, tt.stderrWithout)) {
				t.Fatalf("--connect: code %d (want %d)\nstdout %s\nstderr %q\nwant stderr to contain %q", code, tt.want, stdout, stderr, tt.stderr)
			}
			if tt.withoutConnectRun {
				// Nothing connects without --connect.
				if code, stdout, stderr := cli(t, "config", "check", "--config", f); code != 0 || strings.Contains(stdout, "--connect") {
					t.Fatalf("without --connect: code %d, stdout %s, stderr %q", code, stdout, stderr)
				}
			}
		})
	}
	if n := db.Count(t, "charges"); n != 2 {
		t.Fatalf("charges has %d rows, want 2: config check ran a statement", n)
	}
}
