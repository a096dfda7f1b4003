package console

import (
	"log/slog"
	"net/http"
	"net/http/httptest"
	"net/url"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/ledgerkeeper/ledgerkeeper/internal/pgtest"
	"github.com/ledgerkeeper/ledgerkeeper/ledger"
	"github.com/ledgerkeeper/ledgerkeeper/migrations"
)

// fleetLedgers are the two ledgers of the fleet tests, each in its own
// schema of one database.
var fleetLedgers = []string{"billing", "support"}

// newFleetRig serves a fleet's console of billing and support, each
// migrated into its own schema of one database whose default schema has
// no ledger (a statement left to search_path fails). ops are
// console.operators' grants.
func newFleetRig(t *testing.T, ops map[string][]string) *rig {
	t.Helper()
	db := pgtest.NewEmpty(t)
	r := &rig{db: db, logs: &syncLog{}}
	var fl []FleetLedger
	for _, name := range fleetLedgers {
		if _, err := migrations.Apply(bg, db.Pool, migrations.Options{Schema: name}); err != nil {
			t.Fatalf("migrate %s: %v", name, err)
		}
		pool, err := ledger.InSchema(db.Pool, name)
		if err != nil {
			t.Fatal(err)
		}
		granted, err := OperatorsOn(ops, name)
		if err != nil {
			t.Fatal(err)
		}
		fl = append(fl, FleetLedger{Name: name, Config: Config{Pool: pool, Operators: granted, Windows: cWindows}})
	}
	f, err := NewFleet(Config{Auth: AuthBasic, Users: hashes(t), Logger: slog.New(slog.NewTextHandler(r.logs, nil))}, fl)
	if err != nil {
		t.Fatal(err)
	}
	mux := http.NewServeMux()
	mux.Handle(Path, f)
	r.srv = httptest.NewServer(mux)
	t.Cleanup(r.srv.Close)
	return r
}

// putIn inserts key into ledger's schema, processing, claimed ago.
func (r *rig) putIn(t *testing.T, schema, key string, ago time.Duration) {
	t.Helper()
	r.db.Exec(t, `INSERT INTO `+schema+`.idempotency_keys (key, tool, request_hash, request_body, status, created_at, claimed_at, expires_at)
		VALUES ($1, $2, 'h', '{}', 'processing', now() - $3::interval, now() - $3::interval, now() + interval '1 day')`, key, cTool, ago)
}

func (r *rig) claimIn(t *testing.T, schema, key string) string {
	t.Helper()
	var at time.Time
	if err := r.db.Pool.QueryRow(bg, `SELECT claimed_at FROM `+schema+`.idempotency_keys WHERE key = $1`, key).Scan(&at); err != nil {
		t.Fatal(err)
	}
	return at.UTC().Format(time.RFC3339Nano)
}

func TestAFleetsLedgerPagesShowThatLedgersKeysOnly(t *testing.T) {
	r := newFleetRig(t, nil)
	r.putIn(t, "billing", "bill-1", time.Minute)
	r.putIn(t, "support", "supp-1", time.Minute)

	keys := r.get(t, "bob", "/ui/ledgers/billing/keys")
	wantStatus(t, keys, http.StatusOK)
	wantIn(t, keys.Body, `href="/ui/ledgers/billing/key?key=bill-1"`)
	wantNotIn(t, keys.Body, "supp-1")
	other := r.get(t, "bob", "/ui/ledgers/support/keys")
	wantStatus(t, other, http.StatusOK)
	wantIn(t, other.Body, `href="/ui/ledgers/support/key?key=supp-1"`)
	wantNotIn(t, other.Body, "bill-1")
	// A key of the other ledger is not found here.
	wantStatus(t, r.get(t, "bob", "/ui/ledgers/billing/key?key=supp-1"), http.StatusNotFound)
	wantStatus(t, r.get(t, "bob", "/ui/ledgers/support/key?key=supp-1"), http.StatusOK)
}

