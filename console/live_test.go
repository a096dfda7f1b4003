package console

import (
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/ledgerkeeper/ledgerkeeper/store"
)

// liveNow is the live tests' clock: the chart's day ends here.
var liveNow = time.Date(2026, 12, 1, 12, 0, 0, 0, time.UTC)

func atLiveNow(c *Config) { c.Live.now = func() time.Time { return liveNow } }

// sample writes one stuck_samples row, as serve's observe job does.
func (r *rig) sample(t *testing.T, tool string, ago time.Duration, stuck int) {
	t.Helper()
	r.db.Exec(t, `INSERT INTO stuck_samples (tool, at, stuck, in_flight) VALUES ($1, $2, $3, 0)`, tool, liveNow.Add(-ago), stuck)
}

// liveRegion is the overview page's live part, as the page draws it.
func liveRegion(t *testing.T, body string) string {
	t.Helper()
	const open, end = "data-refresh-ms=\"15000\">\n", "\n</div>\n<script src=\"/ui/static/console.js\" defer></script>"
	i, j := strings.Index(body, open), strings.Index(body, end)
	if i < 0 || j < i {
		t.Fatalf("no live region in the overview:\n%s", body)
	}
	return body[i+len(open) : j]
}

// Each tool's stuck keys over the last day are drawn from the samples as
// SVG polylines (x: the 5-minute bucket within the day, 288 at the right
// edge; y: 60 at zero stuck up to 8 at the day's maximum), broken where
// samples are missing, and said in words; a sample older than the day is
// not drawn; a tool without samples says so.
func TestOverviewChartsStuckKeysFromTheSamples(t *testing.T) {
	r := newRig(t, atLiveNow)
	r.putKey(t, "k-1", "processing", time.Hour)
	r.db.Exec(t, `INSERT INTO idempotency_keys (key, tool, request_hash, status, created_at, claimed_at, expires_at)
		VALUES ('mail-1', 'send_email', 'h', 'completed', now(), now(), now() + interval '1 day')`)
	r.sample(t, cTool, 24*time.Hour+5*time.Minute, 9) // before the day: not drawn, not the max
	r.sample(t, cTool, 60*time.Minute, 1)
	r.sample(t, cTool, 55*time.Minute, 3)
	r.sample(t, cTool, 50*time.Minute, 2)
	// No samples for 40 minutes (serve was down): the line breaks.
	r.sample(t, cTool, 10*time.Minute, 0)
	r.sample(t, cTool, 5*time.Minute, 1)
	r.sample(t, cTool, 0, 1)
	r.sample(t, "refund", 3*time.Hour, 0) // sampled, no key: a line and a chart
	resp := r.get(t, "bob", "/ui/")
	wantStatus(t, resp, http.StatusOK)
	wantIn(t, resp.Body,
		`points="276,42.7 277,8 278,25.3"`,
		`points="286,60 287,42.7 288,42.7"`,
		`role="img" aria-label="create_ticket: stuck keys over the last 24 hours, max 3 at 11:05 UTC, now 1; 6 samples"`,
		`<p class="chart-text">max 3 at 11:05 UTC, now 1; 6 samples</p>`,
		// A lone sample is a dot; its text says no sample came since.
		`points="252,60 252,60"`,
		`<p class="chart-text">none stuck in the day, 0 at the last sample, 09:00 UTC (none since: is serve running?); 1 sample</p>`,
		`<th scope="row">refund</th>`,
		`<figcaption>send_email</figcaption>`+"\n"+`<p class="chart-text">no samples yet</p>`,
		`Updated <time datetime="2026-12-01T12:00:00Z">12:00:00 UTC</time>`,
	)
	if n := strings.Count(resp.Body, "<polyline"); n != 3 {
		t.Errorf("%d polylines, want 3 (two runs of create_ticket, refund's dot)", n)
	}
	if n := strings.Count(resp.Body, "<svg"); n != 2 {
		t.Errorf("%d charts drawn, want 2 (send_email has no samples)", n)
	}
	wantNotIn(t, resp.Body, "max 9", "style=")
}

