package browsertest

import (
	"context"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/chromedp/chromedp"
	"golang.org/x/crypto/bcrypt"

	"github.com/ledgerkeeper/ledgerkeeper/console"
	"github.com/ledgerkeeper/ledgerkeeper/internal/pgtest"
	"github.com/ledgerkeeper/ledgerkeeper/ledger/ledgertest/testwait"
	"github.com/ledgerkeeper/ledgerkeeper/store"
)

// served counts the console's successful answers by user and path, as the
// server sees them.
type served struct {
	mu sync.Mutex
	n  map[string]int
}

func (s *served) add(user, path string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.n[user+" "+path]++
}

func (s *served) count(user, path string) int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.n[user+" "+path]
}

// assets are the static files user was served, with how often.
func (s *served) assets(user string) map[string]int {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := map[string]int{}
	for k, n := range s.n {
		if p, ok := strings.CutPrefix(k, user+" "); ok && strings.HasPrefix(p, console.Path+"static/") {
			out[p] = n
		}
	}
	return out
}

type statusRecorder struct {
	http.ResponseWriter
	status int
}

func (w *statusRecorder) WriteHeader(code int) {
	w.status = code
	w.ResponseWriter.WriteHeader(code)
}

// serveLiveConsole is serveConsole's console (alice acts, bob reads, a
// stuck key of tool) with an overview refreshing every refresh, create_ticket's
// probing paused for an hour, and every successful answer counted.
func serveLiveConsole(t *testing.T, refresh time.Duration) (*pgtest.DB, string, *served) {
	t.Helper()
	db := pgtest.New(t)
	stuck(t, db, key)
	users := map[string][]byte{}
	for u, p := range passwords {
		h, err := bcrypt.GenerateFromPassword([]byte(p), bcrypt.MinCost)
		if err != nil {
			t.Fatal(err)
		}
		users[u] = h
	}
	pausedUntil := time.Now().Add(time.Hour)
	h, err := console.New(console.Config{
		Pool:      db.Pool,
		Auth:      console.AuthBasic,
		Users:     users,
		Operators: map[string][]console.Action{"alice": nil},
		Windows:   func(string) (time.Duration, time.Duration) { return time.Minute, time.Minute },
		Logger:    slog.New(slog.DiscardHandler),
		Live: console.LiveConfig{
			Refresh:     refresh,
			ProbePauses: func() map[string]time.Time { return map[string]time.Time{tool: pausedUntil} },
		},
	})
	if err != nil {
		t.Fatal(err)
	}
	s := &served{n: map[string]int{}}
	mux := http.NewServeMux()
	mux.Handle(console.Path, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		rec := &statusRecorder{ResponseWriter: w, status: http.StatusOK}
		h.ServeHTTP(rec, r)
		if user, _, ok := r.BasicAuth(); ok && rec.status == http.StatusOK {
			s.add(user, r.URL.Path)
		}
	}))
	srv := httptest.NewServer(mux)
	t.Cleanup(srv.Close)
	return db, srv.URL, s
}

// stuck puts a key of tool in the ledger, claimed an hour ago: stuck.
func stuck(t *testing.T, db *pgtest.DB, k string) {
	t.Helper()
	db.Exec(t, `INSERT INTO idempotency_keys (key, tool, request_hash, request_body, created_at, claimed_at, expires_at)
		VALUES ($1, $2, 'h', '{"title":"printer on fire"}', now() - interval '1 hour', now() - interval '1 hour', now() + interval '1 day')`, k, tool)
}

func eval[T any](t *testing.T, ctx context.Context, what, js string) T {
	t.Helper()
	return get(t, ctx, what, chromedp.Evaluate[T](js))
}

// stuckText is the overview's stuck count of tool, as the page shows it.
const stuckText = `(document.querySelector('a.stuck') || {}).textContent || ''`

