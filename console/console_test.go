package console

import (
	"context"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"net/url"
	"strings"
	"sync"
	"testing"
	"time"

	"golang.org/x/crypto/bcrypt"

	"github.com/ledgerkeeper/ledgerkeeper/alerts"
	"github.com/ledgerkeeper/ledgerkeeper/internal/pgtest"
	"github.com/ledgerkeeper/ledgerkeeper/internal/secret"
	"github.com/ledgerkeeper/ledgerkeeper/ledger"
	"github.com/ledgerkeeper/ledgerkeeper/operator"
)

func TestMain(m *testing.M) { pgtest.Main(m) }

var bg = context.Background()

const (
	cTool   = "create_ticket"
	cSecret = "sk_live_CONSOLETESTSECRET42"
)

// The users: alice may do everything, carol may hold only, bob may read.
var passwords = map[string]string{"alice": "alice-pw", "bob": "bob-pw", "carol": "carol-pw"}

// cWindows: a minute of window + grace and of heartbeat timeout.
func cWindows(string) (time.Duration, time.Duration) { return time.Minute, time.Minute }

type rig struct {
	db   *pgtest.DB
	h    *Handler
	srv  *httptest.Server
	logs *syncLog
}

type syncLog struct {
	mu sync.Mutex
	b  strings.Builder
}

func (l *syncLog) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *syncLog) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

func hashes(t *testing.T) map[string][]byte {
	t.Helper()
	users := map[string][]byte{}
	for u, p := range passwords {
		h, err := bcrypt.GenerateFromPassword([]byte(p), bcrypt.MinCost)
		if err != nil {
			t.Fatal(err)
		}
		users[u] = h
	}
	return users
}

func newRig(t *testing.T, opts ...func(*Config)) *rig {
	t.Helper()
	r := &rig{db: pgtest.New(t), logs: &syncLog{}}
	red := secret.New()
	red.Register(cSecret)
	cfg := Config{
		Pool:      r.db.Pool,
		Auth:      AuthBasic,
		Users:     hashes(t),
		Operators: map[string][]Action{"alice": nil, "carol": {ActionHold}},
		Windows:   cWindows,
		Redactor:  red,
		Logger:    slog.New(slog.NewTextHandler(r.logs, nil)),
	}
	for _, o := range opts {
		o(&cfg)
	}
	h, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	r.h = h
	mux := http.NewServeMux()
	mux.Handle(Path, h)
	r.srv = httptest.NewServer(mux)
	t.Cleanup(r.srv.Close)
	t.Cleanup(func() {
		if strings.Contains(r.logs.String(), cSecret) {
			t.Errorf("a secret reached the log")
		}
	})
	return r
}

// putKey inserts key in status st, claimed ago (the database's clock),
// with a request body holding a secret.
func (r *rig) putKey(t *testing.T, key, st string, ago time.Duration) {
	t.Helper()
	r.db.Exec(t, `INSERT INTO idempotency_keys (key, tool, request_hash, request_body, status, created_at, claimed_at, expires_at)
		VALUES ($1, $2, 'h', $3, $4, now() - $5::interval, now() - $5::interval, now() + interval '1 day')`,
		key, cTool, `{"title":"printer on fire","api_key":"`+cSecret+`"}`, st, ago)
}

func (r *rig) key(t *testing.T, key string) ledger.Key {
	t.Helper()
	k, err := ledger.Get(bg, r.db.Pool, key)
	if err != nil {
		t.Fatalf("get %q: %v", key, err)
	}
	return k
}

// response is an answer read whole.
type response struct {
	Status int
	Header http.Header
	Body   string
}

// do sends a request as user ("" for none), following no redirect.
func (r *rig) do(t *testing.T, user, method, path string, form url.Values, hdr map[string]string) response {
	t.Helper()
	var body io.Reader
	if form != nil {
		body = strings.NewReader(form.Encode())
	}
	req, err := http.NewRequest(method, r.srv.URL+path, body)
	if err != nil {
		t.Fatal(err)
	}
	if form != nil {
		req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	}
	if user != "" {
		req.SetBasicAuth(user, passwords[user])
	}
	for k, v := range hdr {
		req.Header.Set(k, v)
	}
	c := &http.Client{CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }, Timeout: 10 * time.Second}
	resp, err := c.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return response{Status: resp.StatusCode, Header: resp.Header, Body: string(b)}
}

func (r *rig) get(t *testing.T, user, path string) response {
	t.Helper()
	return r.do(t, user, http.MethodGet, path, nil, nil)
}

