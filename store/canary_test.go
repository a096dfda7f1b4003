package store

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/ledgerkeeper/ledgerkeeper/internal/pgtest"
	"github.com/ledgerkeeper/ledgerkeeper/ledger"
)

// TestMain (pgtest.Main) is in store_test.go. Internal: the plan test
// EXPLAINs the statement itself.

// ledgerKey inserts a key of tool with status, created (and claimed and
// updated) ago, with body as its request_body ("" for none).
func ledgerKey(t *testing.T, db *pgtest.DB, key, tool, status string, ago time.Duration, body string) {
	t.Helper()
	var b any
	if body != "" {
		b = body
	}
	db.Exec(t, `INSERT INTO idempotency_keys (key, tool, request_hash, request_body, status, created_at, claimed_at, updated_at, expires_at)
		VALUES ($1, $2, 'h', $5::jsonb, $3, now() - $4::interval, now() - $4::interval, now() - $4::interval, now() + interval '1 day')`,
		key, tool, status, ago, b)
}

// auditOf is the key's audit rows with action (every one, oldest first).
func auditOf(t *testing.T, db *pgtest.DB, key, action string) []AuditEntry {
	t.Helper()
	hist, err := History(context.Background(), db.Pool, key, 100)
	if err != nil {
		t.Fatalf("history of %s: %v", key, err)
	}
	var out []AuditEntry
	for _, e := range hist {
		if e.Action == action {
			out = append(out, e)
		}
	}
	return out
}

// tableDigest is a digest of a table's rows: equal digests, equal contents.
func tableDigest(t *testing.T, db *pgtest.DB, table string) string {
	t.Helper()
	var d string
	err := db.Pool.QueryRow(context.Background(), `SELECT count(*) || ':' || coalesce(md5(string_agg(r::text, '|' ORDER BY r::text)), '') FROM `+table+` r`).Scan(&d)
	if err != nil {
		t.Fatalf("digest of %s: %v", table, err)
	}
	return d
}

func addCanaryOK(t *testing.T, db *pgtest.DB, c Canary) Canary {
	t.Helper()
	got, err := AddCanary(context.Background(), db.Pool, c)
	if err != nil {
		t.Fatalf("add canary %s of %s: %v", c.Key, c.Tool, err)
	}
	return got
}

// A canary is stored with the body given, else the body of its key's
// ledger row of the same tool, else none; each add is audited with its
// actor and reason and says where the body came from.
func TestAddCanaryStoresTheBodyGivenOrTheLedgers(t *testing.T) {
	t.Parallel()
	db := pgtest.New(t)
	ledgerKey(t, db, "k-ledger", "create_ticket", ledger.StatusCompleted, time.Hour, `{"title":"from the ledger"}`)
	ledgerKey(t, db, "k-ledger-2", "create_ticket", ledger.StatusCompleted, time.Hour, `{"title":"the ledger's"}`)
	ledgerKey(t, db, "k-other-tool", "refund_payment", ledger.StatusCompleted, time.Hour, `{"amount":5}`)

	for _, c := range []struct {
		name, tool, key, body string
		wantBody              string // "" for none
		wantSource            string
	}{
		{"given", "create_ticket", "k-given", `{"title":"given"}`, `{"title":"given"}`, "given"},
		{"given beats the ledger's", "create_ticket", "k-ledger-2", `{"title":"mine"}`, `{"title":"mine"}`, "given"},
		{"from the ledger", "create_ticket", "k-ledger", "", `{"title":"from the ledger"}`, "from_ledger"},
		{"not in the ledger", "create_ticket", "k-nowhere", "", "", "none"},
		{"in the ledger under another tool", "create_ticket", "k-other-tool", "", "", "none"},
		// (tool, key) is the identity: the same key for a second tool.
		{"a second tool's", "create_ticket_v2", "k-ledger", "", "", "none"},
	} {
		t.Run(c.name, func(t *testing.T) {
			tool := c.tool
			in := Canary{Tool: tool, Key: c.key, Reason: "kept for the purpose: " + c.name, Actor: "alice"}
			if c.body != "" {
				in.RequestBody = json.RawMessage(c.body)
			}
			got := addCanaryOK(t, db, in)
			if got.Tool != tool || got.Key != c.key || got.Reason != in.Reason || got.Actor != "alice" || got.CreatedAt.IsZero() {
				t.Fatalf("added %+v", got)
			}
			if c.wantBody == "" && got.RequestBody != nil {
				t.Errorf("body %s, want none", got.RequestBody)
			}
			if c.wantBody != "" && !sameJSONText(got.RequestBody, c.wantBody) {
				t.Errorf("body %s, want %s", got.RequestBody, c.wantBody)
			}
			stored, err := Canaries(context.Background(), db.Pool, tool)
			if err != nil {
				t.Fatal(err)
			}
			i := slices.IndexFunc(stored, func(s Canary) bool { return s.Key == c.key })
			if i < 0 || !stored[i].CreatedAt.Equal(got.CreatedAt) || string(stored[i].RequestBody) != string(got.RequestBody) {
				t.Fatalf("stored %+v, returned %+v", stored, got)
			}
			var audit *AuditEntry
			for _, e := range auditOf(t, db, c.key, "canary_added") {
				if e.Tool == tool && e.Error == in.Reason {
					audit = &e
				}
			}
			if audit == nil || audit.Actor != "alice" || audit.Verdict != "operator" || audit.Attempt != 0 ||
				!sameJSONText(audit.Evidence, fmt.Sprintf(`{"request_body":%q}`, c.wantSource)) {
				t.Fatalf("audit row %+v", audit)
			}
		})
	}
}

