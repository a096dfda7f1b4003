package browsertest

import (
	"context"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"os/exec"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/chromedp/cdproto/fetch"
	"github.com/chromedp/chromedp"
	"golang.org/x/crypto/bcrypt"

	"github.com/ledgerkeeper/ledgerkeeper/console"
	"github.com/ledgerkeeper/ledgerkeeper/internal/pgtest"
)

func TestMain(m *testing.M) { pgtest.Main(m) }

const (
	tool = "create_ticket"
	key  = "k-stuck-1"
)

var passwords = map[string]string{"alice": "alice-browser-pw", "bob": "bob-browser-pw"}

// chromiumPath finds Debian's chromium, or fails saying what to install.
func chromiumPath(t *testing.T) string {
	t.Helper()
	for _, name := range []string{"chromium", "chromium-browser"} {
		if p, err := exec.LookPath(name); err == nil {
			return p
		}
	}
	t.Fatal("chromium not found: the console's browser test needs it (apt-get install chromium; .ci/run installs it)")
	return ""
}

// serveConsole starts the console on 127.0.0.1 with alice (every action)
// and bob (reads only), a stuck key in the ledger.
func serveConsole(t *testing.T) (*pgtest.DB, string) {
	t.Helper()
	db := pgtest.New(t)
	db.Exec(t, `INSERT INTO idempotency_keys (key, tool, request_hash, request_body, created_at, claimed_at, expires_at)
		VALUES ($1, $2, 'h', '{"title":"printer on fire"}', now() - interval '1 hour', now() - interval '1 hour', now() + interval '1 day')`, key, tool)
	users := map[string][]byte{}
	for u, p := range passwords {
		h, err := bcrypt.GenerateFromPassword([]byte(p), bcrypt.MinCost)
		if err != nil {
			t.Fatal(err)
		}
		users[u] = h
	}
	h, err := console.New(console.Config{
		Pool:      db.Pool,
		Auth:      console.AuthBasic,
		Users:     users,
		Operators: map[string][]console.Action{"alice": nil},
		Windows:   func(string) (time.Duration, time.Duration) { return time.Minute, time.Minute },
		Logger:    slog.New(slog.DiscardHandler),
	})
	if err != nil {
		t.Fatal(err)
	}
	mux := http.NewServeMux()
	mux.Handle(console.Path, h)
	srv := httptest.NewServer(mux)
	t.Cleanup(srv.Close)
	return db, srv.URL
}

// browser starts a headless chromium that signs in as user whenever a page
// asks: it answers the 401 challenge, as a person answers the dialog.
func browser(t *testing.T, user string) context.Context {
	t.Helper()
	opts := append(chromedp.DefaultExecAllocatorOptions[:],
		chromedp.ExecPath(chromiumPath(t)),
		chromedp.NoSandbox, // CI runs as root
		chromedp.DisableGPU,
	)
	alloc, cancelAlloc := chromedp.NewExecAllocator(context.Background(), opts...)
	ctx, cancelCtx := chromedp.NewContext(alloc)
	// Fetch's paused requests and auth challenges, answered on a goroutine
	// of ours: the listener must not call the browser itself.
	events := make(chan any, 1024)
	var wg sync.WaitGroup
	t.Cleanup(func() {
		cancelCtx()
		cancelAlloc()
		wg.Wait()
	})
	if err := chromedp.Listen(ctx, func(ev any) {
		switch ev.(type) {
		case *fetch.EventRequestPaused, *fetch.EventAuthRequired:
			select {
			case events <- ev:
			case <-ctx.Done():
			}
		}
	}); err != nil {
		t.Fatalf("start chromium: %v", err)
	}
	wg.Go(func() {
		for {
			var ev any
			select {
			case ev = <-events:
			case <-ctx.Done():
				return
			}
			switch e := ev.(type) {
			case *fetch.EventRequestPaused:
				_, _ = chromedp.Call(ctx, fetch.ContinueRequest, fetch.ContinueRequestParams{RequestID: e.RequestID})
			case *fetch.EventAuthRequired:
				_, _ = chromedp.Call(ctx, fetch.ContinueWithAuth, fetch.ContinueWithAuthParams{RequestID: e.RequestID,
					AuthChallengeResponse: &fetch.AuthChallengeResponse{
						Response: fetch.AuthChallengeResponseResponseProvideCredentials,
						Username: user,
						Password: passwords[user],
					}})
			}
		}
	})
	handle := true
	if _, err := chromedp.Call(ctx, fetch.Enable, fetch.EnableParams{HandleAuthRequests: &handle}); err != nil {
		t.Fatalf("chromium: Fetch.enable: %v", err)
	}
	return ctx
}

