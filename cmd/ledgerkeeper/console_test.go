package main

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strings"
	"testing"
	"time"

	"golang.org/x/crypto/bcrypt"

	"github.com/ledgerkeeper/ledgerkeeper/internal/pgtest"
	"github.com/ledgerkeeper/ledgerkeeper/ledger/ledgertest/testwait"
)

// runInBackground runs a long-running command until the test ends, and
// returns its log.
func runInBackground(t *testing.T, args ...string) *syncBuffer {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	exited := make(chan int, 1)
	logs := &syncBuffer{}
	go func() { exited <- run(ctx, args, io.Discard, logs) }()
	t.Cleanup(func() {
		cancel()
		if code := testwait.Recv(t, exited, 40*time.Second); code != 0 {
			t.Errorf("%s exited %d:\n%s", args[0], code, logs.String())
		}
	})
	return logs
}

// httpDo sends one request and reads the answer whole; it follows no
// redirect.
func httpDo(t *testing.T, method, u, user, pass string, form url.Values) (int, string) {
	t.Helper()
	var body io.Reader
	if form != nil {
		body = strings.NewReader(form.Encode())
	}
	req, err := http.NewRequest(method, u, body)
	if err != nil {
		t.Fatal(err)
	}
	if form != nil {
		req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
		req.Header.Set("Sec-Fetch-Site", "same-origin")
	}
	if user != "" {
		req.SetBasicAuth(user, pass)
	}
	c := &http.Client{Timeout: 10 * time.Second, CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}
	resp, err := c.Do(req)
	if err != nil {
		return 0, err.Error()
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

func waitListening(t *testing.T, u string) {
	t.Helper()
	testwait.Eventually(t, func() bool {
		code, _ := httpDo(t, http.MethodGet, u, "", "", nil)
		return code != 0
	}, 30*time.Second, "the listener at "+u)
}

// serve mounts the console at /ui/ on http.listen: signed-in users read,
// an operator's hold lands in the ledger as console:<user>; with
// http.console.enabled: false there is no /ui/.
func TestServeMountsTheConsole(t *testing.T) {
	t.Parallel()
	hash, err := bcrypt.GenerateFromPassword([]byte("alice-pw"), bcrypt.MinCost)
	if err != nil {
		t.Fatal(err)
	}
	db := pgtest.New(t)
	stuckKey(t, db, "create_ticket", "k-console", time.Hour)
	addr := freeAddr(t)
	cfg := writeFile(t, "serve.yaml", fmt.Sprintf(`schedule: {reconcile: "@every 1h", purge: "@every 1h", alerts: "@every 1h"}
http: {listen: %q}
console:
  users: {alice: %q}
  operators: {alice: [hold]}
`, addr, hash))
	logs := runInBackground(t, "serve", "--run-at-start=false", "--config", cfg, "--database-url", db.URL)
	base := "http://" + addr
	waitListening(t, base+"/healthz")
	if code, _ := httpDo(t, http.MethodGet, base+"/ui/", "", "", nil); code != http.StatusUnauthorized {
		t.Errorf("/ui/ without a user: %d, want 401", code)
	}
	code, page := httpDo(t, http.MethodGet, base+"/ui/key?key=k-console", "alice", "alice-pw", nil)
	if code != http.StatusOK || !strings.Contains(page, `action="/ui/key/hold"`) {
		t.Fatalf("the key's page: %d\n%s", code, page)
	}
	code, _ = httpDo(t, http.MethodPost, base+"/ui/key/hold", "alice", "alice-pw", url.Values{"key": {"k-console"}, "reason": {"from serve's console"}, "confirm": {"yes"}})
	if code != http.StatusSeeOther {
		t.Fatalf("hold: %d", code)
	}
	if n := db.Count(t, `key_holds WHERE key = 'k-console' AND actor = 'console:alice'`); n != 1 {
		t.Errorf("holds by console:alice: %d", n)
	}
	if !strings.Contains(logs.String(), "console on") || strings.Contains(logs.String(), string(hash)) {
		t.Errorf("serve's log: no \"console on\" line, or a hash in it:\n%s", logs.String())
	}

	off := pgtest.New(t)
	offAddr := freeAddr(t)
	offCfg := writeFile(t, "off.yaml", fmt.Sprintf("schedule: {reconcile: \"@every 1h\", purge: \"@every 1h\", alerts: \"@every 1h\"}\nhttp: {listen: %q, console: {enabled: false}}\n", offAddr))
	runInBackground(t, "serve", "--run-at-start=false", "--config", offCfg, "--database-url", off.URL)
	waitListening(t, "http://"+offAddr+"/healthz")
	if code, _ := httpDo(t, http.MethodGet, "http://"+offAddr+"/ui/", "", "", nil); code != http.StatusNotFound {
		t.Errorf("/ui/ with the console off: %d, want 404", code)
	}
}

// `ledgerkeeper console` serves the console alone: auth none on a loopback
// listener, no metrics, no reconcile; auth none elsewhere is refused (2).
func TestConsoleCommandServesTheConsoleAlone(t *testing.T) {
	t.Parallel()
	db := pgtest.New(t)
	stuckKey(t, db, "create_ticket", "k-laptop", time.Hour)
	cfg := writeFile(t, "laptop.yaml", "console: {auth: none}\n")
	code, _, stderr := cli(t, "console", "--config", cfg, "--database-url", db.URL, "--listen", ":0")
	if code != exitUsage || !strings.Contains(stderr, "console.auth") || !strings.Contains(stderr, "loopback") {
		t.Errorf("auth none on :0: exit %d, %q", code, stderr)
	}
	addr := freeAddr(t)
	runInBackground(t, "console", "--config", cfg, "--database-url", db.URL, "--listen", addr)
	base := "http://" + addr
	waitListening(t, base+"/ui/")
	code, page := httpDo(t, http.MethodGet, base+"/ui/keys?stuck=1&tool=create_ticket", "", "", nil)
	if code != http.StatusOK || !strings.Contains(page, "k-laptop") || !strings.Contains(page, "Signed in as <strong>local</strong>") {
		t.Errorf("keys: %d\n%s", code, page)
	}
	// Read-only: local is granted nothing.
	if code, _ := httpDo(t, http.MethodPost, base+"/ui/key/hold", "", "", url.Values{"key": {"k-laptop"}, "reason": {"x"}, "confirm": {"yes"}}); code != http.StatusForbidden {
		t.Errorf("hold without a grant: %d, want 403", code)
	}
	if code, _ := httpDo(t, http.MethodGet, base+"/metrics", "", "", nil); code != http.StatusNotFound {
		t.Errorf("/metrics on the console alone: %d, want 404", code)
	}
	if n := db.Count(t, `ledgerkeeper_runs`) + db.Count(t, `key_holds`); n != 0 {
		t.Errorf("the console alone ran passes or wrote holds: %d rows", n)
	}
}