// The overview follows the ledger without navigating: a key made stuck
// after the page loaded appears, with no page load and no asset fetched
// again; paused, the page no longer changes nor asks (while another user's
// page, refreshing, shows the next key), and the pause is remembered on
// reload; resumed, it catches up.
func TestOverviewRefreshesInPlaceUntilPaused(t *testing.T) {
	const every = 300 * time.Millisecond
	db, base, srv := serveLiveConsole(t, every)
	fragment := console.Path + "overview/live"

	alice := browser(t, "alice")
	do(t, alice, "open the overview",
		chromedp.Navigate(base+"/ui/"),
		chromedp.WaitVisible(chromedp.CSS("#live-pause")),
	)
	if got := eval[string](t, alice, "stuck", stuckText); got != "1 stuck" {
		t.Fatalf("the overview shows %q, want 1 stuck", got)
	}
	eval[bool](t, alice, "mark the page", `window.notReloaded = true`)
	stuck(t, db, "k-stuck-2")
	testwait.Eventually(t, func() bool {
		s, err := chromedp.Run(alice, chromedp.Evaluate[string](stuckText))
		return err == nil && s == "2 stuck"
	}, 20*time.Second, "the overview to show the second stuck key without navigating")
	if !eval[bool](t, alice, "the mark", `window.notReloaded === true`) {
		t.Fatal("the page was loaded again, not refreshed in place")
	}
	if n := srv.count("alice", console.Path); n != 1 {
		t.Errorf("the overview page was loaded %d times", n)
	}
	assets := srv.assets("alice")
	for _, want := range []string{"console.css", "live.css", "console.js"} {
		if assets[console.Path+"static/"+want] == 0 {
			t.Errorf("%s never loaded (assets: %v)", want, assets)
		}
	}
	for p, n := range assets {
		if n != 1 {
			t.Errorf("%s loaded %d times", p, n)
		}
	}
	if n := srv.count("alice", fragment); n < 1 {
		t.Fatalf("no fragment fetched")
	}
	if ts := eval[string](t, alice, "updated", `document.querySelector('p.asof').textContent`); !strings.HasPrefix(ts, "Updated ") {
		t.Errorf("no updated time: %q", ts)
	}

	do(t, alice, "pause", click("#live-pause"))
	if p := eval[string](t, alice, "pressed", `document.querySelector('#live-pause').getAttribute('aria-pressed')`); p != "true" {
		t.Fatalf("aria-pressed %q after Pause", p)
	}
	if s := eval[string](t, alice, "status", `document.querySelector('#live-status').textContent`); !strings.Contains(s, "paused") {
		t.Errorf("status after Pause: %q", s)
	}
	asked := srv.count("alice", fragment)
	stuck(t, db, "k-stuck-3")
	// bob's page, loaded now and refreshing, sees a key stuck after it
	// loaded, over several refreshes: time enough for alice's to have
	// changed, had it not been paused.
	bob := browser(t, "bob")
	do(t, bob, "bob opens the overview", chromedp.Navigate(base+"/ui/"), chromedp.WaitVisible(chromedp.CSS("#live-pause")))
	stuck(t, db, "k-stuck-4")
	testwait.Eventually(t, func() bool {
		s, err := chromedp.Run(bob, chromedp.Evaluate[string](stuckText))
		return err == nil && s == "4 stuck" && srv.count("bob", fragment) >= 5
	}, 20*time.Second, "bob's page to show the fourth stuck key over five refreshes")
	if got := eval[string](t, alice, "stuck", stuckText); got != "2 stuck" {
		t.Errorf("alice's paused overview changed to %q", got)
	}
	// A fetch sent before the click may reach the server after it (its
	// answer is dropped): one at most.
	if n := srv.count("alice", fragment); n > asked+1 {
		t.Errorf("alice's paused page fetched %d more times", n-asked)
	}

	do(t, alice, "reload", chromedp.Reload(), chromedp.WaitVisible(chromedp.CSS("#live-pause")))
	if p := eval[string](t, alice, "pressed", `document.querySelector('#live-pause').getAttribute('aria-pressed')`); p != "true" {
		t.Errorf("the pause was forgotten on reload: aria-pressed %q", p)
	}
	eval[bool](t, alice, "mark the page", `window.notReloaded = true`)
	stuck(t, db, "k-stuck-5")
	do(t, alice, "resume", click("#live-pause"))
	testwait.Eventually(t, func() bool {
		s, err := chromedp.Run(alice, chromedp.Evaluate[string](stuckText))
		return err == nil && s == "5 stuck"
	}, 20*time.Second, "the resumed overview to catch up")
	if !eval[bool](t, alice, "the mark", `window.notReloaded === true`) {
		t.Fatal("resuming loaded the page again")
	}
	if p := eval[string](t, alice, "pressed", `document.querySelector('#live-pause').getAttribute('aria-pressed')`); p != "false" {
		t.Errorf("aria-pressed %q after Resume", p)
	}
}

