package daemon

import (
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/ledgerkeeper/ledgerkeeper/console"
	"github.com/ledgerkeeper/ledgerkeeper/internal/pgtest"
)

// serve's console is given the engine's probe pauses and shows them on the
// overview; the standalone console (no option: no engine) shows the
// ledger's only.
func TestServesConsoleShowsTheEnginesProbePauses(t *testing.T) {
	c, err := settle(t, "http: {listen: \"127.0.0.1:9464\"}\nconsole: {auth: none}\n", envOf(nil))
	if err != nil {
		t.Fatal(err)
	}
	db := pgtest.New(t)
	db.Exec(t, `INSERT INTO idempotency_keys (key, tool, request_hash, claimed_at, expires_at) VALUES ('k', 'create_ticket', 'h', now(), now() + interval '1 day')`)
	until := time.Now().Add(time.Hour).UTC()
	logger := slog.New(slog.NewTextHandler(io.Discard, nil))
	routes, err := ConsoleRoutes(c, db.Pool, nil, logger, nil,
		WithProbePauses(func() map[string]time.Time { return map[string]time.Time{"create_ticket": until} }))
	if err != nil {
		t.Fatal(err)
	}
	overview := func(h http.Handler) string {
		t.Helper()
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, httptest.NewRequest(http.MethodGet, console.Path, nil))
		if rec.Code != http.StatusOK {
			t.Fatalf("overview: %d\n%s", rec.Code, rec.Body.String())
		}
		return rec.Body.String()
	}
	if page := overview(routes[console.Path]); !strings.Contains(page, "Probing paused until "+until.Format("2006-01-02 15:04:05 UTC")) {
		t.Errorf("serve's overview lacks the engine's pause:\n%s", page)
	}
	alone, err := BuildConsole(c, db.Pool, nil, c.Console.Listen, logger)
	if err != nil {
		t.Fatal(err)
	}
	if page := overview(alone); strings.Contains(page, "Probing paused") {
		t.Errorf("the standalone overview on pauses:\n%s", page)
	}
}