func sameJSONText(got json.RawMessage, want string) bool {
	var g, w any
	return json.Unmarshal(got, &g) == nil && json.Unmarshal([]byte(want), &w) == nil && fmt.Sprint(g) == fmt.Sprint(w)
}

// Adding a canary the tool already has is refused with ErrCanaryExists and
// the canary in force, and writes nothing: the stored reason and actor
// stay, no audit row.
func TestAddCanaryTwiceIsRefusedAndChangesNothing(t *testing.T) {
	t.Parallel()
	db := pgtest.New(t)
	first := addCanaryOK(t, db, Canary{Tool: "create_ticket", Key: "k", RequestBody: json.RawMessage(`{"a":1}`), Reason: "first", Actor: "alice"})
	canaries, audit := tableDigest(t, db, "probe_canaries"), tableDigest(t, db, "reconcile_audit")

	got, err := AddCanary(context.Background(), db.Pool, Canary{Tool: "create_ticket", Key: "k", RequestBody: json.RawMessage(`{"a":2}`), Reason: "second", Actor: "bob"})
	if !errors.Is(err, ErrCanaryExists) {
		t.Fatalf("second add: %v, want ErrCanaryExists", err)
	}
	if got.Actor != "alice" || got.Reason != "first" || !got.CreatedAt.Equal(first.CreatedAt) {
		t.Errorf("refusal returned %+v, want the canary in force %+v", got, first)
	}
	if tableDigest(t, db, "probe_canaries") != canaries || tableDigest(t, db, "reconcile_audit") != audit {
		t.Error("the refused add changed probe_canaries or reconcile_audit")
	}
}

// What the table would store meaninglessly, or refuse less clearly, is
// ErrInvalid before any statement.
func TestAddCanaryRefusesInvalidInput(t *testing.T) {
	t.Parallel()
	db := pgtest.New(t)
	ok := Canary{Tool: "create_ticket", Key: "k", Reason: "r", Actor: "a"}
	for _, c := range []struct {
		name   string
		change func(*Canary)
	}{
		{"no tool", func(c *Canary) { c.Tool = "" }},
		{"tool too long", func(c *Canary) { c.Tool = strings.Repeat("t", ledger.MaxToolLength+1) }},
		{"no key", func(c *Canary) { c.Key = "" }},
		{"key too long", func(c *Canary) { c.Key = strings.Repeat("k", ledger.MaxKeyLength+1) }},
		{"no reason", func(c *Canary) { c.Reason = "" }},
		{"no actor", func(c *Canary) { c.Actor = "" }},
		{"body not JSON", func(c *Canary) { c.RequestBody = json.RawMessage(`{"a":`) }},
	} {
		in := ok
		c.change(&in)
		if _, err := AddCanary(context.Background(), db.Pool, in); !errors.Is(err, ledger.ErrInvalid) {
			t.Errorf("%s: %v, want ErrInvalid", c.name, err)
		}
	}
	if n := db.Count(t, "probe_canaries"); n != 0 {
		t.Errorf("%d canaries stored", n)
	}
	if n := db.Count(t, "reconcile_audit"); n != 0 {
		t.Errorf("%d audit rows", n)
	}
}