// loaded waits until the document the tab shows has loaded, every
// stylesheet applied. chromedp's Click reads where the element is, then
// sends the mouse there: on a page still loading its stylesheets (one just
// opened by a click, which waits for no load event) a sheet applied in
// between moves the element, the click lands beside it, nothing happens,
// and the test waits for a page that never comes. Evaluated in the
// document shown now, not in chromedp's record of its execution context,
// which can lag a navigation.
func loaded() chromedp.Action[chromedp.Void] {
	return func(ctx context.Context, t *chromedp.Target) (chromedp.Void, error) {
		_, err := chromedp.Evaluate[bool](`document.readyState === 'complete' ||
			new Promise(resolve => addEventListener('load', () => resolve(true), {once: true}))`, chromedp.EvalAwaitPromise)(ctx, t)
		return chromedp.Void{}, err
	}
}

// click clicks what sel selects once its page has loaded (see loaded): for
// a control that acts in the page; follow is for one that navigates.
func click(sel string) chromedp.Action[chromedp.Void] {
	return chromedp.Steps(chromedp.WaitVisible(chromedp.CSS(sel)), loaded(), chromedp.Click(chromedp.CSS(sel)))
}

// follow clicks what sel selects, a link or a form's button, and waits
// until the page it opens has loaded. The page left stays shown, and
// queried, until the new one commits: what the test looks for next could
// be found there (a filter's unfiltered list), and a navigation of the
// test's started meanwhile would be cancelled by, or cancel, the click's
// (net::ERR_ABORTED).
func follow(sel string) chromedp.Action[chromedp.Void] {
	return func(ctx context.Context, _ *chromedp.Target) (chromedp.Void, error) {
		_, err := chromedp.RunResponse(ctx, click(sel))
		return chromedp.Void{}, err
	}
}

// do runs browser actions within a deadline; a failure shows the page.
func do(t *testing.T, ctx context.Context, what string, actions ...chromedp.Action[chromedp.Void]) {
	t.Helper()
	stepCtx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	if err := chromedp.Do(stepCtx, actions...); err != nil {
		// Read with a deadline of its own: the step's may be spent.
		pageCtx, cancelPage := context.WithTimeout(ctx, 5*time.Second)
		defer cancelPage()
		loc, _ := chromedp.Run(pageCtx, chromedp.Location())
		body, _ := chromedp.Run(pageCtx, chromedp.Text(chromedp.CSS("body")))
		t.Fatalf("%s: %v\npage %s:\n%s", what, err, loc, body)
	}
}

// get runs one browser action that reads something, within a deadline.
func get[T any](t *testing.T, ctx context.Context, what string, a chromedp.Action[T]) T {
	t.Helper()
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	v, err := chromedp.Run(ctx, a)
	if err != nil {
		t.Fatalf("%s: %v", what, err)
	}
	return v
}

