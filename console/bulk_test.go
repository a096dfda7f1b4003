package console

import (
	"fmt"
	"html"
	"net/http"
	"net/url"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/ledgerkeeper/ledgerkeeper/ledger"
	"github.com/ledgerkeeper/ledgerkeeper/operator"
	"github.com/ledgerkeeper/ledgerkeeper/store"
)

var hiddenInput = regexp.MustCompile(`<input type="hidden" name="([^"]+)" value="([^"]*)">`)

// dryRunForm opens the dry run at query as user and returns the form it
// draws (its hidden fields, as a browser would send them) and its action;
// the page must draw one.
func (r *rig) dryRunForm(t *testing.T, user, query string) (url.Values, string, response) {
	t.Helper()
	page := r.get(t, user, "/ui/bulk?"+query)
	wantStatus(t, page, http.StatusOK)
	m := regexp.MustCompile(`<form method="post" action="(/ui/bulk/[a-z]+)"`).FindStringSubmatch(page.Body)
	if m == nil {
		t.Fatalf("the dry run draws no form:\n%s", page.Body)
	}
	form := url.Values{}
	for _, f := range hiddenInput.FindAllStringSubmatch(page.Body, -1) {
		form.Add(html.UnescapeString(f[1]), html.UnescapeString(f[2]))
	}
	return form, m[1], page
}

// writes is every row an act writes: holds and audit rows.
func (r *rig) writes(t *testing.T) int {
	t.Helper()
	return r.count(t, `key_holds`) + r.count(t, `reconcile_audit`)
}

func (r *rig) hold(t *testing.T, key string) {
	t.Helper()
	if _, err := operator.Hold(bg, r.db.Pool, operator.HoldRequest{Key: key, Reason: "set up", Actor: "carol"}); err != nil {
		t.Fatal(err)
	}
}

func TestBulkDryRunCountsExactlyTheKeysEachActionAppliesTo(t *testing.T) {
	r := newRig(t)
	for i := 1; i <= 3; i++ {
		r.putKey(t, fmt.Sprintf("p-%d", i), ledger.StatusProcessing, time.Hour)
	}
	r.putKey(t, "p-fresh", ledger.StatusProcessing, time.Second)
	r.putKey(t, "p-held", ledger.StatusProcessing, time.Hour)
	r.putKey(t, "p-done", ledger.StatusCompleted, time.Hour)
	r.putKey(t, "p-retry", ledger.StatusFailedRetryable, time.Hour)
	r.putKey(t, "p-beat", ledger.StatusProcessing, time.Hour)
	r.db.Exec(t, `UPDATE idempotency_keys SET heartbeat_at = now() WHERE key = 'p-beat'`)
	r.putKey(t, "q-1", ledger.StatusProcessing, time.Hour)
	r.hold(t, "p-held")
	before := r.writes(t)

	cases := []struct {
		query string
		want  []string
	}{
		// Hold: every key of the filter not on hold yet.
		{"action=hold&prefix=p-", []string{"p-1", "p-2", "p-3", "p-beat", "p-done", "p-fresh", "p-retry"}},
		// Release: the held ones.
		{"action=release&prefix=p-", []string{"p-held"}},
		// Mark retryable: stuck only (not in flight, not heartbeating, not
		// held, not settled).
		{"action=retryable&tool=" + cTool + "&prefix=p-", []string{"p-1", "p-2", "p-3"}},
		{"action=retryable&tool=" + cTool, []string{"p-1", "p-2", "p-3", "q-1"}},
	}
	for _, c := range cases {
		form, _, page := r.dryRunForm(t, "alice", c.query)
		wantIn(t, page.Body, fmt.Sprintf(`<strong id="bulk-count">%d</strong>`, len(c.want)))
		if got := form["k"]; len(got) != len(c.want) {
			t.Errorf("%s: the form carries %d keys, want %v: %v", c.query, len(got), c.want, got)
		}
		if form.Get("count") != fmt.Sprint(len(c.want)) {
			t.Errorf("%s: count %q, want %d", c.query, form.Get("count"), len(c.want))
		}
		for i, key := range c.want {
			claimed := claimedAt(r.key(t, key))
			if i < len(form["k"]) && form["k"][i] != claimed+" "+key {
				t.Errorf("%s: key %d carried as %q, want %q", c.query, i, form["k"][i], claimed+" "+key)
			}
		}
		wantIn(t, page.Body, "Type <kbd>")
	}
	retry := r.get(t, "alice", "/ui/bulk?action=retryable&tool="+cTool)
	wantIn(t, retry.Body, "will run create_ticket again", "Type <kbd>mark retryable 4</kbd>")
	hold := r.get(t, "alice", "/ui/bulk?action=hold&prefix=p-")
	wantIn(t, hold.Body, "keeps answering 409", "Type <kbd>hold 7</kbd>")
	// Without a tool, mark retryable cannot judge in flight: refused.
	noTool := r.get(t, "alice", "/ui/bulk?action=retryable&prefix=p-")
	wantStatus(t, noTool, http.StatusBadRequest)
	wantIn(t, noTool.Body, "needs a tool")
	if n := r.writes(t); n != before {
		t.Errorf("dry runs wrote %d rows", n-before)
	}
}