// Canaries lists one tool's newest first, or every tool's by tool then
// newest first.
func TestCanariesListNewestFirstByTool(t *testing.T) {
	t.Parallel()
	db := pgtest.New(t)
	for _, c := range []struct {
		tool, key string
		ago       time.Duration
	}{
		{"create_ticket", "old", 10 * time.Hour}, {"refund_payment", "r1", 9 * time.Hour}, {"create_ticket", "new", time.Hour},
		{"create_ticket", "mid", 5 * time.Hour}, {"refund_payment", "r2", 2 * time.Hour},
	} {
		addCanaryOK(t, db, Canary{Tool: c.tool, Key: c.key, Reason: "r", Actor: "a"})
		db.Exec(t, `UPDATE probe_canaries SET created_at = now() - $3::interval WHERE tool = $1 AND key = $2`, c.tool, c.key, c.ago)
	}
	keys := func(tool string) string {
		t.Helper()
		cs, err := Canaries(context.Background(), db.Pool, tool)
		if err != nil {
			t.Fatal(err)
		}
		var out []string
		for _, c := range cs {
			out = append(out, c.Tool+"/"+c.Key)
		}
		return strings.Join(out, " ")
	}
	if got, want := keys("create_ticket"), "create_ticket/new create_ticket/mid create_ticket/old"; got != want {
		t.Errorf("create_ticket: %s, want %s", got, want)
	}
	if got, want := keys(""), "create_ticket/new create_ticket/mid create_ticket/old refund_payment/r2 refund_payment/r1"; got != want {
		t.Errorf("every tool: %s, want %s", got, want)
	}
	if got := keys("send_fax"); got != "" {
		t.Errorf("a tool without canaries: %s", got)
	}
}

// Removing returns the canary removed and audits it with the remover's
// actor and reason and what was removed; removing it again is ErrNotFound
// and writes nothing. Another tool's canary of the same key stays.
func TestRemoveCanaryAuditsAndAbsentIsNotFound(t *testing.T) {
	t.Parallel()
	db := pgtest.New(t)
	added := addCanaryOK(t, db, Canary{Tool: "create_ticket", Key: "k", Reason: "kept for the purpose", Actor: "alice"})
	addCanaryOK(t, db, Canary{Tool: "create_ticket_v2", Key: "k", Reason: "same ticket, new tool", Actor: "alice"})

	got, err := RemoveCanary(context.Background(), db.Pool, "create_ticket", "k", "bob", "the ticket was archived")
	if err != nil {
		t.Fatal(err)
	}
	if got.Actor != "alice" || got.Reason != "kept for the purpose" || !got.CreatedAt.Equal(added.CreatedAt) {
		t.Errorf("removed %+v, want %+v", got, added)
	}
	if n := db.Count(t, "probe_canaries WHERE tool = 'create_ticket'"); n != 0 {
		t.Errorf("%d canaries of create_ticket left", n)
	}
	if n := db.Count(t, "probe_canaries WHERE tool = 'create_ticket_v2' AND key = 'k'"); n != 1 {
		t.Error("removing create_ticket's canary removed create_ticket_v2's")
	}
	rows := auditOf(t, db, "k", "canary_removed")
	if len(rows) != 1 || rows[0].Tool != "create_ticket" || rows[0].Actor != "bob" || rows[0].Error != "the ticket was archived" {
		t.Fatalf("audit rows %+v", rows)
	}
	var ev struct {
		AddedBy      string `json:"added_by"`
		AddedBecause string `json:"added_because"`
	}
	if err := json.Unmarshal(rows[0].Evidence, &ev); err != nil || ev.AddedBy != "alice" || ev.AddedBecause != "kept for the purpose" {
		t.Errorf("evidence %s (%v)", rows[0].Evidence, err)
	}

	audit := tableDigest(t, db, "reconcile_audit")
	if _, err := RemoveCanary(context.Background(), db.Pool, "create_ticket", "k", "bob", "again"); !errors.Is(err, ledger.ErrNotFound) {
		t.Errorf("removing an absent canary: %v, want ErrNotFound", err)
	}
	if tableDigest(t, db, "reconcile_audit") != audit {
		t.Error("removing an absent canary wrote an audit row")
	}
	if _, err := RemoveCanary(context.Background(), db.Pool, "create_ticket_v2", "k", "bob", ""); !errors.Is(err, ledger.ErrInvalid) {
		t.Errorf("removing without a reason: %v, want ErrInvalid", err)
	}
}