// post sends a form as a browser on the console's own page would
// (Sec-Fetch-Site: same-origin).
func (r *rig) post(t *testing.T, user, path string, form url.Values) response {
	t.Helper()
	return r.do(t, user, http.MethodPost, path, form, map[string]string{"Sec-Fetch-Site": "same-origin"})
}

func (r *rig) count(t *testing.T, from string, args ...any) int {
	t.Helper()
	return r.db.Count(t, from, args...)
}

func wantStatus(t *testing.T, resp response, want int) {
	t.Helper()
	if resp.Status != want {
		t.Fatalf("status %d, want %d; body:\n%s", resp.Status, want, resp.Body)
	}
}

func wantIn(t *testing.T, body string, parts ...string) {
	t.Helper()
	for _, p := range parts {
		if !strings.Contains(body, p) {
			t.Errorf("page lacks %q:\n%s", p, body)
		}
	}
}

func wantNotIn(t *testing.T, body string, parts ...string) {
	t.Helper()
	for _, p := range parts {
		if strings.Contains(body, p) {
			t.Errorf("page has %q:\n%s", p, body)
		}
	}
}

func claimedAt(k ledger.Key) string { return k.ClaimedAt.UTC().Format(time.RFC3339Nano) }

func TestEveryPageNeedsASignedInUser(t *testing.T) {
	r := newRig(t)
	r.putKey(t, "k-1", ledger.StatusProcessing, time.Hour)
	for _, p := range []string{"/ui/", "/ui/keys", "/ui/key?key=k-1", "/ui/static/console.css"} {
		resp := r.get(t, "", p)
		wantStatus(t, resp, http.StatusUnauthorized)
		if !strings.HasPrefix(resp.Header.Get("WWW-Authenticate"), "Basic ") {
			t.Errorf("%s: WWW-Authenticate %q", p, resp.Header.Get("WWW-Authenticate"))
		}
	}
	req, _ := http.NewRequest(http.MethodGet, r.srv.URL+"/ui/", nil)
	req.SetBasicAuth("alice", "wrong")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	_ = resp.Body.Close()
	if resp.StatusCode != http.StatusUnauthorized {
		t.Errorf("a wrong password: status %d, want 401", resp.StatusCode)
	}
	wantStatus(t, r.get(t, "bob", "/ui/"), http.StatusOK)
}

func TestPagesCarryAStrictContentSecurityPolicyAndNoInlineScript(t *testing.T) {
	r := newRig(t)
	r.putKey(t, "k-1", ledger.StatusProcessing, time.Hour)
	for _, p := range []string{"/ui/", "/ui/keys", "/ui/key?key=k-1"} {
		resp := r.get(t, "alice", p)
		wantStatus(t, resp, http.StatusOK)
		csp := resp.Header.Get("Content-Security-Policy")
		if !strings.Contains(csp, "default-src 'none'") || !strings.Contains(csp, "script-src 'self';") || strings.Contains(csp, "unsafe-") {
			t.Errorf("%s: Content-Security-Policy %q", p, csp)
		}
		// Scripts only by src (the console's own files): no inline code.
		body := strings.ToLower(resp.Body)
		wantNotIn(t, body, "<script>", "style=", "onclick", "javascript:")
		for _, tag := range strings.Split(body, "<script")[1:] {
			if !strings.HasPrefix(tag, ` src="/ui/static/`) || !strings.Contains(tag, "></script>") {
				t.Errorf("%s: a script that is not one of the console's files: <script%.80s", p, tag)
			}
		}
	}
	css := r.get(t, "bob", "/ui/static/console.css")
	wantStatus(t, css, http.StatusOK)
	if ct := css.Header.Get("Content-Type"); !strings.HasPrefix(ct, "text/css") {
		t.Errorf("console.css served as %q", ct)
	}
	for _, p := range []string{"/ui/static/", "/ui/static/nope.css", "/ui/static/..%2fconsole.go"} {
		if resp := r.get(t, "bob", p); resp.Status < 400 || strings.Contains(resp.Body, "console.css") || strings.Contains(resp.Body, "package console") {
			t.Errorf("%s: status %d, want a refusal:\n%s", p, resp.Status, resp.Body)
		}
	}
}