func TestAnUnknownLedgerIsNotFound(t *testing.T) {
	r := newFleetRig(t, nil)
	for _, p := range []string{"/ui/ledgers/nope/keys", "/ui/ledgers/nope/", "/ui/ledgers/Billing/", "/ui/keys"} {
		resp := r.get(t, "bob", p)
		wantStatus(t, resp, http.StatusNotFound)
		// The page offers the ledgers there are.
		wantIn(t, resp.Body, `href="/ui/ledgers/billing/"`, `href="/ui/ledgers/support/"`)
	}
	wantIn(t, r.get(t, "bob", "/ui/ledgers/nope/keys").Body, `No ledger &#34;nope&#34;`)
	post := r.post(t, "alice", "/ui/ledgers/nope/key/hold", url.Values{"key": {"k"}, "reason": {"x"}, "confirm": {"yes"}})
	wantStatus(t, post, http.StatusNotFound)
}

// A hold on billing's page holds billing's key and not support's key of
// the same name; the audit trail names the ledger through the actor.
func TestAHoldOnOneLedgerChangesThatLedgerOnly(t *testing.T) {
	r := newFleetRig(t, map[string][]string{"alice": {"billing:hold"}})
	r.putIn(t, "billing", "k-shared", time.Minute)
	r.putIn(t, "support", "k-shared", time.Minute)

	confirm := r.post(t, "alice", "/ui/ledgers/billing/key/hold", url.Values{"key": {"k-shared"}, "reason": {"INC-7"}})
	wantStatus(t, confirm, http.StatusOK)
	wantIn(t, confirm.Body, `action="/ui/ledgers/billing/key/hold"`, `href="/ui/ledgers/billing/key?key=k-shared"`, "audited as console:alice (ledger billing)")
	resp := r.post(t, "alice", "/ui/ledgers/billing/key/hold", url.Values{"key": {"k-shared"}, "reason": {"INC-7"}, "confirm": {"yes"}})
	wantStatus(t, resp, http.StatusSeeOther)
	if loc := resp.Header.Get("Location"); !strings.HasPrefix(loc, "/ui/ledgers/billing/key?key=k-shared") {
		t.Errorf("redirect to %q, want billing's key page", loc)
	}
	if n := r.count(t, `billing.key_holds WHERE key = 'k-shared' AND actor = 'console:alice (ledger billing)'`); n != 1 {
		t.Errorf("billing's holds by alice on billing: %d, want 1", n)
	}
	if n := r.count(t, `support.key_holds`); n != 0 {
		t.Errorf("support's holds: %d, want 0", n)
	}
	if n := r.count(t, `billing.reconcile_audit WHERE key = 'k-shared' AND actor = 'console:alice (ledger billing)'`); n != 1 {
		t.Errorf("billing's audit rows by alice on billing: %d, want 1", n)
	}
	if n := r.count(t, `support.reconcile_audit`); n != 0 {
		t.Errorf("support's audit rows: %d, want 0", n)
	}
	page := r.get(t, "alice", "/ui/ledgers/billing/key?key=k-shared")
	wantIn(t, page.Body, "held by console:alice (ledger billing)")
}