// Canaries are operator-maintained: purging their key's expired row and
// every daemon-table trim leave them, however old.
func TestPurgeLeavesCanaries(t *testing.T) {
	t.Parallel()
	db := pgtest.New(t)
	bg := context.Background()
	db.Exec(t, `INSERT INTO idempotency_keys (key, tool, request_hash, request_body, status, created_at, claimed_at, updated_at, expires_at)
		VALUES ('k', 'create_ticket', 'h', '{"a":1}', 'completed', now() - interval '400 days', now() - interval '400 days',
			now() - interval '400 days', now() - interval '300 days')`)
	addCanaryOK(t, db, Canary{Tool: "create_ticket", Key: "k", Reason: "kept", Actor: "alice"})
	db.Exec(t, `UPDATE probe_canaries SET created_at = now() - interval '400 days'`)
	canaries := tableDigest(t, db, "probe_canaries")

	res, err := PurgeExpiredBatch(bg, db.Pool, PurgePolicy{MinAge: time.Hour}, PurgeCursor{}, 100)
	if err != nil || res.Keys != 1 {
		t.Fatalf("purge: %+v %v", res, err)
	}
	for _, table := range DaemonTables {
		if _, err := PurgeDaemonBatch(bg, db.Pool, table, time.Second, 1000); err != nil {
			t.Fatalf("trim %s: %v", table, err)
		}
	}
	if tableDigest(t, db, "probe_canaries") != canaries {
		t.Error("a purge changed probe_canaries")
	}
	if db.Count(t, "idempotency_keys") != 0 {
		t.Error("the key was not purged: the test proves nothing")
	}
}

// NewestGroundTruth takes the tool's newest key its tool server completed
// itself, at any age: not one the reconciler or an operator completed,
// not an excluded one, not another tool's, not a processing or
// failed_retryable one.
func TestNewestGroundTruthSkipsWhatIsNotGroundTruth(t *testing.T) {
	t.Parallel()
	db := pgtest.New(t)
	const tool = "create_ticket"
	ledgerKey(t, db, "ancient", tool, ledger.StatusCompleted, 400*24*time.Hour, "")
	ledgerKey(t, db, "older", tool, ledger.StatusCompleted, 500*24*time.Hour, "")
	ledgerKey(t, db, "excluded", tool, ledger.StatusCompleted, 200*24*time.Hour, "")
	for i, action := range notGroundTruthActions {
		key := "by-" + action
		ledgerKey(t, db, key, tool, ledger.StatusCompleted, time.Duration(10+i)*24*time.Hour, "")
		db.Exec(t, `INSERT INTO reconcile_audit (key, tool, attempt, verdict, action, actor) VALUES ($1, $2, 1, 'found', $3, 'r')`, key, tool, action)
	}
	// A key its original attempt completed while the reconciler probed it
	// is ground truth (the probe decided nothing).
	ledgerKey(t, db, "probed-then-completed", tool, ledger.StatusCompleted, 300*24*time.Hour, "")
	db.Exec(t, `INSERT INTO reconcile_audit (key, tool, attempt, verdict, action, actor) VALUES ('probed-then-completed', $1, 1, 'unknown', 'backoff', 'r')`, tool)
	ledgerKey(t, db, "processing", tool, ledger.StatusProcessing, time.Minute, "")
	ledgerKey(t, db, "retryable", tool, ledger.StatusFailedRetryable, 2*time.Minute, "")
	ledgerKey(t, db, "other-tool", "refund_payment", ledger.StatusCompleted, time.Minute, "")

	for _, c := range []struct {
		name    string
		tool    string
		exclude []string
		want    string // "" for none
	}{
		{"nil exclude", tool, nil, "excluded"},
		{"excluding", tool, []string{"excluded"}, "probed-then-completed"},
		{"excluding two", tool, []string{"excluded", "probed-then-completed"}, "ancient"},
		{"excluding the newest three", tool, []string{"excluded", "probed-then-completed", "ancient"}, "older"},
		{"none left", tool, []string{"excluded", "probed-then-completed", "ancient", "older"}, ""},
		{"a tool with no key", "send_fax", nil, ""},
	} {
		k, ok, err := NewestGroundTruth(context.Background(), db.Pool, c.tool, c.exclude)
		if err != nil {
			t.Fatalf("%s: %v", c.name, err)
		}
		if ok != (c.want != "") || k.Key != c.want {
			t.Errorf("%s: %q %v, want %q", c.name, k.Key, ok, c.want)
		}
		if ok && (k.Tool != c.tool || k.Status != ledger.StatusCompleted) {
			t.Errorf("%s: %+v", c.name, k)
		}
	}
}