func TestOverviewShowsEachToolsStuckKeysAndHolds(t *testing.T) {
	r := newRig(t)
	r.putKey(t, "stuck-1", ledger.StatusProcessing, time.Hour)
	r.putKey(t, "stuck-2", ledger.StatusProcessing, 2*time.Hour)
	r.putKey(t, "fresh", ledger.StatusProcessing, time.Second)
	r.putKey(t, "retry", ledger.StatusFailedRetryable, time.Hour)
	r.putKey(t, "held", ledger.StatusProcessing, time.Hour)
	if _, err := operator.Hold(bg, r.db.Pool, operator.HoldRequest{Key: "held", Reason: "looking <at> it", Actor: "carol"}); err != nil {
		t.Fatal(err)
	}
	resp := r.get(t, "bob", "/ui/")
	wantStatus(t, resp, http.StatusOK)
	wantIn(t, resp.Body, "<th scope=\"row\">create_ticket</th>", `href="/ui/keys?tool=create_ticket&amp;stuck=1">2 stuck</a>`,
		"looking &lt;at&gt; it", `href="/ui/key?key=held"`)
	// The stuck link lists exactly the stuck keys: not the fresh one, the
	// held one or the failed_retryable one.
	list := r.get(t, "bob", "/ui/keys?tool=create_ticket&stuck=1")
	wantStatus(t, list, http.StatusOK)
	wantIn(t, list.Body, "stuck-1", "stuck-2", "2 key(s)")
	wantNotIn(t, list.Body, `key=fresh"`, `key=held"`, `key=retry"`)
}

func TestKeysFilterAndPageByKeyset(t *testing.T) {
	r := newRig(t, func(c *Config) { c.PageSize = 2 })
	for _, k := range []string{"a-1", "a-2", "a-3", "a%x", "b-1"} {
		r.putKey(t, k, ledger.StatusProcessing, time.Hour)
	}
	r.putKey(t, "a-done", ledger.StatusCompleted, time.Hour)
	first := r.get(t, "bob", "/ui/keys?prefix=a-&status=processing")
	wantStatus(t, first, http.StatusOK)
	wantIn(t, first.Body, `key=a-1"`, `key=a-2"`, "3 key(s)", `rel="next" href="/ui/keys?after=a-2&amp;prefix=a-&amp;status=processing"`)
	wantNotIn(t, first.Body, `key=a-3"`, `key=a%25x"`, `key=a-done"`, `key=b-1"`)
	second := r.get(t, "bob", "/ui/keys?after=a-2&prefix=a-&status=processing")
	wantIn(t, second.Body, `key=a-3"`)
	wantNotIn(t, second.Body, `key=a-1"`, `key=a-2"`, `rel="next"`)
	// % in a prefix is itself, not a pattern.
	pct := r.get(t, "bob", "/ui/keys?prefix=a%25")
	wantIn(t, pct.Body, `key=a%25x"`, "1 key(s)")
	wantNotIn(t, pct.Body, `key=a-1"`)
	bad := r.get(t, "bob", "/ui/keys?status=lost")
	wantStatus(t, bad, http.StatusBadRequest)
}

func TestKeysCountIsAnEstimateAboveTheThresholdAndSaysSo(t *testing.T) {
	r := newRig(t, func(c *Config) { c.ExactBelow = 3 })
	for _, k := range []string{"k1", "k2", "k3", "k4", "k5"} {
		r.putKey(t, k, ledger.StatusProcessing, time.Hour)
	}
	r.db.Exec(t, `ANALYZE idempotency_keys`)
	exact := r.get(t, "bob", "/ui/keys?prefix=k1")
	wantIn(t, exact.Body, "1 key(s)")
	est := r.get(t, "bob", "/ui/keys")
	wantIn(t, est.Body, "About 5 keys (an estimate from PostgreSQL's statistics: more than 3)")
}

func TestKeyPageShowsTheRowRedactedAndOneTimeline(t *testing.T) {
	r := newRig(t)
	r.putKey(t, "k-1", ledger.StatusProcessing, time.Hour)
	if _, err := operator.Hold(bg, r.db.Pool, operator.HoldRequest{Key: "k-1", Reason: "checking", Actor: "slack:U0CAROL"}); err != nil {
		t.Fatal(err)
	}
	resp := r.get(t, "bob", "/ui/key?key=k-1")
	wantStatus(t, resp, http.StatusOK)
	wantIn(t, resp.Body, "printer on fire", "held by slack:U0CAROL", "slack:U0CAROL</span>: hold", "claim")
	wantNotIn(t, resp.Body, cSecret)
	wantStatus(t, r.get(t, "bob", "/ui/key?key=nope"), http.StatusNotFound)
	// A crafted link cannot make the page say something was done.
	phish := r.get(t, "bob", "/ui/key?key=k-1&done="+url.QueryEscape("released; now call +1 555 0100"))
	wantNotIn(t, phish.Body, "555 0100", "Done:")
}

