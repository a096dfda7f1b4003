package browsertest

import (
	"bytes"
	"image/png"
	"os"
	"path/filepath"
	"testing"

	"github.com/chromedp/chromedp"
)

// screenshotsEnv, set to 1, makes TestREADMEScreenshots write the README's
// images into console/screenshots (otherwise into the test's temporary
// directory): `LEDGERKEEPER_SCREENSHOTS=1 go test -run TestREADMEScreenshots
// ./console/browsertest`.
const screenshotsEnv = "LEDGERKEEPER_SCREENSHOTS"

// The README's screenshots of the overview and of a stuck key's page are
// taken by this test, in the same chromium as the others, from a ledger
// with stuck keys over a day of samples, a hold and a probe's answers: each
// is a real PNG of the page as an operator sees it, at a laptop's width.
func TestREADMEScreenshots(t *testing.T) {
	db, base := serveConsole(t)
	db.Exec(t, `INSERT INTO idempotency_keys (key, tool, request_hash, request_body, status, response_code, response_body, created_at, claimed_at, expires_at)
		SELECT 'wf-' || g || ':step-1', CASE WHEN g % 3 = 0 THEN 'send_email' ELSE $1 END, 'h', '{"title":"printer on fire"}',
		       CASE WHEN g % 5 = 0 THEN 'processing' ELSE 'completed' END,
		       CASE WHEN g % 5 = 0 THEN NULL ELSE 201 END, CASE WHEN g % 5 = 0 THEN NULL ELSE '{"ticket_id":"T-1"}'::jsonb END,
		       now() - g * interval '7 minutes', now() - g * interval '7 minutes', now() + interval '1 day'
		FROM generate_series(1, 40) g`, tool)
	db.Exec(t, `INSERT INTO key_holds (key, reason, actor) VALUES ('wf-10:step-1', 'refund desk is checking it', 'console:alice')`)
	db.Exec(t, `INSERT INTO stuck_samples (tool, at, stuck, in_flight)
		SELECT t, date_bin(interval '5 minutes', now(), 'epoch'::timestamptz) - g * interval '5 minutes',
		       CASE WHEN g BETWEEN 40 AND 90 THEN (90 - g) / 4 ELSE 0 END
		       + (SELECT count(*) FROM idempotency_keys k WHERE k.tool = t AND k.status = 'processing' AND k.claimed_at < now() - g * interval '5 minutes' - interval '1 minute'
		            AND NOT EXISTS (SELECT 1 FROM key_holds h WHERE h.key = k.key)), 3
		FROM unnest(ARRAY[$1, 'send_email']) t, generate_series(0, 287) g`, tool)
	db.Exec(t, `INSERT INTO reconcile_audit (key, tool, attempt, action, verdict, actor, evidence, error)
		SELECT key, tool, 1, 'left_processing', 'unknown', 'reconciler', '{"status":503,"body":"upstream connect error"}', 'GET tickets: 503 Service Unavailable'
		FROM idempotency_keys WHERE key = $1`, key)
	dir := t.TempDir()
	if os.Getenv(screenshotsEnv) == "1" {
		dir = filepath.Join("..", "screenshots")
	}
	alice := browser(t, "alice")
	for _, shot := range []struct{ file, page string }{
		{"overview.png", "/ui/"},
		{"key.png", "/ui/key?key=" + key},
	} {
		do(t, alice, "open "+shot.page,
			chromedp.EmulateViewport(1280, 900),
			chromedp.Navigate(base+shot.page),
			chromedp.WaitVisible(chromedp.CSS("main")),
		)
		img := get(t, alice, "screenshot of "+shot.page, chromedp.FullScreenshot(100))
		cfg, err := png.DecodeConfig(bytes.NewReader(img))
		if err != nil || cfg.Width < 1000 || cfg.Height < 400 {
			t.Fatalf("%s: not a page-sized PNG (%v, %dx%d)", shot.page, err, cfg.Width, cfg.Height)
		}
		if err := os.WriteFile(filepath.Join(dir, shot.file), img, 0o644); err != nil {
			t.Fatal(err)
		}
	}
}