// On a ledger of some size, NewestGroundTruth is a backward scan of the
// (tool, created_at) index that stops at its first match, never a scan
// of the table and a sort.
func TestNewestGroundTruthIsABackwardIndexScan(t *testing.T) {
	t.Parallel()
	db := pgtest.New(t)
	db.Exec(t, `INSERT INTO idempotency_keys (key, tool, request_hash, status, created_at, claimed_at, updated_at, expires_at)
		SELECT 'k' || i, 'tool' || (i % 5), 'h', CASE WHEN i % 10 = 0 THEN 'processing' ELSE 'completed' END,
			now() - i * interval '1 minute', now() - i * interval '1 minute', now() - i * interval '1 minute', now() + interval '1 day'
		FROM generate_series(1, 20000) i`)
	db.Exec(t, `INSERT INTO reconcile_audit (key, tool, attempt, verdict, action, actor)
		SELECT 'k' || i, 'tool' || (i % 5), 1, 'found', 'completed', 'r' FROM generate_series(1, 20000, 7) i`)
	db.Exec(t, `ANALYZE idempotency_keys`)
	db.Exec(t, `ANALYZE reconcile_audit`)

	rows, err := db.Pool.Query(context.Background(), `EXPLAIN `+newestGroundTruth, "tool3", []string{"k3", "k8"}, notGroundTruthActions)
	if err != nil {
		t.Fatal(err)
	}
	var plan []string
	for rows.Next() {
		var line string
		if err := rows.Scan(&line); err != nil {
			t.Fatal(err)
		}
		plan = append(plan, line)
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	text := strings.Join(plan, "\n")
	if pgtest.Citus() {
		// Each shard's task is the backward scan; the coordinator sorts
		// the shards' first rows (one each) to pick the newest.
		_, task, _ := strings.Cut(text, "->  Task")
		if !strings.Contains(task, "Index Scan Backward using idempotency_keys_tool_created_idx_") || strings.Contains(task, "Sort") {
			t.Errorf("a shard's plan is not a backward scan of idempotency_keys_tool_created_idx:\n%s", text)
		}
	} else if !strings.Contains(text, "Index Scan Backward using idempotency_keys_tool_created_idx on idempotency_keys") || strings.Contains(text, "Sort") {
		t.Errorf("plan is not a backward scan of idempotency_keys_tool_created_idx:\n%s", text)
	}
	k, ok, err := NewestGroundTruth(context.Background(), db.Pool, "tool3", []string{"k3", "k8"})
	if err != nil || !ok || k.Key != "k13" {
		t.Errorf("newest ground truth of tool3: %q %v %v, want k13", k.Key, ok, err)
	}
}