func TestHoldFromTheConsoleIsAuditedAsTheUser(t *testing.T) {
	r := newRig(t)
	r.putKey(t, "k-1", ledger.StatusProcessing, time.Hour)
	page := r.get(t, "alice", "/ui/key?key=k-1")
	wantIn(t, page.Body, `action="/ui/key/hold"`)
	// First the confirmation, saying what retries will see; nothing
	// written yet.
	ask := r.post(t, "alice", "/ui/key/hold", url.Values{"key": {"k-1"}, "reason": {"downstream is flaky"}})
	wantStatus(t, ask, http.StatusOK)
	wantIn(t, ask.Body, "Hold: confirm", "keeps receiving 409 (in progress)", `name="confirm" value="yes"`, "Reason (audited as console:alice): downstream is flaky")
	if n := r.count(t, `key_holds WHERE key = 'k-1'`) + r.count(t, `reconcile_audit WHERE key = 'k-1'`); n != 0 {
		t.Fatalf("rows written before the confirmation: %d", n)
	}
	resp := r.post(t, "alice", "/ui/key/hold", url.Values{"key": {"k-1"}, "reason": {"downstream is flaky"}, "confirm": {"yes"}})
	wantStatus(t, resp, http.StatusSeeOther)
	if n := r.count(t, `key_holds WHERE key = 'k-1' AND actor = 'console:alice' AND reason = 'downstream is flaky'`); n != 1 {
		t.Fatalf("holds by console:alice: %d, want 1", n)
	}
	if n := r.count(t, `reconcile_audit WHERE key = 'k-1' AND action = 'hold' AND actor = 'console:alice'`); n != 1 {
		t.Fatalf("audit rows of the hold: %d, want 1", n)
	}
	after := r.get(t, "alice", resp.Header.Get("Location"))
	wantIn(t, after.Body, "Done: put on hold", "held by console:alice", "console:alice</span>: hold", `action="/ui/key/release"`)
	// Again: refused with the hold in force, nothing more written.
	for _, confirm := range []string{"", "yes"} {
		again := r.post(t, "alice", "/ui/key/hold", url.Values{"key": {"k-1"}, "reason": {"twice"}, "confirm": {confirm}})
		wantStatus(t, again, http.StatusConflict)
		wantIn(t, again.Body, "already on hold")
	}
	if n := r.count(t, `reconcile_audit WHERE key = 'k-1'`); n != 1 {
		t.Errorf("audit rows after a refused second hold: %d, want 1", n)
	}
	askRel := r.post(t, "alice", "/ui/key/release", url.Values{"key": {"k-1"}})
	wantStatus(t, askRel, http.StatusOK)
	wantIn(t, askRel.Body, "Release: confirm", "the reconciler may probe this key")
	if n := r.count(t, `key_holds WHERE key = 'k-1'`); n != 1 {
		t.Errorf("holds after the release's confirmation page: %d, want still 1", n)
	}
	rel := r.post(t, "alice", "/ui/key/release", url.Values{"key": {"k-1"}, "confirm": {"yes"}})
	wantStatus(t, rel, http.StatusSeeOther)
	if n := r.count(t, `key_holds WHERE key = 'k-1'`); n != 0 {
		t.Errorf("holds after release: %d", n)
	}
	if n := r.count(t, `reconcile_audit WHERE key = 'k-1' AND action = 'release' AND actor = 'console:alice'`); n != 1 {
		t.Errorf("audit rows of the release: %d, want 1", n)
	}
}