// An operator signs in, opens the stuck key from the overview, holds it and
// sees the hold and its audit row in the key's timeline; a read-only user
// sees no actions and a forged POST of theirs is refused; a form on another
// site that the operator submits is refused too; nothing is written by either.
func TestOperatorHoldsTheStuckKeyAndAReadOnlyUserCannot(t *testing.T) {
	db, base := serveConsole(t)

	alice := browser(t, "alice")
	do(t, alice, "sign in and open the overview",
		chromedp.Navigate(base+"/ui/"),
		chromedp.WaitVisible(chromedp.CSS("a.stuck")),
	)
	if who := get(t, alice, "who", chromedp.Text(chromedp.CSS("header .who"))); !strings.Contains(who, "alice") {
		t.Errorf("signed in as %q", who)
	}
	keyLink := fmt.Sprintf(`a[href="/ui/key?key=%s"]`, key)
	holdForm := `form[action="/ui/key/hold"]`
	do(t, alice, "open the stuck key from the overview",
		follow("a.stuck"),
		follow(keyLink),
		chromedp.WaitVisible(chromedp.CSS(holdForm)),
	)
	do(t, alice, "ask to hold it",
		chromedp.SendKeys(chromedp.CSS(holdForm+` input[name="reason"]`), "checking the ticket system"),
		follow(holdForm+" button"),
		chromedp.WaitVisible(chromedp.CSS("button.danger")),
	)
	// The confirmation says what every retry will receive meanwhile, and
	// nothing is written until it is confirmed.
	if ask := get(t, alice, "the confirmation", chromedp.Text(chromedp.CSS("main"))); !strings.Contains(ask, "keeps receiving 409 (in progress)") {
		t.Errorf("the hold's confirmation does not say what retries receive:\n%s", ask)
	}
	if n := db.Count(t, `key_holds WHERE key = $1`, key); n != 0 {
		t.Fatalf("holds before the confirmation: %d", n)
	}
	do(t, alice, "confirm the hold",
		follow("button.danger"),
		chromedp.WaitVisible(chromedp.CSS("#hold")),
	)
	done := get(t, alice, "done", chromedp.Text(chromedp.CSS(".done")))
	hold := get(t, alice, "hold", chromedp.Text(chromedp.CSS("#hold")))
	timeline := get(t, alice, "timeline", chromedp.Text(chromedp.CSS("ol.timeline")))
	if !strings.Contains(done, "put on hold") || !strings.Contains(hold, "console:alice") || !strings.Contains(hold, "checking the ticket system") {
		t.Errorf("after the hold: done %q, hold %q", done, hold)
	}
	if !strings.Contains(timeline, "console:alice: hold") {
		t.Errorf("the timeline lacks the hold's audit row:\n%s", timeline)
	}
	if n := db.Count(t, `key_holds WHERE key = $1 AND actor = 'console:alice' AND reason = 'checking the ticket system'`, key); n != 1 {
		t.Fatalf("holds by console:alice in the ledger: %d", n)
	}
	if n := db.Count(t, `reconcile_audit WHERE key = $1 AND action = 'hold' AND actor = 'console:alice'`, key); n != 1 {
		t.Fatalf("audit rows of the hold: %d", n)
	}
	audit := db.Count(t, `reconcile_audit`)

	bob := browser(t, "bob")
	do(t, bob, "open the key read-only",
		chromedp.Navigate(base+"/ui/key?key="+key),
		chromedp.WaitVisible(chromedp.CSS("#hold")),
	)
	if forms := get(t, bob, "forms", chromedp.Nodes(chromedp.CSSAll(`form[method="post"]`), chromedp.AtLeast(0))); len(forms) != 0 {
		t.Errorf("bob, who may only read, is shown %d action form(s)", len(forms))
	}
	// A forged form on the console's own page (bob edits the page).
	get(t, bob, "forge a release on the console's page", chromedp.Evaluate[bool](fmt.Sprintf(`(() => {
		const f = document.createElement('form'); f.method = 'post'; f.action = '/ui/key/release';
		const k = document.createElement('input'); k.name = 'key'; k.value = %q; f.appendChild(k);
		const c = document.createElement('input'); c.name = 'confirm'; c.value = 'yes'; f.appendChild(c);
		document.body.appendChild(f); f.submit(); return true; })()`, key)))
	do(t, bob, "see the refusal", chromedp.WaitVisible(chromedp.CSS(".refused")))
	if refused := get(t, bob, "refusal", chromedp.Text(chromedp.CSS(".refused"))); !strings.Contains(refused, "not granted release") {
		t.Errorf("bob's forged release: %q", refused)
	}
	// A form on another site posting to the console, opened by the
	// operator, whose browser holds her credentials: the forgery that
	// matters.
	do(t, alice, "post from another site",
		chromedp.Navigate(evilSite(t, base)),
		follow("#go"),
	)
	if loc := get(t, alice, "the answer's address", chromedp.Location()); !strings.HasPrefix(loc, base) {
		t.Fatalf("the other site's form led to %s, not to the console", loc)
	}
	do(t, alice, "the answer", chromedp.WaitVisible(chromedp.CSS("body")))
	if body := get(t, alice, "body", chromedp.Text(chromedp.CSS("body"))); !strings.Contains(body, "cross-origin request refused") {
		t.Errorf("the cross-site post was answered:\n%s", body)
	}
	if n := db.Count(t, `key_holds WHERE key = $1 AND actor = 'console:alice'`, key); n != 1 {
		t.Errorf("alice's hold after the refused requests: %d", n)
	}
	if n := db.Count(t, `reconcile_audit`); n != audit {
		t.Errorf("audit rows %d → %d after refused requests", audit, n)
	}
}

// evilSite serves a page on another site (localhost, not 127.0.0.1) with a
// form that posts a release to the console.
func evilSite(t *testing.T, base string) string {
	t.Helper()
	page := fmt.Sprintf(`<!doctype html><title>win a prize</title>
<form method="post" action="%s/ui/key/release"><input type="hidden" name="key" value="%s"><input type="hidden" name="confirm" value="yes"><button id="go">Claim your prize</button></form>`, base, key)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "text/html; charset=utf-8")
		_, _ = w.Write([]byte(page))
	}))
	_ = srv.Listener.Close()
	srv.Listener = ln
	srv.Start()
	t.Cleanup(srv.Close)
	_, port, _ := net.SplitHostPort(ln.Addr().String())
	return "http://localhost:" + port + "/"
}