func TestBulkDryRunListsTheFirstKeysAndSaysHowManyAreNotShown(t *testing.T) {
	r := newRig(t)
	r.db.Exec(t, `INSERT INTO idempotency_keys (key, tool, request_hash, status, created_at, claimed_at, expires_at)
		SELECT 'm-' || lpad(g::text, 3, '0'), $1, 'h', 'processing', now() - interval '1 hour', now() - interval '1 hour', now() + interval '1 day'
		FROM generate_series(1, $2::int) g`, cTool, bulkShown+7)
	form, _, page := r.dryRunForm(t, "alice", "action=hold&prefix=m-")
	wantIn(t, page.Body, "The first 50 of them; 7 more not shown", `key=m-050"`)
	wantNotIn(t, page.Body, `key=m-051"`)
	if n := len(form["k"]); n != bulkShown+7 {
		t.Errorf("the form carries %d keys, want all %d", n, bulkShown+7)
	}
}

func TestBulkAboveTheLimitIsRefusedWithNothingWritten(t *testing.T) {
	r := newRig(t, func(c *Config) { c.Bulk.Limit = 3 })
	for i := 1; i <= 5; i++ {
		r.putKey(t, fmt.Sprintf("k-%d", i), ledger.StatusProcessing, time.Hour)
	}
	// The set is read up to the limit and one more, never counted whole.
	keys, _, err := store.BulkKeys(bg, r.db.Pool, store.KeyFilter{}, store.BulkNotHeld, 3)
	if err != nil || len(keys) != 4 {
		t.Fatalf("BulkKeys with limit 3: %d keys (err %v), want 4", len(keys), err)
	}
	page := r.get(t, "alice", "/ui/bulk?action=hold&prefix=k-")
	wantStatus(t, page, http.StatusOK)
	wantIn(t, page.Body, "More than 3 keys (console.bulk_limit)", "Narrow the filter")
	wantNotIn(t, page.Body, `method="post"`)
	// A form forged for 3 of them: the set read again is over the limit.
	form := url.Values{"prefix": {"k-"}, "count": {"3"}, "as_of": {time.Now().UTC().Format(time.RFC3339Nano)}, "reason": {"r"}, "confirm_text": {"hold 3"}}
	for _, key := range []string{"k-1", "k-2", "k-3"} {
		form.Add("k", claimedAt(r.key(t, key))+" "+key)
	}
	resp := r.post(t, "alice", "/ui/bulk/hold", form)
	wantStatus(t, resp, http.StatusConflict)
	wantIn(t, resp.Body, "more than 3 keys", "Nothing changed")
	// And a count above the limit is not a form the console draws.
	form.Set("count", "4")
	form.Add("k", claimedAt(r.key(t, "k-4"))+" k-4")
	form.Set("confirm_text", "hold 4")
	wantStatus(t, r.post(t, "alice", "/ui/bulk/hold", form), http.StatusBadRequest)
	if n := r.writes(t); n != 0 {
		t.Errorf("%d rows written above the limit", n)
	}
}