func TestWithoutAGrantActionsAreAbsentAndAForgedPostIsRefused(t *testing.T) {
	r := newRig(t)
	r.putKey(t, "k-1", ledger.StatusProcessing, time.Hour)
	k := r.key(t, "k-1")
	page := r.get(t, "bob", "/ui/key?key=k-1")
	wantStatus(t, page, http.StatusOK)
	wantNotIn(t, page.Body, "<form method=\"post\"", "/ui/key/hold")
	for _, c := range []struct {
		user, path string
		form       url.Values
	}{
		{"bob", "/ui/key/hold", url.Values{"key": {"k-1"}, "reason": {"forged"}, "confirm": {"yes"}}},
		{"bob", "/ui/key/release", url.Values{"key": {"k-1"}, "confirm": {"yes"}}},
		{"bob", "/ui/key/retryable", url.Values{"key": {"k-1"}, "reason": {"forged"}, "claimed_at": {claimedAt(k)}, "confirm": {"yes"}}},
		{"bob", "/ui/key/outcome", url.Values{"key": {"k-1"}, "reason": {"forged"}, "claimed_at": {claimedAt(k)}, "code": {"201"}, "body": {"{}"}, "confirm": {"yes"}}},
		// carol may hold, nothing else.
		{"carol", "/ui/key/retryable", url.Values{"key": {"k-1"}, "reason": {"forged"}, "claimed_at": {claimedAt(k)}, "confirm": {"yes"}}},
		{"carol", "/ui/key/outcome", url.Values{"key": {"k-1"}, "reason": {"forged"}, "claimed_at": {claimedAt(k)}, "code": {"201"}, "body": {"{}"}, "confirm": {"yes"}}},
	} {
		resp := r.post(t, c.user, c.path, c.form)
		if resp.Status != http.StatusForbidden {
			t.Errorf("%s %s: status %d, want 403", c.user, c.path, resp.Status)
		}
	}
	if got := r.key(t, "k-1"); got.Status != ledger.StatusProcessing || !got.UpdatedAt.Equal(k.UpdatedAt) {
		t.Errorf("the key changed: %+v", got)
	}
	if n := r.count(t, `key_holds`) + r.count(t, `reconcile_audit`); n != 0 {
		t.Errorf("%d rows written by refused requests", n)
	}
	carolPage := r.get(t, "carol", "/ui/key?key=k-1")
	wantIn(t, carolPage.Body, `action="/ui/key/hold"`)
	wantNotIn(t, carolPage.Body, `action="/ui/key/retryable"`, `action="/ui/key/outcome"`)
}

func TestCrossSitePostIsRefusedAndWritesNothing(t *testing.T) {
	r := newRig(t)
	r.putKey(t, "k-1", ledger.StatusProcessing, time.Hour)
	form := url.Values{"key": {"k-1"}, "reason": {"csrf"}, "confirm": {"yes"}}
	for _, hdr := range []map[string]string{
		{"Sec-Fetch-Site": "cross-site"},
		{"Sec-Fetch-Site": "same-site"},
		{"Origin": "https://evil.example"},
	} {
		resp := r.do(t, "alice", http.MethodPost, "/ui/key/hold", form, hdr)
		if resp.Status != http.StatusForbidden {
			t.Errorf("POST with %v: status %d, want 403", hdr, resp.Status)
		}
	}
	if n := r.count(t, `key_holds`) + r.count(t, `reconcile_audit`); n != 0 {
		t.Errorf("%d rows written by cross-site requests", n)
	}
}

func TestMarkRetryableIsConfirmedThenAppliedToTheAttemptShown(t *testing.T) {
	r := newRig(t)
	r.putKey(t, "k-1", ledger.StatusProcessing, time.Hour)
	k := r.key(t, "k-1")
	form := url.Values{"key": {"k-1"}, "reason": {"checked: never happened"}, "claimed_at": {claimedAt(k)}}
	confirm := r.post(t, "alice", "/ui/key/retryable", form)
	wantStatus(t, confirm, http.StatusOK)
	wantIn(t, confirm.Body, "will run create_ticket again", `name="confirm" value="yes"`)
	if got := r.key(t, "k-1"); got.Status != ledger.StatusProcessing {
		t.Fatalf("the confirmation page changed the key: %s", got.Status)
	}
	form.Set("confirm", "yes")
	done := r.post(t, "alice", "/ui/key/retryable", form)
	wantStatus(t, done, http.StatusSeeOther)
	if got := r.key(t, "k-1"); got.Status != ledger.StatusFailedRetryable {
		t.Fatalf("status %s, want failed_retryable", got.Status)
	}
	if n := r.count(t, `reconcile_audit WHERE key = 'k-1' AND actor = 'console:alice'`); n != 1 {
		t.Errorf("audit rows by console:alice: %d, want 1", n)
	}
}

