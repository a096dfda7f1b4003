package daemon

import (
	"log/slog"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/ledgerkeeper/ledgerkeeper/console"
	"github.com/ledgerkeeper/ledgerkeeper/internal/pgtest"
	"github.com/ledgerkeeper/ledgerkeeper/ledger"
	"github.com/ledgerkeeper/ledgerkeeper/migrations"
)

const fleetLedgersYAML = `ledgers:
  billing: {schema: billing}
  support: {schema: support}
`

// A grant limited to a ledger names one of the configuration's: an unknown
// one is refused at its entry with the nearest name; its action is checked
// as an unlimited one is. Each error is reported once, not once more per
// ledger that inherits the console section.
func TestConsoleGrantsNameAConfiguredLedger(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name, yaml string
		want       []string
	}{
		{name: "fleet grants", yaml: fleetLedgersYAML + `console:
  operators: {alice: ["billing:hold", "support:*", release], bob: []}
`},
		{name: "one ledger is the default", yaml: `console:
  operators: {alice: ["default:hold", "default:*"]}
`},
		{name: "unknown ledgers and actions", yaml: fleetLedgersYAML + `console:
  operators: {alice: ["biling:hold", "support:fly", "Support:hold", "support:hold", "support:hold"]}
`, want: []string{
			`lk.yaml:5: console.operators.alice[0]: "biling:hold": no ledger "biling" in the configuration (did you mean "billing"?)`,
			`lk.yaml:5: console.operators.alice[1]: "support:fly": unknown action "fly"`,
			`lk.yaml:5: console.operators.alice[2]: "Support:hold": "Support" is not a ledger's name`,
			`lk.yaml:5: console.operators.alice[4]: action "support:hold" listed twice`,
		}},
		{name: "a ledger of a configuration without ledgers", yaml: `console:
  operators: {alice: ["billing:hold"]}
`, want: []string{`lk.yaml:2: console.operators.alice[0]: "billing:hold": no ledger "billing" in the configuration (known: default)`}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			_, err := settle(t, tc.yaml, envOf(nil))
			if len(tc.want) == 0 {
				if err != nil {
					t.Fatalf("refused: %v", err)
				}
				return
			}
			if err == nil {
				t.Fatal("accepted")
			}
			for _, w := range tc.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("missing %q in:\n%v", w, err)
				}
			}
			if n := strings.Count(err.Error(), "\n") + 1; n != len(tc.want) {
				t.Errorf("%d errors, want %d:\n%v", n, len(tc.want), err)
			}
		})
	}
}

