package main

import (
	"encoding/json"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/ledgerkeeper/ledgerkeeper/internal/pgtest"
)

// canaryListDoc is `probe canary list --json`'s document.
type canaryListDoc struct {
	Canaries []struct {
		Tool           string          `json:"tool"`
		Key            string          `json:"key"`
		Source         string          `json:"source"`
		Actor          string          `json:"actor"`
		CreatedAt      *time.Time      `json:"created_at"`
		Reason         string          `json:"reason"`
		HasRequestBody bool            `json:"has_request_body"`
		RequestBody    json.RawMessage `json:"request_body"`
	} `json:"canaries"`
}

// canaryConfig is probeConfig's configuration with two canaries declared
// for create_ticket, one with a request body.
func canaryConfig(t *testing.T, tr *ticketRouter) string {
	t.Helper()
	return writeFile(t, "ledgerkeeper.yaml", fmt.Sprintf(`tools:
  create_ticket:
    processing_window: 2s
    probe:
      type: http
      url: "%s/v1/tickets?idempotency_key={key}&api_key=${PROBE_TEST_TOKEN}"
      match: data
      response_code: 201
      response_body: {ticket_id: id}
      self_check:
        canaries:
          - key: cfg-canary
            request: {title: "kept ${PROBE_TEST_TOKEN}"}
          - key: cfg-bare
  refund_payment:
    processing_window: 2s
`, tr.srv.URL))
}

// canaryAudit is the key's canary audit rows, oldest first, as
// "action actor tool: reason".
func canaryAudit(t *testing.T, db *pgtest.DB, key string) []string {
	t.Helper()
	rows, err := db.Pool.Query(t.Context(), `SELECT action || ' ' || actor || ' ' || tool || ': ' || coalesce(error, '')
		FROM reconcile_audit WHERE key = $1 AND action LIKE 'canary%' ORDER BY id`, key)
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	var out []string
	for rows.Next() {
		var s string
		if err := rows.Scan(&s); err != nil {
			t.Fatal(err)
		}
		out = append(out, s)
	}
	return out
}