// A user granted every action on support only is refused each action on
// billing, 403 and nothing written, and may act on support.
func TestAGrantOnOneLedgerDoesNotReachAnother(t *testing.T) {
	r := newFleetRig(t, map[string][]string{"carol": {"support:*"}})
	r.putIn(t, "billing", "k-1", time.Hour)
	r.putIn(t, "support", "k-1", time.Hour)
	r.db.Exec(t, `INSERT INTO billing.key_holds (key, reason, actor) VALUES ('k-held', 'x', 'bob')`)

	claim := r.claimIn(t, "billing", "k-1")
	for _, a := range []struct {
		path string
		form url.Values
	}{
		{"key/hold", url.Values{"key": {"k-1"}, "reason": {"r"}, "confirm": {"yes"}}},
		{"key/release", url.Values{"key": {"k-held"}, "confirm": {"yes"}}},
		{"key/retryable", url.Values{"key": {"k-1"}, "reason": {"r"}, "claimed_at": {claim}, "confirm": {"yes"}}},
		{"key/outcome", url.Values{"key": {"k-1"}, "code": {"201"}, "body": {`{"id":1}`}, "reason": {"r"}, "claimed_at": {claim}, "confirm": {"yes"}}},
		{"key/reconcile", url.Values{"key": {"k-1"}}},
		{"bulk/hold", url.Values{"held": {"no"}, "count": {"1"}, "reason": {"r"}, "confirm_text": {"hold 1"}}},
	} {
		resp := r.post(t, "carol", "/ui/ledgers/billing/"+a.path, a.form)
		wantStatus(t, resp, http.StatusForbidden)
		wantIn(t, resp.Body, "not granted", "on ledger billing")
	}
	if n := r.count(t, `billing.key_holds`); n != 1 {
		t.Errorf("billing's holds: %d, want the one there was", n)
	}
	if n := r.count(t, `billing.idempotency_keys WHERE status <> 'processing'`); n != 0 {
		t.Errorf("billing's keys resolved: %d", n)
	}
	if n := r.count(t, `billing.reconcile_audit`); n != 0 {
		t.Errorf("billing's audit rows: %d", n)
	}
	// Billing's key page offers carol no action; support's does.
	wantNotIn(t, r.get(t, "carol", "/ui/ledgers/billing/key?key=k-1").Body, `action="/ui/ledgers/billing/key/hold"`)
	wantIn(t, r.get(t, "carol", "/ui/ledgers/support/key?key=k-1").Body, `action="/ui/ledgers/support/key/hold"`)

	resp := r.post(t, "carol", "/ui/ledgers/support/key/hold", url.Values{"key": {"k-1"}, "reason": {"r"}, "confirm": {"yes"}})
	wantStatus(t, resp, http.StatusSeeOther)
	if n := r.count(t, `support.key_holds WHERE actor = 'console:carol (ledger support)'`); n != 1 {
		t.Errorf("support's holds by carol: %d, want 1", n)
	}
}

// urlAttr finds the URLs a page links, posts or loads.
var urlAttr = regexp.MustCompile(`(?:href|action|src|data-src)="([^"]*)"`)

// Every link, form, asset and the live part's URL of a ledger's page is
// under the ledger's path, but the switcher's; the switcher lists every
// ledger, each at the same page of it (its filter kept), this one marked.
func TestALedgersPagesLinkUnderItsPathAndSwitchToTheSamePageOfAnother(t *testing.T) {
	r := newFleetRig(t, map[string][]string{"alice": {}})
	r.putIn(t, "billing", "bill-1", time.Hour)
	r.putIn(t, "billing", "bill-2", time.Hour)
	r.db.Exec(t, `INSERT INTO billing.key_holds (key, reason, actor) VALUES ('bill-1', 'x', 'bob')`)
	for _, p := range []string{"", "keys?tool=" + cTool, "key?key=bill-1", "key?key=bill-2", "checks", "alerts", "runs", "bulk?action=release&held=yes"} {
		resp := r.get(t, "alice", "/ui/ledgers/billing/"+p)
		wantStatus(t, resp, http.StatusOK)
		body := resp.Body
		start := strings.Index(body, `<nav aria-label="ledgers"`)
		end := strings.Index(body[max(start, 0):], "</nav>")
		if start < 0 || end < 0 {
			t.Fatalf("%s: no ledger switcher:\n%s", p, body)
		}
		nav := body[start : start+end]
		rest := body[:start] + body[start+end:]
		var seen int
		for _, m := range urlAttr.FindAllStringSubmatch(rest, -1) {
			seen++
			if !strings.HasPrefix(m[1], "/ui/ledgers/billing/") {
				t.Errorf("%s: %s outside the ledger's path", p, m[0])
			}
		}
		if seen < 8 {
			t.Errorf("%s: only %d URLs found: the check checks nothing", p, seen)
		}
		same := strings.ReplaceAll(p, "&", "&amp;")
		wantIn(t, nav, `href="/ui/"`,
			`<a href="/ui/ledgers/billing/`+same+`" aria-current="page">billing</a>`,
			`<a href="/ui/ledgers/support/`+same+`">support</a>`)
	}
	live := r.get(t, "alice", "/ui/ledgers/billing/overview/live")
	wantStatus(t, live, http.StatusOK)
	wantIn(t, r.get(t, "alice", "/ui/ledgers/billing/").Body, `data-src="/ui/ledgers/billing/overview/live"`, `src="/ui/ledgers/billing/static/console.js"`)
	css := r.get(t, "alice", "/ui/ledgers/billing/static/console.css")
	wantStatus(t, css, http.StatusOK)
	// A list's cursor is not carried to the other ledger.
	resp := r.get(t, "alice", "/ui/ledgers/billing/keys?tool=x&after=bill-1")
	wantIn(t, resp.Body, `<a href="/ui/ledgers/support/keys?tool=x">support</a>`)
}