func TestBulkWithoutTheGrantIsForbiddenAndWritesNothing(t *testing.T) {
	r := newRig(t)
	r.putKey(t, "k-1", ledger.StatusProcessing, time.Hour)
	r.putKey(t, "k-2", ledger.StatusProcessing, time.Hour)
	holdForm, _, _ := r.dryRunForm(t, "alice", "action=hold&prefix=k-")
	holdForm.Set("reason", "forged")
	holdForm.Set("confirm_text", "hold 2")
	retryForm, _, _ := r.dryRunForm(t, "alice", "action=retryable&tool="+cTool)
	retryForm.Set("reason", "forged")
	retryForm.Set("confirm_text", "mark retryable 2")
	r.hold(t, "k-1")
	relForm, _, _ := r.dryRunForm(t, "alice", "action=release")
	relForm.Set("confirm_text", "release 1")
	before := r.writes(t)
	for _, c := range []struct {
		user, path string
		form       url.Values
	}{
		{"bob", "/ui/bulk/hold", holdForm},
		{"bob", "/ui/bulk/release", relForm},
		{"bob", "/ui/bulk/retryable", retryForm},
		{"carol", "/ui/bulk/release", relForm},
		{"carol", "/ui/bulk/retryable", retryForm},
	} {
		resp := r.post(t, c.user, c.path, c.form)
		if resp.Status != http.StatusForbidden || !strings.Contains(resp.Body, "not granted") {
			t.Errorf("%s %s: status %d, want 403:\n%s", c.user, c.path, resp.Status, resp.Body)
		}
	}
	if n := r.writes(t); n != before {
		t.Errorf("%d rows written by refused bulk requests", n-before)
	}
	if got := r.key(t, "k-2"); got.Status != ledger.StatusProcessing {
		t.Errorf("k-2 is %s", got.Status)
	}
	// The offers and the form follow the grants.
	bobKeys := r.get(t, "bob", "/ui/keys?prefix=k-")
	wantNotIn(t, bobKeys.Body, "/ui/bulk?")
	carolKeys := r.get(t, "carol", "/ui/keys?prefix=k-")
	wantIn(t, carolKeys.Body, `href="/ui/bulk?action=hold&amp;prefix=k-"`, "Hold all 2 matching")
	wantNotIn(t, carolKeys.Body, "action=release", "action=retryable")
	aliceKeys := r.get(t, "alice", "/ui/keys?tool="+cTool)
	wantIn(t, aliceKeys.Body, "action=hold", "action=release", "action=retryable")
	bobDry := r.get(t, "bob", "/ui/bulk?action=hold&prefix=k-")
	wantStatus(t, bobDry, http.StatusOK)
	wantIn(t, bobDry.Body, "not granted hold")
	wantNotIn(t, bobDry.Body, `method="post"`)
}

func TestBulkWrongTypedConfirmationOrNoReasonIsRefusedWithNothingWritten(t *testing.T) {
	r := newRig(t)
	r.putKey(t, "k-1", ledger.StatusProcessing, time.Hour)
	r.putKey(t, "k-2", ledger.StatusProcessing, time.Hour)
	form, action, _ := r.dryRunForm(t, "alice", "action=hold&prefix=k-")
	for _, c := range []struct{ typed, reason, says string }{
		{"", "incident", `type &#34;hold 2&#34;`},
		{"hold 3", "incident", `type &#34;hold 2&#34;`},
		{"2", "incident", `type &#34;hold 2&#34;`},
		{"release 2", "incident", `type &#34;hold 2&#34;`},
		{"hold 2", " ", "A reason is required"},
	} {
		f := url.Values{}
		for k, v := range form {
			f[k] = v
		}
		f.Set("confirm_text", c.typed)
		f.Set("reason", c.reason)
		resp := r.post(t, "alice", action, f)
		if resp.Status != http.StatusBadRequest || !strings.Contains(resp.Body, c.says) || !strings.Contains(resp.Body, "Nothing changed") {
			t.Errorf("typed %q, reason %q: status %d, want 400 saying %q:\n%s", c.typed, c.reason, resp.Status, c.says, resp.Body)
		}
	}
	if n := r.writes(t); n != 0 {
		t.Errorf("%d rows written by refused confirmations", n)
	}
	// Typed right (case and spaces aside): done.
	form.Set("confirm_text", "  Hold   2 ")
	form.Set("reason", "incident")
	wantStatus(t, r.post(t, "alice", action, form), http.StatusOK)
	if n := r.count(t, `key_holds`); n != 2 {
		t.Errorf("holds %d, want 2", n)
	}
}