func TestStoreOutcomeConfirmsWhatEveryRetryReceives(t *testing.T) {
	r := newRig(t)
	r.putKey(t, "k-1", ledger.StatusProcessing, time.Hour)
	k := r.key(t, "k-1")
	form := url.Values{"key": {"k-1"}, "reason": {"checked: it happened"}, "claimed_at": {claimedAt(k)}, "code": {"201"}, "body": {`{"id": "T-<1>"}`}}
	confirm := r.post(t, "alice", "/ui/key/outcome", form)
	wantStatus(t, confirm, http.StatusOK)
	wantIn(t, confirm.Body, "Every retry of this key will receive HTTP 201", "&#34;id&#34;: &#34;T-&lt;1&gt;&#34;")
	if got := r.key(t, "k-1"); got.Status != ledger.StatusProcessing {
		t.Fatalf("the confirmation page changed the key: %s", got.Status)
	}
	form.Set("confirm", "yes")
	wantStatus(t, r.post(t, "alice", "/ui/key/outcome", form), http.StatusSeeOther)
	got := r.key(t, "k-1")
	if got.Status != ledger.StatusCompleted || got.ResponseCode == nil || *got.ResponseCode != 201 || !strings.Contains(string(got.ResponseBody), "T-<1>") {
		t.Fatalf("stored %s %v %s", got.Status, got.ResponseCode, got.ResponseBody)
	}
}

func TestResolveRefusalsWriteNothing(t *testing.T) {
	r := newRig(t)
	r.putKey(t, "inflight", ledger.StatusProcessing, time.Second)
	r.putKey(t, "held", ledger.StatusProcessing, time.Hour)
	r.putKey(t, "stuck", ledger.StatusProcessing, time.Hour)
	if _, err := operator.Hold(bg, r.db.Pool, operator.HoldRequest{Key: "held", Reason: "x", Actor: "carol"}); err != nil {
		t.Fatal(err)
	}
	audit := r.count(t, `reconcile_audit`)
	outcome := func(key, code string) url.Values {
		return url.Values{"key": {key}, "reason": {"r"}, "claimed_at": {claimedAt(r.key(t, key))}, "code": {code}, "body": {`{"id":1}`}, "confirm": {"yes"}}
	}
	cases := []struct {
		name string
		form url.Values
		want int
		says string
	}{
		{"in flight", outcome("inflight", "201"), http.StatusConflict, "in flight"},
		{"held", outcome("held", "201"), http.StatusConflict, "on hold"},
		{"5xx outcome", outcome("stuck", "503"), http.StatusBadRequest, "5xx"},
		{"not JSON", url.Values{"key": {"stuck"}, "reason": {"r"}, "claimed_at": {claimedAt(r.key(t, "stuck"))}, "code": {"201"}, "body": {"{nope"}, "confirm": {"yes"}}, http.StatusBadRequest, "valid JSON"},
		{"no claimed_at", url.Values{"key": {"stuck"}, "reason": {"r"}, "code": {"201"}, "body": {"{}"}, "confirm": {"yes"}}, http.StatusBadRequest, "claimed_at"},
	}
	for _, c := range cases {
		resp := r.post(t, "alice", "/ui/key/outcome", c.form)
		if resp.Status != c.want || !strings.Contains(resp.Body, c.says) {
			t.Errorf("%s: status %d (want %d), page says %q? body:\n%s", c.name, resp.Status, c.want, c.says, resp.Body)
		}
	}
	for _, key := range []string{"inflight", "held", "stuck"} {
		if got := r.key(t, key); got.Status != ledger.StatusProcessing {
			t.Errorf("%s: %s after a refusal", key, got.Status)
		}
	}
	if n := r.count(t, `reconcile_audit`); n != audit {
		t.Errorf("audit rows %d → %d after refusals that reach no decision", audit, n)
	}
}

func TestAKeyClaimedAgainSinceThePageWasLoadedIsRefused(t *testing.T) {
	r := newRig(t)
	r.putKey(t, "k-1", ledger.StatusFailedRetryable, time.Hour)
	shown := r.key(t, "k-1")
	form := url.Values{"key": {"k-1"}, "reason": {"it happened"}, "claimed_at": {claimedAt(shown)}, "code": {"201"}, "body": {`{"id":1}`}}
	// A retry claims the key again while the operator reads the page.
	r.db.Exec(t, `UPDATE idempotency_keys SET status = 'processing', claimed_at = now() - interval '2 hours', updated_at = now() WHERE key = 'k-1'`)
	confirm := r.post(t, "alice", "/ui/key/outcome", form)
	wantStatus(t, confirm, http.StatusConflict)
	wantIn(t, confirm.Body, "claimed again since the page was loaded")
	// And at the confirmed act (the claim changed after the confirmation
	// page was drawn): operator.Resolve refuses it.
	form.Set("confirm", "yes")
	done := r.post(t, "alice", "/ui/key/outcome", form)
	wantStatus(t, done, http.StatusConflict)
	wantIn(t, done.Body, "changed meanwhile")
	if got := r.key(t, "k-1"); got.Status != ledger.StatusProcessing || got.ResponseCode != nil {
		t.Errorf("the re-claimed key was settled: %s %v", got.Status, got.ResponseCode)
	}
}