// The fleet's overview lists every ledger with its stuck keys.
func TestTheFleetOverviewListsEveryLedgerWithItsStuckKeys(t *testing.T) {
	r := newFleetRig(t, nil)
	r.putIn(t, "billing", "stuck-1", time.Hour)
	r.putIn(t, "billing", "stuck-2", time.Hour)
	r.putIn(t, "support", "fresh", 0)
	resp := r.get(t, "bob", "/ui/")
	wantStatus(t, resp, http.StatusOK)
	row := func(name string) string {
		i := strings.Index(resp.Body, `<th scope="row"><a href="/ui/ledgers/`+name+`/">`+name+`</a></th>`)
		if i < 0 {
			t.Fatalf("no row for %s:\n%s", name, resp.Body)
		}
		return resp.Body[i : i+strings.Index(resp.Body[i:], "</tr>")]
	}
	// Stuck is per tool: the count goes to the ledger's overview, which
	// lists it by tool.
	wantIn(t, row("billing"), `<a class="stuck" href="/ui/ledgers/billing/">2 stuck</a>`)
	wantIn(t, row("support"), `<td>0</td>`, `keys?status=processing">1</a>`)
	wantNotIn(t, row("support"), "stuck</a>")
}

// One sign-in, one cross-origin check in front of every ledger.
func TestAFleetsPagesNeedASignedInUserAndSameOriginPosts(t *testing.T) {
	r := newFleetRig(t, map[string][]string{"alice": {}})
	r.putIn(t, "billing", "k-1", time.Minute)
	for _, p := range []string{"/ui/", "/ui/ledgers/billing/", "/ui/ledgers/billing/keys", "/ui/ledgers/nope/", "/ui/static/console.css"} {
		wantStatus(t, r.get(t, "", p), http.StatusUnauthorized)
	}
	resp := r.do(t, "alice", http.MethodPost, "/ui/ledgers/billing/key/hold", url.Values{"key": {"k-1"}, "reason": {"r"}, "confirm": {"yes"}},
		map[string]string{"Sec-Fetch-Site": "cross-site"})
	wantStatus(t, resp, http.StatusForbidden)
	if n := r.count(t, `billing.key_holds`); n != 0 {
		t.Errorf("a cross-site post held %d key(s)", n)
	}
	if csp := r.get(t, "alice", "/ui/ledgers/billing/").Header.Get("Content-Security-Policy"); !strings.Contains(csp, "default-src 'none'") {
		t.Errorf("Content-Security-Policy %q", csp)
	}
}

func TestGrantsApplyToTheirLedger(t *testing.T) {
	ops := map[string][]string{
		"all":     {},
		"hold":    {"hold"},
		"billing": {"billing:*"},
		"mixed":   {"release", "billing:hold", "support:reconcile", "billing:hold"},
		"other":   {"support:hold"},
	}
	got, err := OperatorsOn(ops, "billing")
	if err != nil {
		t.Fatal(err)
	}
	want := map[string][]Action{"all": {}, "hold": {ActionHold}, "billing": {}, "mixed": {ActionRelease, ActionHold}}
	if len(got) != len(want) {
		t.Errorf("billing's operators %v, want %v", got, want)
	}
	for user, acts := range want {
		g, ok := got[user]
		if !ok || len(g) != len(acts) {
			t.Errorf("%s on billing: %v (present %v), want %v", user, g, ok, acts)
			continue
		}
		for i := range acts {
			if g[i] != acts[i] {
				t.Errorf("%s on billing: %v, want %v", user, g, acts)
			}
		}
	}
	for _, bad := range []string{"fly", "billing:fly", "Billing:hold", ":hold", "*"} {
		if _, err := ParseGrant(bad); err == nil {
			t.Errorf("grant %q accepted", bad)
		}
	}
	if _, err := OperatorsOn(map[string][]string{"x": {"billing:fly"}}, "billing"); err == nil {
		t.Error("an unknown action accepted")
	}
}