// An operator adds a canary (its request body given, or taken from the
// key's ledger row), lists it (text and --json) and removes it; each change
// is audited with its actor and reason, a second add and a second remove
// are refused (exit 1) and change nothing, and a secret in the request or
// the reason is never printed.
//
// Not parallel: it sets $PROBE_TEST_TOKEN and $USER.
func TestProbeCanaryAddListRemove(t *testing.T) {
	t.Setenv("PROBE_TEST_TOKEN", probeSecret)
	t.Setenv("USER", "carol")
	db := pgtest.New(t)
	tr := newTicketRouter(t)
	cfg := probeConfig(t, tr, "/v1/tickets?idempotency_key={key}&api_key=${PROBE_TEST_TOKEN}")
	url := db.URL
	db.Exec(t, `INSERT INTO idempotency_keys (key, tool, request_hash, request_body, status, response_code, response_body, created_at, claimed_at, updated_at, expires_at)
		VALUES ('k-ledger', 'create_ticket', 'h', '{"title":"from the ledger"}', 'completed', 201, '{"ticket_id":"T-1"}',
			now() - interval '90 days', now() - interval '90 days', now() - interval '90 days', now() + interval '1 day')`)
	canary := func(args ...string) (int, string, string) {
		t.Helper()
		code, out, stderr := cli(t, append(append([]string{"probe", "canary"}, args...), "--config", cfg, "--database-url", url)...)
		if strings.Contains(out+stderr, probeSecret) {
			t.Errorf("probe canary %v printed the secret:\nstdout %s\nstderr %s", args, out, stderr)
		}
		return code, out, stderr
	}

	code, out, stderr := canary("add", "canary-1", "--tool", "create_ticket", "--reason", "ticket T-100, kept for the purpose",
		"--request", `{"title":"canary","token":"`+probeSecret+`"}`, "--actor", "alice")
	if code != 0 || out != "canary canary-1 added for tool create_ticket (by operator:alice: ticket T-100, kept for the purpose); the self-check will probe it as a present-side witness\n" {
		t.Fatalf("add: %d\n%s\n%s", code, out, stderr)
	}
	// No --request: the ledger row's body; no --actor: $USER.
	code, out, stderr = canary("add", "k-ledger", "--tool", "create_ticket", "--reason", "T-1 is never deleted, see "+probeSecret)
	if code != 0 || !strings.HasPrefix(out, "canary k-ledger added for tool create_ticket (by operator:carol: T-1 is never deleted, see [redacted])") {
		t.Fatalf("add from the ledger: %d\n%s\n%s", code, out, stderr)
	}
	// Not in the ledger, no --request: added, with a note.
	code, out, _ = canary("add", "canary-bare", "--tool", "create_ticket", "--reason", "r")
	if code != 0 || !strings.Contains(out, "note: no request body stored") {
		t.Fatalf("add without a body: %d\n%s", code, out)
	}
	var body string
	if err := db.Pool.QueryRow(t.Context(), `SELECT request_body::text FROM probe_canaries WHERE key = 'k-ledger'`).Scan(&body); err != nil || body != `{"title": "from the ledger"}` {
		t.Fatalf("stored body of k-ledger: %q %v", body, err)
	}

	// A second add of the same canary: refused, naming the one in force.
	before := snapshot(t, db)
	code, out, stderr = canary("add", "canary-1", "--tool", "create_ticket", "--reason", "mine now", "--actor", "bob")
	if code != 1 || out != "" || !strings.Contains(stderr, `refused: tool create_ticket already has canary "canary-1" (added by operator:alice at `) ||
		!strings.Contains(stderr, "nothing changed") {
		t.Fatalf("second add: %d\n%s\n%s", code, out, stderr)
	}
	sameSnapshot(t, "a refused add", before, snapshot(t, db))

	code, out, _ = canary("list")
	if code != 0 {
		t.Fatalf("list: %d %s", code, out)
	}
	for _, want := range []string{
		"TOOL KEY SOURCE BY CREATED REQUEST BODY REASON",
		"create_ticket canary-1 operator operator:alice",
		"stored ticket T-100, kept for the purpose",
		"create_ticket k-ledger operator operator:carol",
		"create_ticket canary-bare operator operator:carol",
		"none r",
	} {
		if !says(out, want) {
			t.Errorf("list lacks %q:\n%s", want, out)
		}
	}
	code, out, _ = canary("list", "--tool", "create_ticket", "--json")
	var doc canaryListDoc
	if err := json.Unmarshal([]byte(out), &doc); code != 0 || err != nil || len(doc.Canaries) != 3 {
		t.Fatalf("list --json: %d %v\n%s", code, err, out)
	}
	byKey := map[string]int{}
	for i, c := range doc.Canaries {
		byKey[c.Key] = i
		if c.Tool != "create_ticket" || c.Source != "operator" || c.CreatedAt == nil {
			t.Errorf("list --json entry %+v", c)
		}
	}
	if c := doc.Canaries[byKey["canary-1"]]; c.Actor != "operator:alice" || !c.HasRequestBody || !sameJSON(c.RequestBody, `{"title":"canary","token":"[redacted]"}`) {
		t.Errorf("canary-1: %+v %s", c, c.RequestBody)
	}
	if c := doc.Canaries[byKey["canary-bare"]]; c.HasRequestBody || c.RequestBody != nil {
		t.Errorf("canary-bare: %+v", c)
	}
	code, out, _ = canary("list", "--tool", "refund_payment")
	if code != 0 || !strings.Contains(out, "no canaries for tool refund_payment") {
		t.Errorf("list of a tool without canaries: %d %s", code, out)
	}

	code, out, stderr = canary("remove", "canary-1", "--tool", "create_ticket", "--reason", "T-100 archived", "--actor", "bob")
	if code != 0 || !strings.HasPrefix(out, "canary canary-1 removed from tool create_ticket (by operator:bob: T-100 archived); it was added by operator:alice at ") {
		t.Fatalf("remove: %d\n%s\n%s", code, out, stderr)
	}
	if n := db.Count(t, "probe_canaries WHERE key = 'canary-1'"); n != 0 {
		t.Fatalf("removed canary still stored")
	}
	before = snapshot(t, db)
	code, _, stderr = canary("remove", "canary-1", "--tool", "create_ticket", "--reason", "again")
	if code != 1 || !strings.Contains(stderr, `tool create_ticket has no canary "canary-1"`) || !strings.Contains(stderr, "nothing changed") {
		t.Fatalf("second remove: %d %s", code, stderr)
	}
	sameSnapshot(t, "a refused remove", before, snapshot(t, db))

	got := canaryAudit(t, db, "canary-1")
	want := []string{"canary_added operator:alice create_ticket: ticket T-100, kept for the purpose", "canary_removed operator:bob create_ticket: T-100 archived"}
	if strings.Join(got, "\n") != strings.Join(want, "\n") {
		t.Errorf("audit of canary-1:\n%s\nwant\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
	if got := canaryAudit(t, db, "k-ledger"); len(got) != 1 || !strings.HasPrefix(got[0], "canary_added operator:carol create_ticket: T-1 is never deleted") {
		t.Errorf("audit of k-ledger: %q", got)
	}
}

// Canary changes are refused before anything is written: a missing --tool
// or --reason, a --request that is not a JSON object, a tool that is not
// configured or has no probe (exit 2), each saying what is wrong.
//
// Not parallel: it sets $PROBE_TEST_TOKEN.
func TestProbeCanaryRefusals(t *testing.T) {
	t.Setenv("PROBE_TEST_TOKEN", probeSecret)
	db := pgtest.New(t)
	tr := newTicketRouter(t)
	cfg := probeConfig(t, tr, "/v1/tickets?idempotency_key={key}&api_key=${PROBE_TEST_TOKEN}")
	before := snapshot(t, db)
	for _, c := range []struct {
		name string
		args []string
		want int
		msg  string
	}{
		{"add without --tool", []string{"add", "k", "--reason", "r"}, 2, "probe canary add: --tool is required"},
		{"add without --reason", []string{"add", "k", "--tool", "create_ticket"}, 2, "probe canary add: --reason is required"},
		{"add with --request not JSON", []string{"add", "k", "--tool", "create_ticket", "--reason", "r", "--request", `{"title":`}, 2, "--request is not valid JSON"},
		{"add with --request an array", []string{"add", "k", "--tool", "create_ticket", "--reason", "r", "--request", `[1]`}, 2, "--request must be a JSON object (the request body the probe's templates read), not an array"},
		{"add for an unknown tool", []string{"add", "k", "--tool", "send_fax", "--reason", "r"}, 2, `unknown tool "send_fax"`},
		{"add for a tool without a probe", []string{"add", "k", "--tool", "refund_payment", "--reason", "r"}, 2, `tool "refund_payment" has no probe`},
		{"add a key too long", []string{"add", strings.Repeat("k", 129), "--tool", "create_ticket", "--reason", "r"}, 2, "canary key is 129 bytes, at most 128"},
		{"add without a key", []string{"add", "--tool", "create_ticket", "--reason", "r"}, 2, "accepts 1 arg"},
		{"remove without --tool", []string{"remove", "k", "--reason", "r"}, 2, "probe canary remove: --tool is required"},
		{"remove without --reason", []string{"remove", "k", "--tool", "create_ticket"}, 2, "probe canary remove: --reason is required"},
		{"list with an argument", []string{"list", "k"}, 2, "unknown command"},
		{"no sub-command", []string{}, 2, "needs a sub-command: add or list or remove"},
		{"a typo'd sub-command", []string{"ad"}, 2, "did you mean add?"},
	} {
		code, out, stderr := cli(t, append(append([]string{"probe", "canary"}, c.args...), "--config", cfg, "--database-url", db.URL)...)
		if code != c.want || !strings.Contains(stderr, c.msg) {
			t.Errorf("%s: exit %d, stderr %q; want %d and %q", c.name, code, stderr, c.want, c.msg)
		}
		if strings.Contains(out+stderr, probeSecret) {
			t.Errorf("%s printed the secret", c.name)
		}
	}
	sameSnapshot(t, "refused canary changes", before, snapshot(t, db))
}

// list shows the canaries the configuration declares beside the stored
// ones, as source config (their secrets redacted); remove refuses one of
// them (exit 1) and says to edit the configuration instead.
//
// Not parallel: it sets $PROBE_TEST_TOKEN.
func TestProbeCanaryListShowsConfiguredCanaries(t *testing.T) {
	t.Setenv("PROBE_TEST_TOKEN", probeSecret)
	db := pgtest.New(t)
	cfg := canaryConfig(t, newTicketRouter(t))
	url := db.URL
	if code, out, stderr := cli(t, "probe", "canary", "add", "stored", "--tool", "create_ticket", "--reason", "r", "--actor", "alice", "--config", cfg, "--database-url", url); code != 0 {
		t.Fatalf("add: %d %s %s", code, out, stderr)
	}
	code, out, stderr := cli(t, "probe", "canary", "list", "--config", cfg, "--database-url", url)
	if code != 0 || !says(out, "create_ticket stored operator operator:alice") || !says(out, "create_ticket cfg-canary config - - stored -") ||
		!says(out, "create_ticket cfg-bare config - - none -") || strings.Contains(out, probeSecret) {
		t.Fatalf("list: %d\n%s\n%s", code, out, stderr)
	}
	code, out, _ = cli(t, "probe", "canary", "list", "--json", "--config", cfg, "--database-url", url)
	var doc canaryListDoc
	if err := json.Unmarshal([]byte(out), &doc); code != 0 || err != nil || len(doc.Canaries) != 3 || strings.Contains(out, probeSecret) {
		t.Fatalf("list --json: %d %v\n%s", code, err, out)
	}
	c := doc.Canaries[1]
	if c.Key != "cfg-canary" || c.Source != "config" || c.CreatedAt != nil || c.Actor != "" || !c.HasRequestBody ||
		!sameJSON(c.RequestBody, `{"title":"kept [redacted]"}`) {
		t.Errorf("configured canary: %+v %s", c, c.RequestBody)
	}
	code, out, _ = cli(t, "probe", "canary", "list", "--tool", "refund_payment", "--json", "--config", cfg, "--database-url", url)
	if code != 0 || !says(out, `{ "canaries": [] }`) {
		t.Errorf("list --json of a tool without canaries: %d %s", code, out)
	}

	before := snapshot(t, db)
	code, _, stderr = cli(t, "probe", "canary", "remove", "cfg-canary", "--tool", "create_ticket", "--reason", "r", "--config", cfg, "--database-url", url)
	if code != 1 || !strings.Contains(stderr, "is declared in the configuration") || !strings.Contains(stderr, "tools.create_ticket.probe.self_check.canaries") {
		t.Errorf("remove of a configured canary: %d %s", code, stderr)
	}
	sameSnapshot(t, "a refused remove", before, snapshot(t, db))

	// Marking a declared canary is allowed, and says it is declared too.
	code, out, stderr = cli(t, "probe", "canary", "add", "cfg-bare", "--tool", "create_ticket", "--reason", "r", "--config", cfg, "--database-url", url)
	if code != 0 || !strings.Contains(out, "note: the configuration declares it too (tools.create_ticket.probe.self_check.canaries)") {
		t.Errorf("add of a declared canary: %d\n%s\n%s", code, out, stderr)
	}
}