func TestBulkRefusedWhenTheSetChangedSinceTheDryRun(t *testing.T) {
	r := newRig(t)
	r.putKey(t, "k-1", ledger.StatusProcessing, time.Hour)
	r.putKey(t, "k-2", ledger.StatusProcessing, time.Hour)
	form, action, _ := r.dryRunForm(t, "alice", "action=hold&prefix=k-")
	form.Set("reason", "incident")
	form.Set("confirm_text", "hold 2")
	// A third key matches now.
	r.putKey(t, "k-3", ledger.StatusProcessing, time.Hour)
	resp := r.post(t, "alice", action, form)
	wantStatus(t, resp, http.StatusConflict)
	wantIn(t, resp.Body, "3 key(s) now, not the 2 confirmed", "Nothing changed", "Type <kbd>hold 3</kbd>")
	// As many keys, but not the same ones.
	r.db.Exec(t, `DELETE FROM idempotency_keys WHERE key = 'k-2'`)
	resp = r.post(t, "alice", action, form)
	wantStatus(t, resp, http.StatusConflict)
	wantIn(t, resp.Body, "1 of the 2 keys confirmed no longer match")
	// A dry run older than bulkMaxAge is shown again, not acted on.
	stale, _, _ := r.dryRunForm(t, "alice", "action=hold&prefix=k-")
	stale.Set("reason", "incident")
	stale.Set("confirm_text", "hold 2")
	stale.Set("as_of", time.Now().Add(-bulkMaxAge-time.Minute).UTC().Format(time.RFC3339Nano))
	resp = r.post(t, "alice", action, stale)
	wantStatus(t, resp, http.StatusConflict)
	wantIn(t, resp.Body, "more than 15m0s ago")
	if n := r.writes(t); n != 0 {
		t.Errorf("%d rows written after the set changed", n)
	}
}

func TestBulkHoldAndReleaseAuditEveryKeyAsTheUser(t *testing.T) {
	r := newRig(t)
	keys := []string{"k-1", "k-2", "k-3"}
	for _, k := range keys {
		r.putKey(t, k, ledger.StatusProcessing, time.Hour)
	}
	r.putKey(t, "other", ledger.StatusProcessing, time.Hour)
	form, action, _ := r.dryRunForm(t, "alice", "action=hold&prefix=k-")
	form.Set("reason", "downstream incident INC-7")
	form.Set("confirm_text", "hold 3")
	resp := r.post(t, "alice", action, form)
	wantStatus(t, resp, http.StatusOK)
	wantIn(t, resp.Body, `<strong id="bulk-done">3 put on hold</strong>`, `<strong id="bulk-refused">0 refused</strong>`)
	for _, k := range keys {
		if n := r.count(t, `reconcile_audit WHERE key = $1 AND action = 'hold' AND actor = 'console:alice'`, k); n != 1 {
			t.Errorf("%s: %d hold audit rows by console:alice, want 1", k, n)
		}
		if n := r.count(t, `key_holds WHERE key = $1 AND actor = 'console:alice' AND reason = 'downstream incident INC-7'`, k); n != 1 {
			t.Errorf("%s: %d holds by console:alice", k, n)
		}
	}
	if n := r.count(t, `reconcile_audit`); n != 3 {
		t.Errorf("audit rows %d, want 3 (one per key)", n)
	}
	if n := r.count(t, `key_holds WHERE key = 'other'`); n != 0 {
		t.Errorf("a key outside the filter was held")
	}
	// Resubmitting the same form: the set is now empty, nothing written.
	again := r.post(t, "alice", action, form)
	wantStatus(t, again, http.StatusConflict)
	wantIn(t, again.Body, "0 key(s) now, not the 3 confirmed")

	rel, relAction, _ := r.dryRunForm(t, "alice", "action=release&prefix=k-")
	rel.Set("confirm_text", "release 3")
	wantStatus(t, r.post(t, "alice", relAction, rel), http.StatusOK)
	if n := r.count(t, `key_holds`); n != 0 {
		t.Errorf("holds after the bulk release: %d", n)
	}
	for _, k := range keys {
		if n := r.count(t, `reconcile_audit WHERE key = $1 AND action = 'release' AND actor = 'console:alice'`, k); n != 1 {
			t.Errorf("%s: %d release audit rows by console:alice, want 1", k, n)
		}
	}
}

