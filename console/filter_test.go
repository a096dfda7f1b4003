package console

import (
	"net/http"
	"net/url"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/ledgerkeeper/ledgerkeeper/ledger"
)

// The keys page filters by age (claimed over a duration ago) and by the
// reconciler's attempts on the current claim (an attempt of an earlier
// claim does not count), pages a narrow filter in key order without
// losing or repeating a key, and names a malformed value.
func TestKeysFilterByAgeAndAttempts(t *testing.T) {
	r := newRig(t, func(c *Config) { c.PageSize = 2 })
	for _, k := range []string{"old-1", "old-2", "old-3", "old-4"} {
		r.putKey(t, k, ledger.StatusProcessing, 3*time.Hour)
	}
	r.putKey(t, "young", ledger.StatusProcessing, 10*time.Minute)
	r.putKey(t, "old-done", ledger.StatusCompleted, 3*time.Hour)
	// old-1 and old-3 were probed three times on this claim; old-2 three
	// times on an earlier one (the retry's claim is newer); young once.
	r.db.Exec(t, `INSERT INTO reconcile_state (key, tool, claimed_at, attempts)
		SELECT key, tool, claimed_at - CASE WHEN key = 'old-2' THEN interval '1 hour' ELSE interval '0' END,
		       CASE WHEN key = 'young' THEN 1 ELSE 3 END
		FROM idempotency_keys WHERE key IN ('old-1', 'old-2', 'old-3', 'young')`)

	aged := r.get(t, "bob", "/ui/keys?older_than=2h")
	wantStatus(t, aged, http.StatusOK)
	wantIn(t, aged.Body, "5 key(s)", `key=old-1"`, `key=old-2"`)
	wantNotIn(t, aged.Body, `key=young"`)

	// Narrow filters (processing; processing and probed) read across
	// their pages: every key once, in key order.
	for q, want := range map[string][]string{
		"status=processing":            {"old-1", "old-2", "old-3", "old-4", "young"},
		"status=processing&attempts=2": {"old-1", "old-3"},
	} {
		if got := pageThrough(t, r, q); !slices.Equal(got, want) {
			t.Errorf("%s across pages: %v, want %v", q, got, want)
		}
	}
	both := r.get(t, "bob", "/ui/keys?attempts=1&older_than=1h")
	wantIn(t, both.Body, "2 key(s)")
	wantNotIn(t, both.Body, `key=young"`, `key=old-2"`)

	for _, q := range []string{"older_than=soon", "older_than=-1h", "attempts=0", "attempts=many"} {
		bad := r.get(t, "bob", "/ui/keys?"+q)
		wantStatus(t, bad, http.StatusBadRequest)
		wantIn(t, bad.Body, "is not a")
	}
}

var listedKey = regexp.MustCompile(`<td><a href="/ui/key\?key=([^"]+)">`)

// pageThrough follows a listing's next links from its first page and
// returns the keys listed, in order.
func pageThrough(t *testing.T, r *rig, query string) []string {
	t.Helper()
	var keys []string
	next := "/ui/keys?" + query
	for range 20 {
		page := r.get(t, "bob", next)
		wantStatus(t, page, http.StatusOK)
		for _, m := range listedKey.FindAllStringSubmatch(page.Body, -1) {
			k, err := url.QueryUnescape(m[1])
			if err != nil {
				t.Fatal(err)
			}
			keys = append(keys, k)
		}
		if !strings.Contains(page.Body, `rel="next"`) {
			return keys
		}
		next = "/ui/keys?after=" + url.QueryEscape(keys[len(keys)-1]) + "&" + query
	}
	t.Fatalf("%s: more than 20 pages", query)
	return nil
}

// A bulk action's dry run keeps the age and attempts of the keys page's
// filter: the offer carries them, the dry run counts by them, and its
// form sends them back.
func TestBulkDryRunKeepsTheAgeAndAttemptsFilter(t *testing.T) {
	r := newRig(t)
	r.putKey(t, "old", ledger.StatusProcessing, 3*time.Hour)
	r.putKey(t, "young", ledger.StatusProcessing, 10*time.Minute)
	keys := r.get(t, "alice", "/ui/keys?older_than=2h")
	wantIn(t, keys.Body, `/ui/bulk?action=hold&amp;older_than=2h"`)
	dry := r.get(t, "alice", "/ui/bulk?action=hold&older_than=2h")
	wantStatus(t, dry, http.StatusOK)
	wantIn(t, dry.Body, "claimed over 2h ago", `name="older_than" value="2h"`, "old")
	wantNotIn(t, dry.Body, `key=young"`)
}
