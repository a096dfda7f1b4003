package daemon

import (
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"golang.org/x/crypto/bcrypt"

	"github.com/ledgerkeeper/ledgerkeeper/internal/pgtest"
)

// The console section: users from the file and ${VAR} with bcrypt hashes,
// operators with known actions, proxy CIDRs, a public URL. Every problem
// names the file, line and key; a hash never appears in an error.
func TestSettleConsole(t *testing.T) {
	t.Parallel()
	hash, err := bcrypt.GenerateFromPassword([]byte("pw"), bcrypt.MinCost)
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	good := filepath.Join(dir, "users")
	if err := os.WriteFile(good, []byte("# ops\nbob:"+string(hash)+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	bad := filepath.Join(dir, "bad")
	if err := os.WriteFile(bad, []byte("bob:"+string(hash)+"\ncarol:plaintext\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	env := envOf(map[string]string{"ALICE_HASH": string(hash)})
	for _, tc := range []struct {
		name, yaml string
		want       []string
	}{
		{name: "basic with users and grants", yaml: `console:
  users: {alice: "${ALICE_HASH}"}
  users_file: ` + good + `
  operators: {alice: [], bob: [hold, release]}
  public_url: https://lk.example.com
`},
		{name: "proxy", yaml: `console:
  auth: proxy
  proxy_cidrs: [10.0.0.0/8, "2001:db8::/32"]
`},
		{name: "every problem", yaml: `console:
  auth: proxy
  proxy_cidrs: [10.0.0.0/33]
  users_file: ` + bad + `
  operators: {"bad user": [], bob: [hold, fly, hold]}
  public_url: lk.example.com
`, want: []string{
			`lk.yaml:3: console.proxy_cidrs: "10.0.0.0/33" is not a CIDR`,
			"lk.yaml:4: console.users_file: " + bad + ": line 2: user carol: not a bcrypt hash",
			`lk.yaml:5: console.operators.bad user: user name holds ' '`,
			`lk.yaml:5: console.operators.bob[1]: unknown action "fly"`,
			`lk.yaml:5: console.operators.bob[2]: action "hold" listed twice`,
			"lk.yaml:6: console.public_url: must be an http(s) URL",
		}},
		{name: "proxy needs its addresses", yaml: `console:
  auth: proxy
`, want: []string{"lk.yaml:1: console.proxy_cidrs: required with auth proxy"}},
		{name: "a user given twice", yaml: `console:
  users: {bob: "${ALICE_HASH}"}
  users_file: ` + good + `
`, want: []string{"console.users.bob: user bob is also in console.users_file"}},
		{name: "not a hash", yaml: `console:
  users: {alice: "secret-password-123"}
`, want: []string{"lk.yaml:2: console.users.alice: not a bcrypt hash"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			_, err := settle(t, tc.yaml, env)
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
			if strings.Contains(err.Error(), string(hash)) || strings.Contains(err.Error(), "secret-password-123") {
				t.Errorf("a hash or password in the error:\n%v", err)
			}
		})
	}
}

func TestConsoleIsOnByDefault(t *testing.T) {
	t.Parallel()
	c, err := settle(t, "", envOf(nil))
	if err != nil {
		t.Fatal(err)
	}
	if !c.HTTP.ConsoleEnabled() || c.HTTP.Console.Enabled == nil || c.Console.Auth != "basic" || c.Console.Listen != "127.0.0.1:9465" {
		t.Errorf("defaults: enabled %v, auth %q, listen %q", c.HTTP.Console.Enabled, c.Console.Auth, c.Console.Listen)
	}
	off, err := settle(t, "http: {console: {enabled: false}}\n", envOf(nil))
	if err != nil {
		t.Fatal(err)
	}
	if off.HTTP.ConsoleEnabled() {
		t.Error("http.console.enabled: false left the console on")
	}
	if got, want := ConsoleCheckSummary(off), "console: off in serve (http.console.enabled: false)"; got != want {
		t.Errorf("summary off: %q, want %q", got, want)
	}
	if got, want := ConsoleCheckSummary(c), "console: /ui/ on :9464, auth basic, 0 user(s): nobody can sign in until console.users or console.users_file names someone; 0 operator(s) may act"; got != want {
		t.Errorf("summary: %q, want %q", got, want)
	}
}

// auth none is valid for `ledgerkeeper console`, but serve's console on a
// listener that is not loopback would refuse to start: config check says so.
func TestConfigCheckWarnsOfAuthNoneOnServesListener(t *testing.T) {
	t.Parallel()
	c, err := settle(t, "console:\n  auth: none\n", envOf(nil))
	if err != nil {
		t.Fatal(err)
	}
	w := Warnings(c)
	if len(w) != 1 || !strings.Contains(w[0], "lk.yaml:2: console.auth: none: serve refuses to start with its console on http.listen :9464") {
		t.Errorf("warnings: %q", w)
	}
	for _, yaml := range []string{
		"console: {auth: none}\nhttp: {listen: \"127.0.0.1:9464\"}\n",
		"console: {auth: none}\nhttp: {console: {enabled: false}}\n",
		"console: {auth: basic}\n",
	} {
		c, err := settle(t, yaml, envOf(nil))
		if err != nil {
			t.Fatal(err)
		}
		if w := Warnings(c); len(w) != 0 {
			t.Errorf("%q: warnings %q", yaml, w)
		}
	}
}

func TestLoopbackListeners(t *testing.T) {
	t.Parallel()
	for listen, want := range map[string]bool{
		"127.0.0.1:9465": true, "[::1]:9465": true, "localhost:80": true, "127.8.0.1:1": true,
		":9464": false, "0.0.0.0:9465": false, "10.0.0.1:9465": false, "[::]:1": false, "example.com:80": false, "nonsense": false,
	} {
		if got := Loopback(listen); got != want {
			t.Errorf("Loopback(%q) = %v, want %v", listen, got, want)
		}
	}
}

// auth none on serve's listener (":9464", every address) is refused at
// start, at the setting; on a loopback listener it serves.
func TestBuildConsoleRefusesAuthNoneOffLoopback(t *testing.T) {
	c, err := settle(t, "console: {auth: none, operators: {local: [hold]}}\n", envOf(nil))
	if err != nil {
		t.Fatal(err)
	}
	db := pgtest.New(t)
	if _, err := BuildConsole(c, db.Pool, nil, ":9464", nil); err == nil || !strings.Contains(err.Error(), "console.auth: console: auth none is refused unless the listener is loopback") {
		t.Fatalf("auth none on :9464: %v", err)
	}
	h, err := BuildConsole(c, db.Pool, nil, "127.0.0.1:9465", nil)
	if err != nil {
		t.Fatal(err)
	}
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, httptest.NewRequest(http.MethodGet, "/ui/", nil))
	if rec.Code != http.StatusOK || !strings.Contains(rec.Body.String(), "Signed in as <strong>local</strong>") {
		t.Errorf("auth none on loopback: %d\n%s", rec.Code, rec.Body.String())
	}
}