// The overview says which tools' probing a downstream paused and until
// when: the ledger's pauses (every replica's) and serve's own engine's,
// the later end of each (an ended pause is not shown; a paused tool
// without keys gets a line); the standalone console, without an engine,
// shows the ledger's.
func TestOverviewShowsProbePausesOfTheLedgerAndTheEngine(t *testing.T) {
	calls := 0
	r := newRig(t, atLiveNow, func(c *Config) {
		c.Live.ProbePauses = func() map[string]time.Time {
			calls++
			return map[string]time.Time{cTool: liveNow.Add(90 * time.Second), "charge_card": liveNow.Add(-time.Second), "refund": liveNow.Add(time.Hour)}
		}
	})
	r.putKey(t, "k-1", "processing", time.Hour)
	resp := r.get(t, "bob", "/ui/")
	wantStatus(t, resp, http.StatusOK)
	row := func(body, tool string) string {
		t.Helper()
		i := strings.Index(body, `<th scope="row">`+tool+`</th>`)
		if i < 0 {
			t.Fatalf("no line for %s:\n%s", tool, body)
		}
		return body[i : i+strings.Index(body[i:], "</tr>")]
	}
	wantIn(t, row(resp.Body, cTool), "Probing paused until 2026-12-01 12:01:30 UTC: the downstream asked to wait")
	wantIn(t, row(resp.Body, "refund"), "Probing paused until 2026-12-01 13:00:00 UTC")
	wantNotIn(t, resp.Body, "charge_card")
	if calls != 1 {
		t.Errorf("ProbePauses called %d times for one page", calls)
	}

	// Another replica paused send_email, written to the ledger (by the
	// database's clock, which the test does not set: a pause of a day).
	alone := newRig(t)
	alone.putKey(t, "k-1", "processing", time.Hour)
	resp = alone.get(t, "bob", "/ui/")
	wantNotIn(t, resp.Body, "Probing paused")
	if err := store.PauseProbing(bg, alone.db.Pool, "send_email", 24*time.Hour); err != nil {
		t.Fatal(err)
	}
	resp = alone.get(t, "bob", "/ui/")
	wantIn(t, row(resp.Body, "send_email"), "Probing paused until", "every replica waits")
}

// The live part alone (what the overview's script fetches) needs the same
// sign-in as every page, carries the same headers, and is the page's live
// part exactly: same data, no page around it, no script; it follows the
// ledger (a key stuck since is counted); a database that does not answer
// is a 500 with a line, logged.
func TestOverviewLiveFragmentIsThePagesLivePart(t *testing.T) {
	r := newRig(t, atLiveNow, func(c *Config) {
		c.Live.ProbePauses = func() map[string]time.Time { return map[string]time.Time{cTool: liveNow.Add(time.Minute)} }
	})
	r.putKey(t, "k-1", "processing", time.Hour)
	r.sample(t, cTool, 5*time.Minute, 1)
	wantStatus(t, r.get(t, "", "/ui/overview/live"), http.StatusUnauthorized)
	wrong := r.do(t, "", http.MethodGet, "/ui/overview/live", nil, map[string]string{"Authorization": "Basic Ym9iOm5vdC1ib2Jz"}) // bob:not-bobs
	wantStatus(t, wrong, http.StatusUnauthorized)
	if strings.Contains(wrong.Body, "k-1") {
		t.Errorf("an unauthenticated answer shows the ledger:\n%s", wrong.Body)
	}

	page := r.get(t, "bob", "/ui/")
	frag := r.get(t, "bob", "/ui/overview/live")
	wantStatus(t, frag, http.StatusOK)
	if ct := frag.Header.Get("Content-Type"); ct != "text/html; charset=utf-8" {
		t.Errorf("Content-Type %q", ct)
	}
	if csp := frag.Header.Get("Content-Security-Policy"); !strings.Contains(csp, "default-src 'none'") {
		t.Errorf("the fragment lacks the CSP: %q", csp)
	}
	if want := liveRegion(t, page.Body); frag.Body != want {
		t.Errorf("the fragment is not the page's live part:\n--- fragment\n%s\n--- page's part\n%s", frag.Body, want)
	}
	wantNotIn(t, frag.Body, "<html", "<script", "<nav", "live-pause")
	wantIn(t, frag.Body, `1 stuck</a>`, "Probing paused until 2026-12-01 12:01:00 UTC", `points="287,8 287,8"`)

	r.putKey(t, "k-2", "processing", 2*time.Hour)
	wantIn(t, r.get(t, "bob", "/ui/overview/live").Body, `2 stuck</a>`)

	r.db.Exec(t, `ALTER TABLE stuck_samples RENAME TO stuck_samples_away`)
	broken := r.get(t, "bob", "/ui/overview/live")
	wantStatus(t, broken, http.StatusInternalServerError)
	wantIn(t, broken.Body, "reading the stuck-keys samples failed")
	wantIn(t, r.logs.String(), "reading the stuck-keys samples")
}

// The script is served as JavaScript and loaded by the overview only; the
// controls it drives are hidden until it runs (without it the page is a
// plain one, refreshed by reloading).
func TestOnlyTheOverviewLoadsTheScript(t *testing.T) {
	r := newRig(t)
	r.putKey(t, "k-1", "processing", time.Hour)
	js := r.get(t, "bob", "/ui/static/console.js")
	wantStatus(t, js, http.StatusOK)
	if ct := js.Header.Get("Content-Type"); ct != "text/javascript; charset=utf-8" {
		t.Errorf("console.js served as %q", ct)
	}
	wantNotIn(t, js.Body, "eval(", "innerHTML", "new Function")
	overview := r.get(t, "bob", "/ui/").Body
	wantIn(t, overview, `<script src="/ui/static/console.js" defer></script>`,
		`<div class="live-controls" id="live-controls" hidden>`, `aria-pressed="false"`, `role="status" aria-live="polite"`)
	for _, p := range []string{"/ui/keys", "/ui/key?key=k-1"} {
		wantNotIn(t, r.get(t, "bob", p).Body, "<script")
	}
}