// When a refresh fails the page says so in its status and keeps the last
// data; when the console answers again it says so and refreshes.
func TestOverviewKeepsTheLastDataWhenARefreshFails(t *testing.T) {
	db, base, _ := serveLiveConsole(t, 300*time.Millisecond)
	alice := browser(t, "alice")
	do(t, alice, "open the overview", chromedp.Navigate(base+"/ui/"), chromedp.WaitVisible(chromedp.CSS("#live-pause")))
	db.Exec(t, `ALTER TABLE stuck_samples RENAME TO stuck_samples_away`)
	status := `document.querySelector('#live-status').textContent`
	testwait.Eventually(t, func() bool {
		s, err := chromedp.Run(alice, chromedp.Evaluate[string](status))
		return err == nil && strings.Contains(s, "Refresh failing since") && strings.Contains(s, "HTTP 500")
	}, 20*time.Second, "the status to say the refresh fails")
	if got := eval[string](t, alice, "stuck", stuckText); got != "1 stuck" {
		t.Errorf("after a failed refresh the overview shows %q, want the last data (1 stuck)", got)
	}
	db.Exec(t, `ALTER TABLE stuck_samples_away RENAME TO stuck_samples`)
	stuck(t, db, "k-stuck-2")
	testwait.Eventually(t, func() bool {
		s, err := chromedp.Run(alice, chromedp.Evaluate[string](status))
		n, err2 := chromedp.Run(alice, chromedp.Evaluate[string](stuckText))
		return err == nil && err2 == nil && s == "Refreshing again." && n == "2 stuck"
	}, 20*time.Second, "the overview to refresh again")
}

// The overview with its charts, a probe pause and the refresh controls
// (running and paused) passes axe-core's WCAG 2 A and AA rules.
func TestLiveOverviewPassesAxe(t *testing.T) {
	axe := axeScript(t)
	db, base, _ := serveLiveConsole(t, 300*time.Millisecond)
	now := store.SampleBucket(time.Now())
	for i := range 30 {
		db.Exec(t, `INSERT INTO stuck_samples (tool, at, stuck, in_flight) VALUES ($1, $2, $3, 1)`, tool, now.Add(-time.Duration(i)*store.SampleEvery), i%4)
	}
	db.Exec(t, `INSERT INTO stuck_samples (tool, at, stuck, in_flight) VALUES ('refund', $1, 0, 0)`, now.Add(-3*time.Hour))
	alice := browser(t, "alice")
	check := func(what string) { t.Helper(); axeOn(t, alice, axe, what) }
	do(t, alice, "open the overview", chromedp.Navigate(base+"/ui/"), chromedp.WaitVisible(chromedp.CSS("svg.stuck-chart")),
		chromedp.WaitVisible(chromedp.CSS("#live-pause")))
	labels := eval[[]string](t, alice, "chart labels", `Array.from(document.querySelectorAll('svg[role="img"]')).map(s => s.getAttribute('aria-label'))`)
	sort.Strings(labels)
	if len(labels) != 2 || !strings.Contains(labels[0], "max 3 at") || !strings.Contains(labels[1], "refund: stuck keys over the last 24 hours") {
		t.Errorf("chart labels %q", labels)
	}
	if p := eval[string](t, alice, "pause", `document.body.textContent`); !strings.Contains(p, "Probing paused until") {
		t.Errorf("the overview does not show the probe pause")
	}
	check("the overview, refreshing")
	do(t, alice, "pause", click("#live-pause"))
	check("the overview, paused")
}