func TestProxyAuthBelievesTheHeaderFromTheProxyOnly(t *testing.T) {
	trusted := func(prefix string) func(*Config) {
		return func(c *Config) {
			c.Auth, c.Users, c.ProxyHeader = AuthProxy, nil, "X-Forwarded-User"
			c.ProxyCIDRs = []netip.Prefix{netip.MustParsePrefix(prefix)}
		}
	}
	r := newRig(t, trusted("127.0.0.0/8"))
	r.putKey(t, "k-1", ledger.StatusProcessing, time.Hour)
	resp := r.do(t, "", http.MethodGet, "/ui/", nil, map[string]string{"X-Forwarded-User": "alice"})
	wantStatus(t, resp, http.StatusOK)
	wantIn(t, resp.Body, "Signed in as <strong>alice</strong>")
	wantStatus(t, r.do(t, "", http.MethodGet, "/ui/", nil, nil), http.StatusForbidden)
	hold := r.do(t, "", http.MethodPost, "/ui/key/hold", url.Values{"key": {"k-1"}, "reason": {"via proxy"}, "confirm": {"yes"}}, map[string]string{"X-Forwarded-User": "alice", "Sec-Fetch-Site": "same-origin"})
	wantStatus(t, hold, http.StatusSeeOther)
	if n := r.count(t, `key_holds WHERE actor = 'console:alice'`); n != 1 {
		t.Errorf("holds by console:alice through the proxy: %d", n)
	}

	// The same header from an address outside the proxy's: not believed.
	other := newRig(t, trusted("10.9.8.0/24"))
	wantStatus(t, other.do(t, "", http.MethodGet, "/ui/", nil, map[string]string{"X-Forwarded-User": "alice"}), http.StatusForbidden)
}

func TestAuthNoneOnlyOnALoopbackListener(t *testing.T) {
	db := pgtest.New(t)
	if _, err := New(Config{Pool: db.Pool, Auth: AuthNone}); err == nil || !strings.Contains(err.Error(), "loopback") {
		t.Fatalf("auth none on a listener that is not loopback: %v", err)
	}
	if _, err := New(Config{Pool: db.Pool, Auth: AuthNone, Loopback: true}); err != nil {
		t.Fatal(err)
	}
}

func TestParseUsersNamesTheBadLine(t *testing.T) {
	h, err := bcrypt.GenerateFromPassword([]byte("pw"), bcrypt.MinCost)
	if err != nil {
		t.Fatal(err)
	}
	users, err := ParseUsers(strings.NewReader("# ops\nalice:" + string(h) + "\n\n"))
	if err != nil || len(users) != 1 {
		t.Fatalf("users %v, err %v", users, err)
	}
	for in, want := range map[string]string{
		"alice:" + string(h) + "\nbob:plain":          "line 2: user bob: not a bcrypt hash",
		"alice " + string(h):                          "line 1: want name:bcrypt-hash",
		"alice:" + string(h) + "\nalice:" + string(h): "line 2: user alice given twice",
	} {
		if _, err := ParseUsers(strings.NewReader(in)); err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("ParseUsers: %v, want %q", err, want)
		}
	}
}