// serve's console of a fleet, as cmd_serve builds it: each ledger on its
// own schema-qualified pool with its own options, the grants of
// console.operators per ledger, the actor naming the ledger.
func TestFleetConsoleRoutesServeEachLedgerWithItsGrantsAndOptions(t *testing.T) {
	c, err := settle(t, fleetLedgersYAML+`http: {listen: "127.0.0.1:9464"}
console:
  auth: proxy
  proxy_header: X-User
  proxy_cidrs: [192.0.2.0/24]
  operators: {alice: ["billing:hold"], carol: ["support:*"]}
`, envOf(nil))
	if err != nil {
		t.Fatal(err)
	}
	db := pgtest.NewEmpty(t)
	var targets []LedgerTarget
	for _, l := range c.Ledgers() {
		if _, err := migrations.Apply(t.Context(), db.Pool, migrations.Options{Schema: l.Database.Schema}); err != nil {
			t.Fatal(err)
		}
		pool, err := ledger.InSchema(db.Pool, l.Database.Schema)
		if err != nil {
			t.Fatal(err)
		}
		targets = append(targets, LedgerTarget{Name: l.Name, Config: l.Config, Pool: pool})
		db.Exec(t, `INSERT INTO `+l.Database.Schema+`.idempotency_keys (key, tool, request_hash, expires_at) VALUES ('k-1', 't', 'h', now() + interval '1 day')`)
	}
	pausedUntil := time.Now().Add(time.Hour)
	asked := map[string]int{}
	routes, err := FleetConsoleRoutes(c, targets, slog.New(slog.DiscardHandler), map[string]http.Handler{"/metrics": http.NotFoundHandler()},
		func(name string) []ConsoleOption {
			asked[name]++
			if name != "billing" {
				return nil
			}
			return []ConsoleOption{WithProbePauses(func() map[string]time.Time { return map[string]time.Time{"paused_tool": pausedUntil} })}
		})
	if err != nil {
		t.Fatal(err)
	}
	if asked["billing"] != 1 || asked["support"] != 1 || routes["/metrics"] == nil {
		t.Fatalf("options asked %v; routes %v", asked, routes)
	}
	h := routes[console.Path]
	do := func(user, method, path string, form url.Values) *httptest.ResponseRecorder {
		var req *http.Request
		if form != nil {
			req = httptest.NewRequest(method, path, strings.NewReader(form.Encode()))
			req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
		} else {
			req = httptest.NewRequest(method, path, nil)
		}
		req.Header.Set("X-User", user)
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, req)
		return rec
	}
	holds := func(schema string) int { return db.Count(t, schema+".key_holds") }
	hold := url.Values{"key": {"k-1"}, "reason": {"INC-9"}, "confirm": {"yes"}}

	if rec := do("alice", http.MethodPost, "/ui/ledgers/support/key/hold", hold); rec.Code != http.StatusForbidden || holds("support") != 0 {
		t.Fatalf("alice's hold on support: %d, %d hold(s)\n%s", rec.Code, holds("support"), rec.Body)
	}
	if rec := do("alice", http.MethodPost, "/ui/ledgers/billing/key/hold", hold); rec.Code != http.StatusSeeOther {
		t.Fatalf("alice's hold on billing: %d\n%s", rec.Code, rec.Body)
	}
	if n := db.Count(t, `billing.key_holds WHERE actor = 'console:alice (ledger billing)'`); n != 1 || holds("support") != 0 {
		t.Errorf("after alice's hold: billing %d by alice, support %d", n, holds("support"))
	}
	if rec := do("carol", http.MethodPost, "/ui/ledgers/support/key/hold", hold); rec.Code != http.StatusSeeOther || holds("support") != 1 {
		t.Errorf("carol's hold on support: %d, %d hold(s)", rec.Code, holds("support"))
	}
	if rec := do("bob", http.MethodGet, "/ui/ledgers/nope/", nil); rec.Code != http.StatusNotFound {
		t.Errorf("an unknown ledger: %d", rec.Code)
	}
	// Each ledger's own options: billing's engine's pause shows on
	// billing's overview only.
	if rec := do("bob", http.MethodGet, "/ui/ledgers/billing/", nil); !strings.Contains(rec.Body.String(), "paused_tool") {
		t.Errorf("billing's overview lacks its engine's pause:\n%s", rec.Body)
	}
	if rec := do("bob", http.MethodGet, "/ui/ledgers/support/", nil); rec.Code != http.StatusOK || strings.Contains(rec.Body.String(), "paused_tool") {
		t.Errorf("support's overview: %d, shows billing's pause:\n%s", rec.Code, rec.Body)
	}
	if rec := do("bob", http.MethodGet, "/ui/", nil); rec.Code != http.StatusOK || !strings.Contains(rec.Body.String(), `href="/ui/ledgers/support/"`) {
		t.Errorf("the fleet's overview: %d\n%s", rec.Code, rec.Body)
	}
}

// Without a ledgers section FleetConsoleRoutes is ConsoleRoutes: the one
// ledger's console at /ui/, its actor unchanged.
func TestFleetConsoleRoutesOfOneLedgerIsTheConsoleAsEver(t *testing.T) {
	c, err := settle(t, `http: {listen: "127.0.0.1:9464"}
console: {auth: none, operators: {local: ["default:hold"]}}
`, envOf(nil))
	if err != nil {
		t.Fatal(err)
	}
	db := pgtest.New(t)
	db.Exec(t, `INSERT INTO idempotency_keys (key, tool, request_hash, expires_at) VALUES ('k-1', 't', 'h', now() + interval '1 day')`)
	routes, err := FleetConsoleRoutes(c, []LedgerTarget{{Name: "default", Config: c, Pool: db.Pool}}, slog.New(slog.DiscardHandler), nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	req := httptest.NewRequest(http.MethodPost, "/ui/key/hold", strings.NewReader("key=k-1&reason=r&confirm=yes"))
	req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	rec := httptest.NewRecorder()
	routes[console.Path].ServeHTTP(rec, req)
	if rec.Code != http.StatusSeeOther || rec.Header().Get("Location") != "/ui/key?key=k-1&done=hold" {
		t.Fatalf("hold: %d %q\n%s", rec.Code, rec.Header().Get("Location"), rec.Body)
	}
	if n := db.Count(t, `key_holds WHERE actor = 'console:local'`); n != 1 {
		t.Errorf("holds by console:local: %d, want 1", n)
	}
}
