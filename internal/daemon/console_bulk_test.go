package daemon

import (
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/ledgerkeeper/ledgerkeeper/console"
	"github.com/ledgerkeeper/ledgerkeeper/internal/pgtest"
)

// console.bulk_limit reaches the console's bulk actions: a filter selecting
// more keys is refused; the default is console's, and the bounds are
// refused at the setting.
func TestConsoleBulkLimitBoundsTheBulkActions(t *testing.T) {
	def, err := settle(t, "", envOf(nil))
	if err != nil {
		t.Fatal(err)
	}
	if def.Console.BulkLimit != console.DefaultBulkLimit {
		t.Errorf("console.bulk_limit defaults to %d, want console.DefaultBulkLimit %d", def.Console.BulkLimit, console.DefaultBulkLimit)
	}
	for in, want := range map[string]string{
		"-1":                                 "console.bulk_limit: must be at least 1, got -1",
		fmt.Sprint(console.MaxBulkLimit + 1): fmt.Sprintf("console.bulk_limit: at most %d, got %d", console.MaxBulkLimit, console.MaxBulkLimit+1),
	} {
		if _, err := settle(t, "console:\n  bulk_limit: "+in+"\n", envOf(nil)); err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("bulk_limit %s: %v, want %q", in, err, want)
		}
	}

	c, err := settle(t, "console: {auth: none, operators: {local: []}, bulk_limit: 2}\n", envOf(nil))
	if err != nil {
		t.Fatal(err)
	}
	db := pgtest.New(t)
	db.Exec(t, `INSERT INTO idempotency_keys (key, tool, request_hash, expires_at)
		SELECT 'b-' || g, 't', 'h', now() + interval '1 day' FROM generate_series(1, 3) g`)
	h, err := BuildConsole(c, db.Pool, nil, "127.0.0.1:9465", nil)
	if err != nil {
		t.Fatal(err)
	}
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, httptest.NewRequest(http.MethodGet, "/ui/bulk?action=hold&prefix=b-", nil))
	if rec.Code != http.StatusOK || !strings.Contains(rec.Body.String(), "More than 2 keys (console.bulk_limit)") {
		t.Errorf("3 keys under bulk_limit 2: %d\n%s", rec.Code, rec.Body.String())
	}
}