func TestSettledAndMissingKeysAreRefusedWithNothingWritten(t *testing.T) {
	r := newRig(t)
	r.putKey(t, "done", ledger.StatusCompleted, time.Hour)
	r.putKey(t, "retry", ledger.StatusFailedRetryable, time.Hour)
	r.putKey(t, "free", ledger.StatusProcessing, time.Hour)
	form := func(key string) url.Values {
		return url.Values{"key": {key}, "reason": {"r"}, "claimed_at": {claimedAt(r.key(t, key))}, "confirm": {"yes"}}
	}
	cases := []struct {
		name, path string
		form       url.Values
		want       int
		says       string
	}{
		{"retryable of a completed key", "/ui/key/retryable", form("done"), http.StatusConflict, "final"},
		{"retryable of a failed_retryable key", "/ui/key/retryable", form("retry"), http.StatusConflict, "already failed_retryable"},
		{"release of a key not held", "/ui/key/release", url.Values{"key": {"free"}}, http.StatusBadRequest, "not on hold"},
		{"hold without a reason", "/ui/key/hold", url.Values{"key": {"free"}}, http.StatusBadRequest, "reason"},
		{"hold of a key not in the ledger", "/ui/key/hold", url.Values{"key": {"nope"}, "reason": {"r"}}, http.StatusNotFound, "No key"},
		{"no key", "/ui/key/hold", url.Values{"reason": {"r"}}, http.StatusBadRequest, "names no key"},
	}
	for _, c := range cases {
		resp := r.post(t, "alice", c.path, c.form)
		if resp.Status != c.want || !strings.Contains(resp.Body, c.says) {
			t.Errorf("%s: status %d (want %d), says %q? body:\n%s", c.name, resp.Status, c.want, c.says, resp.Body)
		}
		// Before the confirmation too: no confirmation page for a
		// settled key.
		if c.form.Get("confirm") == "yes" {
			first := url.Values{}
			for k, v := range c.form {
				if k != "confirm" {
					first[k] = v
				}
			}
			resp := r.post(t, "alice", c.path, first)
			if resp.Status != c.want || strings.Contains(resp.Body, `name="confirm"`) {
				t.Errorf("%s, before the confirmation: status %d (want %d)\n%s", c.name, resp.Status, c.want, resp.Body)
			}
		}
	}
	if got := r.key(t, "retry"); got.Status != ledger.StatusFailedRetryable {
		t.Errorf("retry: %s", got.Status)
	}
	if n := r.count(t, `key_holds`) + r.count(t, `reconcile_audit`); n != 0 {
		t.Errorf("%d rows written by refused requests", n)
	}
}

func TestAPurgedKeysPageShowsItsAuditTrailAndNoActions(t *testing.T) {
	r := newRig(t)
	r.putKey(t, "gone", ledger.StatusProcessing, time.Hour)
	if _, err := operator.Hold(bg, r.db.Pool, operator.HoldRequest{Key: "gone", Reason: "looking", Actor: "carol"}); err != nil {
		t.Fatal(err)
	}
	if err := operator.Release(bg, r.db.Pool, operator.ReleaseRequest{Key: "gone", Actor: "carol"}); err != nil {
		t.Fatal(err)
	}
	r.db.Exec(t, `DELETE FROM idempotency_keys WHERE key = 'gone'`)
	resp := r.get(t, "alice", "/ui/key?key=gone")
	wantStatus(t, resp, http.StatusOK)
	wantIn(t, resp.Body, "purged: only its audit trail remains", "carol</span>: hold", "carol</span>: release")
	wantNotIn(t, resp.Body, `method="post"`)
}

func TestOverviewListsFiringAlertsAndSaysWhenThereAreMore(t *testing.T) {
	r := newRig(t)
	r.putKey(t, "k-1", ledger.StatusProcessing, time.Hour)
	r.db.Exec(t, `INSERT INTO alert_state (reason, subject, tool, key) VALUES ('no_probe', 'key:k-1', $1, 'k-1')`, cTool)
	resp := r.get(t, "bob", "/ui/")
	wantIn(t, resp.Body, `no_probe · create_ticket · <a href="/ui/key?key=k-1">k-1</a>`)
	wantNotIn(t, resp.Body, "More alerts fire")
	r.db.Exec(t, `INSERT INTO alert_state (reason, subject, tool, key) SELECT 'no_probe', 'key:m-'||g, $1, 'm-'||g FROM generate_series(1, $2::int) g`, cTool, maxFiring)
	more := r.get(t, "bob", "/ui/")
	wantIn(t, more.Body, "More alerts fire than the 200 listed")
	if n := strings.Count(more.Body, "no_probe · "); n != maxFiring {
		t.Errorf("%d alerts listed, want %d", n, maxFiring)
	}
}

// A Citus worker's shards_unreachable alert is named at the top of the
// overview (the key alerts below do not show it), escaped.
func TestOverviewNamesTheUnreachableCitusWorkers(t *testing.T) {
	r := newRig(t)
	resp := r.get(t, "bob", "/ui/")
	wantNotIn(t, resp.Body, "Citus worker")
	for _, node := range []string{"10.0.0.7:5432", "<i>w</i>:5433"} {
		if _, err := alerts.RaiseNode(bg, r.db.Pool, alerts.NodeAlert{Node: node, Shards: []int64{102008}}, time.Hour); err != nil {
			t.Fatal(err)
		}
	}
	resp = r.get(t, "bob", "/ui/")
	wantIn(t, resp.Body, "<strong>Citus workers unreachable</strong>", "<code>10.0.0.7:5432</code>", "<code>&lt;i&gt;w&lt;/i&gt;:5433</code>")
	wantNotIn(t, resp.Body, "<i>w</i>", "Not shown while")
}