func TestBulkMarkRetryableRefusesAKeyClaimedAgainSinceTheDryRunAndDoesTheOthers(t *testing.T) {
	r := newRig(t)
	for _, k := range []string{"s-1", "s-2", "s-3"} {
		r.putKey(t, k, ledger.StatusProcessing, time.Hour)
	}
	form, action, page := r.dryRunForm(t, "alice", "action=retryable&tool="+cTool)
	wantIn(t, page.Body, "will run create_ticket again")
	form.Set("reason", "checked downstream: none happened")
	form.Set("confirm_text", "mark retryable 3")
	// s-2 went failed_retryable and a retry claimed it again; it is stuck
	// again (the same set), but its attempt is not the one judged.
	r.db.Exec(t, `UPDATE idempotency_keys SET claimed_at = now() - interval '2 hours', updated_at = now() WHERE key = 's-2'`)
	resp := r.post(t, "alice", action, form)
	wantStatus(t, resp, http.StatusOK)
	wantIn(t, resp.Body, `<strong id="bulk-done">2 marked retryable</strong>`, `<strong id="bulk-refused">1 refused</strong>`,
		`key=s-2">s-2</a></td><td>claimed again by a retry since the dry run`)
	for _, k := range []string{"s-1", "s-3"} {
		if got := r.key(t, k); got.Status != ledger.StatusFailedRetryable {
			t.Errorf("%s: %s, want failed_retryable", k, got.Status)
		}
		if n := r.count(t, `reconcile_audit WHERE key = $1 AND actor = 'console:alice'`, k); n != 1 {
			t.Errorf("%s: %d audit rows by console:alice, want 1", k, n)
		}
	}
	if got := r.key(t, "s-2"); got.Status != ledger.StatusProcessing {
		t.Errorf("the re-claimed key was marked: %s", got.Status)
	}
	if n := r.count(t, `reconcile_audit WHERE key = 's-2'`); n != 0 {
		t.Errorf("s-2: %d audit rows", n)
	}
}

func TestBulkActsStopAtTheirTimeout(t *testing.T) {
	r := newRig(t, func(c *Config) { c.Bulk.Timeout = time.Nanosecond })
	r.putKey(t, "k-1", ledger.StatusProcessing, time.Hour)
	r.putKey(t, "k-2", ledger.StatusProcessing, time.Hour)
	form, action, _ := r.dryRunForm(t, "alice", "action=hold&prefix=k-")
	form.Set("reason", "incident")
	form.Set("confirm_text", "hold 2")
	resp := r.post(t, "alice", action, form)
	wantStatus(t, resp, http.StatusOK)
	wantIn(t, resp.Body, "2 not attempted", "ran out")
	if n := r.writes(t); n != 0 {
		t.Errorf("%d rows written after the timeout", n)
	}
}

func TestBulkCrossSitePostIsRefusedAndWritesNothing(t *testing.T) {
	r := newRig(t)
	r.putKey(t, "k-1", ledger.StatusProcessing, time.Hour)
	form, action, _ := r.dryRunForm(t, "alice", "action=hold&prefix=k-")
	form.Set("reason", "csrf")
	form.Set("confirm_text", "hold 1")
	for _, hdr := range []map[string]string{
		{"Sec-Fetch-Site": "cross-site"},
		{"Origin": "https://evil.example"},
	} {
		if resp := r.do(t, "alice", http.MethodPost, action, form, hdr); resp.Status != http.StatusForbidden {
			t.Errorf("POST with %v: status %d, want 403", hdr, resp.Status)
		}
	}
	if n := r.writes(t); n != 0 {
		t.Errorf("%d rows written by cross-site requests", n)
	}
}
