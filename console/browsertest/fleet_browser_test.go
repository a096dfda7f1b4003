package browsertest

import (
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/chromedp"
	"golang.org/x/crypto/bcrypt"

	"github.com/ledgerkeeper/ledgerkeeper/console"
	"github.com/ledgerkeeper/ledgerkeeper/internal/pgtest"
	"github.com/ledgerkeeper/ledgerkeeper/ledger"
	"github.com/ledgerkeeper/ledgerkeeper/migrations"
)

// serveFleet starts a fleet's console of billing and support, each in its
// own schema of one database with a stuck key of its own; alice may do
// everything on billing only.
func serveFleet(t *testing.T) (*pgtest.DB, string) {
	t.Helper()
	db := pgtest.NewEmpty(t)
	users := map[string][]byte{}
	for u, p := range passwords {
		h, err := bcrypt.GenerateFromPassword([]byte(p), bcrypt.MinCost)
		if err != nil {
			t.Fatal(err)
		}
		users[u] = h
	}
	var ledgers []console.FleetLedger
	for _, name := range []string{"billing", "support"} {
		if _, err := migrations.Apply(t.Context(), db.Pool, migrations.Options{Schema: name}); err != nil {
			t.Fatal(err)
		}
		db.Exec(t, `INSERT INTO `+name+`.idempotency_keys (key, tool, request_hash, created_at, claimed_at, expires_at)
			VALUES ($1, $2, 'h', now() - interval '1 hour', now() - interval '1 hour', now() + interval '1 day')`, name+"-stuck", tool)
		pool, err := ledger.InSchema(db.Pool, name)
		if err != nil {
			t.Fatal(err)
		}
		ops, err := console.OperatorsOn(map[string][]string{"alice": {"billing:*"}}, name)
		if err != nil {
			t.Fatal(err)
		}
		ledgers = append(ledgers, console.FleetLedger{Name: name, Config: console.Config{Pool: pool, Operators: ops,
			Windows: func(string) (time.Duration, time.Duration) { return time.Minute, time.Minute }}})
	}
	f, err := console.NewFleet(console.Config{Auth: console.AuthBasic, Users: users, Logger: slog.New(slog.DiscardHandler)}, ledgers)
	if err != nil {
		t.Fatal(err)
	}
	mux := http.NewServeMux()
	mux.Handle(console.Path, f)
	srv := httptest.NewServer(mux)
	t.Cleanup(srv.Close)
	return db, srv.URL
}

// An operator signs in once, goes from the fleet's overview to billing's
// stuck keys, switches to the same page of support (the filter kept) and
// sees support's key there and no hold form, since the grant is billing's;
// every page passes axe.
func TestOperatorSwitchesLedgersKeepingThePage(t *testing.T) {
	axe := axeScript(t)
	_, base := serveFleet(t)
	alice := browser(t, "alice")
	do(t, alice, "open the fleet's overview",
		chromedp.Navigate(base+"/ui/"),
		chromedp.WaitVisible(chromedp.CSS(`a.stuck[href="/ui/ledgers/billing/"]`)),
	)
	axeOn(t, alice, axe, "the fleet's overview")
	stuckKeys := `a.stuck[href="/ui/ledgers/billing/keys?tool=` + tool + `&stuck=1"]`
	do(t, alice, "open billing's overview and its stuck keys",
		follow(`a.stuck[href="/ui/ledgers/billing/"]`),
		chromedp.WaitVisible(chromedp.CSS(stuckKeys)),
	)
	axeOn(t, alice, axe, "billing's overview")
	do(t, alice, "open billing's stuck keys",
		follow(stuckKeys),
		chromedp.WaitVisible(chromedp.CSS(`a[href="/ui/ledgers/billing/key?key=billing-stuck"]`)),
	)
	axeOn(t, alice, axe, "billing's keys")
	current := get(t, alice, "the switcher's current ledger", chromedp.Text(chromedp.CSS(`nav.ledgers a[aria-current="page"]`)))
	if current != "billing" {
		t.Errorf("the switcher marks %q", current)
	}
	do(t, alice, "switch to support",
		follow(`nav.ledgers a[href="/ui/ledgers/support/keys?stuck=1&tool=`+tool+`"]`),
		chromedp.WaitVisible(chromedp.CSS(`a[href="/ui/ledgers/support/key?key=support-stuck"]`)),
	)
	main := get(t, alice, "support's keys", chromedp.Text(chromedp.CSS("main")))
	if strings.Contains(main, "billing-stuck") || !strings.Contains(main, "stuck only") {
		t.Errorf("support's stuck keys page:\n%s", main)
	}
	current = get(t, alice, "the switcher's current ledger", chromedp.Text(chromedp.CSS(`nav.ledgers a[aria-current="page"]`)))
	if current != "support" {
		t.Errorf("the switcher marks %q after switching", current)
	}
	do(t, alice, "open support's key",
		follow(`a[href="/ui/ledgers/support/key?key=support-stuck"]`),
		chromedp.WaitVisible(chromedp.CSS("#condition")),
	)
	forms := get(t, alice, "support's key forms", chromedp.Evaluate[int](`document.querySelectorAll('form[method="post"]').length`))
	if forms != 0 {
		t.Errorf("support's key page offers alice %d action form(s), her grant is billing's", forms)
	}
	axeOn(t, alice, axe, "support's key")
	do(t, alice, "open billing's key",
		chromedp.Navigate(base+"/ui/ledgers/billing/key?key=billing-stuck"),
		chromedp.WaitVisible(chromedp.CSS(`form[action="/ui/ledgers/billing/key/hold"]`)),
	)
	axeOn(t, alice, axe, "billing's key")
}
