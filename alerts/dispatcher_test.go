package alerts

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/ledgerkeeper/ledgerkeeper/ledger/ledgertest/testwait"
)

// transports runs a test against chat.postMessage and the webhook.
var transports = []struct {
	name     string
	notifier func(*fakeSlack, testing.TB) Notifier
}{
	{"bot", func(f *fakeSlack, t testing.TB) Notifier { return f.botNotifier(t) }},
	{"webhook", func(f *fakeSlack, t testing.TB) Notifier { return f.webhookNotifier(t) }},
}

func TestGroupingOneMessagePerReason(t *testing.T) {
	t.Parallel()
	for _, tr := range transports {
		t.Run(tr.name, func(t *testing.T) {
			t.Parallel()
			b := setup(t)
			srv := newFakeSlack(t, nil)
			for _, k := range []string{"wf-1:step-1", "wf-2:step-1", "wf-3:step-1"} {
				b.raise(t, keyAlert(ReasonProbeFailing, "create_ticket", k))
			}
			b.raise(t, keyAlert(ReasonDuplicate, "charge_card", "wf-9:charge"))
			reg := prometheus.NewRegistry()
			d := b.dispatcher(tr.notifier(srv, t), NewMetrics(reg))

			rep := b.run(t, d)
			if rep.Claimed != 4 || rep.Messages != 2 || rep.Delivered != 4 || rep.Pending != 0 {
				t.Fatalf("report = %+v, want 4 claimed, 2 messages, 4 delivered, 0 pending", rep)
			}
			msgs := srv.accepted()
			if len(msgs) != 2 {
				t.Fatalf("server got %d messages, want 2 (one per reason)", len(msgs))
			}
			// duplicate_effect comes first: it is first in Reasons.
			if got := msgs[0].keys(t); !slices.Equal(got, []string{"wf-9:charge"}) {
				t.Errorf("first message keys = %v", got)
			}
			if got := msgs[1].keys(t); !slices.Equal(got, []string{"wf-1:step-1", "wf-2:step-1", "wf-3:step-1"}) {
				t.Errorf("second message keys = %v", got)
			}
			if !strings.Contains(msgs[1].Text, "Probe failing: 3 keys") {
				t.Errorf("fallback text = %q", msgs[1].Text)
			}
			all := strings.Join(msgs[1].texts(t), "\n")
			for _, want := range []string{
				"🔴 Probe failing: 3 keys",
				"ledgerkeeper inspect wf-2:step-1",
				"<" + testRunbook + "#probe_failing|runbook: probe_failing>",
				"*age* 2h13m", "*attempts* 4",
				"503 Service Unavailable",
			} {
				if !strings.Contains(all, want) {
					t.Errorf("message lacks %q:\n%s", want, all)
				}
			}
			if tr.name == "bot" && (msgs[0].Token != testToken || msgs[0].Channel != "#oncall") {
				t.Errorf("posted with token %q to %q", msgs[0].Token, msgs[0].Channel)
			}
			if n := b.db.Count(t, "alert_outbox WHERE status = 'sent' AND attempts = 1 AND lease_owner IS NULL"); n != 4 {
				t.Errorf("%d rows marked sent, want 4", n)
			}
			if got := testutil.ToFloat64(d.metrics.sentMessages.WithLabelValues("probe_failing", "firing")); got != 1 {
				t.Errorf("sent messages metric = %v", got)
			}
			if got := testutil.ToFloat64(d.metrics.sentAlerts.WithLabelValues("probe_failing", "firing")); got != 3 {
				t.Errorf("sent alerts metric = %v", got)
			}
			// Nothing left: a second pass posts nothing.
			if rep := b.run(t, d); rep.Claimed != 0 || len(srv.requests()) != 2 {
				t.Errorf("second pass %+v, %d requests", rep, len(srv.requests()))
			}
		})
	}
}

func TestMaxKeysPerMessage(t *testing.T) {
	t.Parallel()
	b := setup(t)
	srv := newFakeSlack(t, nil)
	for i := range 7 {
		b.raise(t, keyAlert(ReasonNoProbe, "mystery_tool", fmt.Sprintf("wf-%d:step-1", i)))
	}
	d := b.dispatcher(srv.webhookNotifier(t), nil, func(c *Config) { c.MaxKeysPerMessage = 3 })
	rep := b.run(t, d)
	if rep.Messages != 1 || rep.Delivered != 7 {
		t.Fatalf("report %+v, want 1 message carrying 7 alerts", rep)
	}
	msg := srv.accepted()[0]
	if got := msg.keys(t); len(got) != 3 {
		t.Errorf("listed %v, want 3 keys", got)
	}
	all := strings.Join(msg.texts(t), "\n")
	if !strings.Contains(all, "…and 4 more (7 keys in all)") {
		t.Errorf("no '…and 4 more':\n%s", all)
	}
	if n := b.db.Count(t, "alert_outbox WHERE status = 'sent'"); n != 7 {
		t.Errorf("%d sent, want all 7 (the unlisted ones are counted in the message)", n)
	}
}

func TestRenotifyWindow(t *testing.T) {
	t.Parallel()
	b := setup(t)
	srv := newFakeSlack(t, nil)
	d := b.dispatcher(srv.botNotifier(t), nil)
	a := keyAlert(ReasonProbeFailing, "create_ticket", "wf-1:step-1")

	for i, want := range []bool{true, false} {
		got, err := Raise(b.ctx, b.db.Pool, a, 4*time.Hour)
		if err != nil || got != want {
			t.Fatalf("raise %d = %v, %v; want %v", i, got, err, want)
		}
	}
	if n := b.db.Count(t, "alert_outbox"); n != 1 {
		t.Fatalf("%d outbox rows within the window, want 1", n)
	}
	b.run(t, d)
	// Still inside the window after delivery: nothing new.
	if got, _ := Raise(b.ctx, b.db.Pool, a, 4*time.Hour); got {
		t.Fatal("raised again inside the renotify window")
	}
	// The window passes.
	b.db.Exec(t, "UPDATE alert_state SET last_raised_at = now() - interval '4 hours 1 second'")
	if got, err := Raise(b.ctx, b.db.Pool, a, 4*time.Hour); err != nil || !got {
		t.Fatalf("raise after the window = %v, %v", got, err)
	}
	if n := b.db.Count(t, "alert_outbox"); n != 2 {
		t.Fatalf("%d outbox rows, want 2", n)
	}
	b.run(t, d)
	if n := len(srv.accepted()); n != 2 {
		t.Fatalf("%d messages, want 2 (first alert, then the renotification)", n)
	}
}

func TestResolvedMessage(t *testing.T) {
	t.Parallel()
	b := setup(t)
	srv := newFakeSlack(t, nil)
	d := b.dispatcher(srv.botNotifier(t), nil)
	b.raise(t, keyAlert(ReasonDuplicate, "charge_card", "wf-7:charge"))
	b.raise(t, keyAlert(ReasonDuplicate, "charge_card", "wf-8:charge"))
	b.raise(t, Alert{Reason: ReasonDownstreamUnreachable, Tool: "charge_card", Details: Details{Keys: 12, LastError: "dial tcp: connection refused"}})
	b.run(t, d)

	for _, k := range []string{"wf-7:charge", "wf-8:charge"} {
		n, err := ResolveKey(b.ctx, b.db.Pool, "charge_card", k, "resolved by operator alice")
		if err != nil || n != 1 {
			t.Fatalf("ResolveKey(%s) = %d, %v", k, n, err)
		}
	}
	if n, err := ResolveTool(b.ctx, b.db.Pool, "charge_card", "breaker closed"); err != nil || n != 1 {
		t.Fatalf("ResolveTool = %d, %v", n, err)
	}
	// Resolving again changes nothing.
	if n, _ := ResolveKey(b.ctx, b.db.Pool, "charge_card", "wf-7:charge", "again"); n != 0 {
		t.Fatalf("second ResolveKey resolved %d", n)
	}
	rep := b.run(t, d)
	if rep.Messages != 2 || rep.Delivered != 3 {
		t.Fatalf("report %+v, want 2 resolved messages (one per reason) for 3 alerts", rep)
	}
	msgs := srv.accepted()[2:]
	dup := strings.Join(msgs[0].texts(t), "\n")
	for _, want := range []string{"✅ Resolved: Duplicate effect downstream (2 keys)", "resolved by operator alice", "wf-7:charge", "wf-8:charge"} {
		if !strings.Contains(dup, want) {
			t.Errorf("resolved message lacks %q:\n%s", want, dup)
		}
	}
	if !strings.HasPrefix(msgs[0].Text, "[RESOLVED] ") {
		t.Errorf("fallback %q", msgs[0].Text)
	}
	if tool := strings.Join(msgs[1].texts(t), "\n"); !strings.Contains(tool, "Downstream unreachable (1 tool)") || !strings.Contains(tool, "breaker closed") {
		t.Errorf("tool-wide resolved message:\n%s", tool)
	}
}

func TestHostileContentIsEscaped(t *testing.T) {
	t.Parallel()
	hostileKeys := []string{"<!channel>", "<@U123>", "<!here|here>", "<#C0GENERAL>"}
	for _, tr := range transports {
		t.Run(tr.name, func(t *testing.T) {
			t.Parallel()
			b := setup(t)
			srv := newFakeSlack(t, nil)
			for _, k := range hostileKeys {
				a := keyAlert(ReasonProbeFailing, "<!subteam^S1>", k)
				a.Details.LastError = "500 from downstream: <https://evil.example/login|runbook> <!everyone> & more"
				a.Details.Verdict = "<@U999>"
				b.raise(t, a)
			}
			b.raise(t, Alert{Reason: Reason("<!channel>"), Tool: "t", Key: "k"})
			d := b.dispatcher(tr.notifier(srv, t), nil)
			b.run(t, d)
			msgs := srv.accepted()
			if len(msgs) != 2 {
				t.Fatalf("%d messages, want 2", len(msgs))
			}
			var all []string
			for _, m := range msgs {
				all = append(all, m.texts(t)...)
			}
			joined := strings.Join(all, "\n")
			ours := "<" + testRunbook + "#"
			for _, s := range all {
				rest := s
				for {
					i := strings.Index(rest, "<")
					if i < 0 {
						break
					}
					if !strings.HasPrefix(rest[i:], ours) {
						t.Errorf("a '<' that is not our runbook link: %q", rest[i:min(len(rest), i+40)])
					}
					rest = rest[i+1:]
				}
			}
			for _, bad := range []string{"<!", "<@", "<#", "<https://evil"} {
				if strings.Contains(joined, bad) {
					t.Errorf("message contains %q", bad)
				}
			}
			for _, want := range []string{"&lt;!channel&gt;", "&lt;@U123&gt;", "&lt;https://evil.example/login|runbook&gt;", "&amp; more",
				"ledgerkeeper inspect '&lt;!channel&gt;'"} {
				if !strings.Contains(joined, want) {
					t.Errorf("message lacks %q", want)
				}
			}
		})
	}
}

func TestServerErrorThenSuccessDeliversOnce(t *testing.T) {
	t.Parallel()
	for _, tr := range transports {
		t.Run(tr.name, func(t *testing.T) {
			t.Parallel()
			b := setup(t)
			srv := newFakeSlack(t, func(n int, _ string) reply {
				if n == 0 {
					return reply{status: 500, body: "<html>oops</html>"}
				}
				return reply{status: 200}
			})
			b.raise(t, keyAlert(ReasonProbeFailing, "create_ticket", "wf-1:step-1"))
			reg := prometheus.NewRegistry()
			d := b.dispatcher(tr.notifier(srv, t), NewMetrics(reg))

			rep := b.run(t, d)
			if rep.FailedMessages != 1 || rep.Pending != 1 || rep.Permanent {
				t.Fatalf("report %+v, want one retryable failure, 1 pending", rep)
			}
			var attempts int
			var class, lastErr string
			var wait time.Duration
			if err := b.db.Pool.QueryRow(b.ctx, `SELECT attempts, last_error_class, last_error, next_attempt_at - $1
				FROM alert_outbox`, b.clock.Now()).Scan(&attempts, &class, &lastErr, &wait); err != nil {
				t.Fatal(err)
			}
			if attempts != 1 || class != "retryable" || wait < 5*time.Second || wait > 10*time.Second {
				t.Fatalf("after 500: attempts %d, class %s, retry in %s (want 1, retryable, 5s..10s)", attempts, class, wait)
			}
			if strings.Contains(lastErr, "oops") {
				t.Errorf("stored the server's page: %q", lastErr)
			}
			// Not due yet: nothing is posted.
			b.run(t, d)
			if n := len(srv.requests()); n != 1 {
				t.Fatalf("%d requests before the back-off ended", n)
			}
			b.clock.Advance(wait)
			rep = b.run(t, d)
			if rep.Delivered != 1 || len(srv.accepted()) != 1 || len(srv.requests()) != 2 {
				t.Fatalf("report %+v; %d accepted of %d requests, want delivered exactly once", rep, len(srv.accepted()), len(srv.requests()))
			}
			if got := testutil.ToFloat64(d.metrics.failures.WithLabelValues("retryable")); got != 1 {
				t.Errorf("retryable failures metric = %v", got)
			}
			if got := testutil.ToFloat64(d.metrics.pendingNow); got != 0 {
				t.Errorf("pending gauge = %v", got)
			}
		})
	}
}

func TestRateLimitHonoursRetryAfter(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name       string
		transport  func(*fakeSlack, testing.TB) Notifier
		retryAfter func(now time.Time) string
	}{
		{"bot seconds", transports[0].notifier, func(time.Time) string { return "120" }},
		{"webhook seconds", transports[1].notifier, func(time.Time) string { return "120" }},
		// An HTTP date: slack-go alone would fail to parse it.
		{"bot http-date", transports[0].notifier, func(time.Time) string {
			return time.Now().Add(120 * time.Second).UTC().Format(http.TimeFormat)
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			b := setup(t)
			srv := newFakeSlack(t, func(n int, _ string) reply {
				if n == 0 {
					return reply{status: 429, header: map[string]string{"Retry-After": tc.retryAfter(time.Now())}, body: "rate_limited"}
				}
				return reply{status: 200}
			})
			b.raise(t, keyAlert(ReasonDuplicate, "charge_card", "wf-1:charge"))
			b.raise(t, keyAlert(ReasonNoProbe, "mystery", "wf-2:x"))
			d := b.dispatcher(tc.transport(srv, t), nil)

			start := b.clock.Now()
			rep := b.run(t, d)
			if rep.FailedMessages != 1 || rep.Deferred != 1 || len(srv.requests()) != 1 {
				t.Fatalf("report %+v, %d requests: want the pass to stop at the 429 and defer the rest", rep, len(srv.requests()))
			}
			rows, err := b.db.Pool.Query(b.ctx, `SELECT next_attempt_at, attempts, last_error_class FROM alert_outbox ORDER BY id`)
			if err != nil {
				t.Fatal(err)
			}
			for i := 0; rows.Next(); i++ {
				var next time.Time
				var attempts int
				var class string
				if err := rows.Scan(&next, &attempts, &class); err != nil {
					t.Fatal(err)
				}
				wait := next.Sub(start)
				if wait < 119*time.Second || wait > 121*time.Second || class != "rate_limited" {
					t.Errorf("row %d: next try in %s, class %s; want Retry-After 120s, rate_limited", i, wait, class)
				}
				if tc.name != "bot http-date" && wait != 120*time.Second {
					t.Errorf("row %d: next try in %s, want exactly 120s", i, wait)
				}
				if want := []int{1, 0}[i]; attempts != want {
					t.Errorf("row %d: attempts %d, want %d (a deferred row was not tried)", i, attempts, want)
				}
			}
			rows.Close()

			b.clock.Advance(118 * time.Second)
			b.run(t, d)
			if n := len(srv.requests()); n != 1 {
				t.Fatalf("retried before Retry-After: %d requests", n)
			}
			b.clock.Advance(3 * time.Second)
			rep = b.run(t, d)
			if rep.Delivered != 2 || len(srv.accepted()) != 2 || len(srv.requests()) != 3 {
				t.Fatalf("report %+v, %d accepted of %d: want both messages once", rep, len(srv.accepted()), len(srv.requests()))
			}
		})
	}
}

func TestPermanentErrorKeepsAlertsAndSurfaces(t *testing.T) {
	t.Parallel()
	b := setup(t)
	srv := newFakeSlack(t, func(n int, _ string) reply {
		return reply{status: 200, body: `{"ok":false,"error":"channel_not_found"}`}
	})
	b.raise(t, keyAlert(ReasonDuplicate, "charge_card", "wf-1:charge"))
	b.raise(t, keyAlert(ReasonProbeFailing, "create_ticket", "wf-2:step-1"))
	b.raise(t, keyAlert(ReasonProbeFailing, "create_ticket", "wf-3:step-1"))
	reg := prometheus.NewRegistry()
	d := b.dispatcher(srv.botNotifier(t), NewMetrics(reg))

	rep := b.run(t, d)
	if !rep.Permanent || rep.FailedMessages != 1 || rep.Deferred != 2 || rep.Pending != 3 {
		t.Fatalf("report %+v: want a permanent failure, the other message deferred, 3 pending", rep)
	}
	if n := len(srv.requests()); n != 1 {
		t.Errorf("%d requests: a channel_not_found fails every message, the pass should stop", n)
	}
	h, err := Health(b.ctx, b.db.Pool)
	if err != nil {
		t.Fatal(err)
	}
	if h.Pending != 3 || h.Permanent != 3 || !h.LastErrorPermanent() || !strings.Contains(h.LastError, "channel_not_found") ||
		!strings.Contains(h.LastError, "alerts.slack.channel") || h.OldestPendingAt == nil || h.LastErrorAt == nil {
		t.Errorf("health %+v", h)
	}
	if got := testutil.ToFloat64(d.metrics.failures.WithLabelValues("permanent")); got != 1 {
		t.Errorf("permanent failures metric = %v", got)
	}
	if got := testutil.ToFloat64(d.metrics.permanentNow); got != 3 {
		t.Errorf("permanent pending gauge = %v", got)
	}
	logs := b.logs.String()
	if n := strings.Count(logs, "level=ERROR"); n != 1 {
		t.Errorf("%d error lines, want one per pass:\n%s", n, logs)
	}
	if k := b.logs.kind("retry_in"); k != slog.KindDuration {
		t.Errorf("retry_in logged as %v, want a duration (JSON logs write seconds)", k)
	}
	if strings.Contains(logs, "SECRETTOKEN") || strings.Contains(h.LastError, "SECRETTOKEN") {
		t.Error("the token leaked into a log or the stored error")
	}

	// Held back on a documented cadence: PermanentRetry (1m) doubling up
	// to PermanentBackoff, so a running serve picks up a fix by itself.
	if h.NextPermanentRetryAt == nil || h.NextPermanentRetryAt.Sub(b.clock.Now()) != time.Minute {
		t.Errorf("next permanent retry at %v, want in exactly 1m (clock %v)", h.NextPermanentRetryAt, b.clock.Now())
	}
	if got, want := testutil.ToFloat64(d.metrics.nextAttempt), float64(b.clock.Now().Add(time.Minute).UnixNano())/1e9; got != want {
		t.Errorf("next attempt gauge = %v, want %v", got, want)
	}
	b.clock.Advance(59 * time.Second)
	b.run(t, d)
	if n := len(srv.requests()); n != 1 {
		t.Errorf("%d requests inside the permanent back-off", n)
	}
	b.clock.Advance(time.Second)
	b.run(t, d)
	if n := len(srv.requests()); n != 2 {
		t.Fatalf("%d requests: a running dispatcher retries a permanent failure after 1m", n)
	}
	// Second failure of that row: 2m.
	b.clock.Advance(time.Minute + 59*time.Second)
	b.run(t, d)
	if n := len(srv.requests()); n != 2 {
		t.Errorf("%d requests before the doubled back-off (2m)", n)
	}
	b.clock.Advance(time.Second)
	b.run(t, d)
	if n := len(srv.requests()); n != 3 {
		t.Fatalf("%d requests: want the retry after 2m", n)
	}
	// A new dispatcher (a restart with a fixed configuration) tries at once.
	d2 := b.dispatcher(srv.botNotifier(t), nil)
	b.run(t, d2)
	if n := len(srv.requests()); n != 4 {
		t.Errorf("%d requests: a new dispatcher should retry permanent failures at once", n)
	}
	if n := b.db.Count(t, "alert_outbox WHERE status = 'pending'"); n != 3 {
		t.Errorf("%d pending: nothing may be dropped", n)
	}
}

func TestPerMessageErrorDoesNotStopThePass(t *testing.T) {
	t.Parallel()
	b := setup(t)
	srv := newFakeSlack(t, func(n int, _ string) reply {
		if n == 0 {
			return reply{status: 200, body: `{"ok":false,"error":"invalid_blocks"}`}
		}
		return reply{status: 200}
	})
	b.raise(t, keyAlert(ReasonDuplicate, "charge_card", "wf-1:charge"))
	b.raise(t, keyAlert(ReasonProbeFailing, "create_ticket", "wf-2:step-1"))
	d := b.dispatcher(srv.botNotifier(t), nil)
	rep := b.run(t, d)
	if rep.FailedMessages != 1 || rep.Messages != 1 || rep.Deferred != 0 {
		t.Fatalf("report %+v: one message refused, the other delivered", rep)
	}
}

func TestConcurrentDispatchersPostEachAlertOnce(t *testing.T) {
	t.Parallel()
	b := setup(t)
	srv := newFakeSlack(t, nil)
	reasons := []Reason{ReasonDuplicate, ReasonProbeFailing, ReasonNoProbe, ReasonExpiredProcessing}
	want := map[string]bool{}
	for i := range 50 {
		k := fmt.Sprintf("wf-%02d:step", i)
		want[k] = true
		b.raise(t, keyAlert(reasons[i%len(reasons)], "tool", k))
	}
	n := srv.botNotifier(t)
	ds := []*Dispatcher{
		b.dispatcher(n, nil, func(c *Config) { c.Owner, c.BatchSize = "replica-a", 7 }),
		b.dispatcher(n, nil, func(c *Config) { c.Owner, c.BatchSize = "replica-b", 7 }),
	}
	var wg sync.WaitGroup
	errs := make(chan error, len(ds))
	for _, d := range ds {
		wg.Go(func() {
			for {
				rep, err := d.RunOnce(b.ctx)
				if err != nil {
					errs <- err
					return
				}
				if rep.Claimed == 0 {
					return
				}
			}
		})
	}
	testwait.Wait(t, &wg, testwait.Timeout)
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	seen := map[string]int{}
	for _, m := range srv.accepted() {
		for _, k := range m.keys(t) {
			seen[k]++
		}
	}
	for k := range want {
		if seen[k] != 1 {
			t.Errorf("key %s posted %d times", k, seen[k])
		}
	}
	if len(seen) != 50 {
		t.Errorf("%d distinct keys posted, want 50", len(seen))
	}
	if n := b.db.Count(t, "alert_outbox WHERE status = 'sent'"); n != 50 {
		t.Errorf("%d sent", n)
	}
}

func TestKilledBetweenClaimAndPost(t *testing.T) {
	t.Parallel()
	b := setup(t)
	srv := newFakeSlack(t, nil)
	b.raise(t, keyAlert(ReasonNoProbe, "mystery", "wf-1:x"))
	b.raise(t, keyAlert(ReasonNoProbe, "mystery", "wf-2:x"))

	// A replica claims and dies before posting: its lease is committed,
	// nothing else happens.
	dead := b.dispatcher(srv.botNotifier(t), nil, func(c *Config) { c.Owner = "dead" })
	if _, items, err := dead.claim(b.ctx, dead.leaseToken()); err != nil || len(items) != 2 {
		t.Fatalf("claim = %d items, %v", len(items), err)
	}

	live := b.dispatcher(srv.botNotifier(t), nil, func(c *Config) { c.Owner = "live" })
	if rep := b.run(t, live); rep.Claimed != 0 || len(srv.requests()) != 0 {
		t.Fatalf("took leased rows: %+v", rep)
	}
	b.clock.Advance(DefaultLease - time.Second)
	if rep := b.run(t, live); rep.Claimed != 0 {
		t.Fatalf("took rows before the lease expired: %+v", rep)
	}
	b.clock.Advance(time.Second)
	rep := b.run(t, live)
	if rep.Delivered != 2 || len(srv.accepted()) != 1 {
		t.Fatalf("after the lease: %+v, %d messages", rep, len(srv.accepted()))
	}
	var attempts int
	if err := b.db.Pool.QueryRow(b.ctx, "SELECT max(attempts) FROM alert_outbox").Scan(&attempts); err != nil || attempts != 1 {
		t.Errorf("attempts %d, %v: a crash is not a failed attempt", attempts, err)
	}
}

func TestCancelledMidPostReleasesRows(t *testing.T) {
	t.Parallel()
	b := setup(t)
	srv := newFakeSlack(t, nil)
	b.raise(t, keyAlert(ReasonDuplicate, "charge_card", "wf-1:charge"))
	b.raise(t, keyAlert(ReasonNoProbe, "mystery", "wf-2:x"))

	ctx, cancel := context.WithCancel(b.ctx)
	posting := make(chan struct{})
	hang := NotifierFunc(func(ctx context.Context, _ Message) (bool, error) {
		close(posting)
		<-ctx.Done()
		return true, ctx.Err()
	})
	d := b.dispatcher(hang, nil)
	done := make(chan Report, 1)
	go func() {
		rep, _ := d.RunOnce(ctx)
		done <- rep
	}()
	testwait.Recv(t, posting, testwait.Timeout)
	cancel() // SIGTERM while Slack is slow
	rep := testwait.Recv(t, done, testwait.Timeout)
	if rep.Deferred != 2 || rep.FailedMessages != 0 {
		t.Fatalf("report %+v: both groups released, no failure counted", rep)
	}
	if n := b.db.Count(t, "alert_outbox WHERE status = 'pending' AND lease_owner IS NULL AND attempts = 0"); n != 2 {
		t.Fatalf("%d rows released", n)
	}
	if strings.Contains(b.logs.String(), "level=ERROR") || strings.Contains(b.logs.String(), "level=WARN") {
		t.Errorf("logged a shutdown as a failure:\n%s", b.logs.String())
	}
	rep = b.run(t, b.dispatcher(srv.webhookNotifier(t), nil))
	if rep.Delivered != 2 || len(srv.accepted()) != 2 {
		t.Fatalf("next pass: %+v", rep)
	}
}

func TestSecretsNeverStored(t *testing.T) {
	t.Parallel()
	// A webhook that does not answer: net/http quotes the URL in its error.
	srv := newFakeSlack(t, nil)
	url := srv.URL + webhookPath
	srv.Close()
	b := setup(t)
	b.raise(t, keyAlert(ReasonNoProbe, "mystery", "wf-1:x"))
	n, err := NewSlack(SlackConfig{WebhookURL: url, Timeout: 2 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	rep := b.run(t, b.dispatcher(n, nil))
	if rep.FailedMessages != 1 || rep.LastError == "" {
		t.Fatalf("report %+v", rep)
	}
	h, err := Health(b.ctx, b.db.Pool)
	if err != nil {
		t.Fatal(err)
	}
	for where, s := range map[string]string{"report": rep.LastError, "health": h.LastError, "logs": b.logs.String()} {
		if strings.Contains(s, "SECRETWEBHOOKPART") || strings.Contains(s, webhookPath) {
			t.Errorf("webhook URL in %s: %s", where, s)
		}
	}
	if !strings.Contains(h.LastError, "the Slack webhook at 127.0.0.1") || h.LastErrorClass != ClassRetryable {
		t.Errorf("health %+v: want a retryable error naming the host only", h)
	}
}

func TestNotConfiguredKeepsAlerts(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.raise(t, keyAlert(ReasonNoProbe, "mystery", "wf-1:x"))
	if _, err := NewSlack(SlackConfig{}); !errors.Is(err, ErrNoSlack) {
		t.Fatalf("NewSlack() = %v, want ErrNoSlack", err)
	}
	rep := b.run(t, b.dispatcher(NotConfigured{}, nil))
	h, _ := Health(b.ctx, b.db.Pool)
	if !rep.Permanent || h.Pending != 1 || !strings.Contains(h.LastError, "no Slack configured") {
		t.Fatalf("report %+v, health %+v", rep, h)
	}
}

func TestOpenKeyAlerts(t *testing.T) {
	t.Parallel()
	b := setup(t)
	for _, k := range []string{"a", "b", "c", "d"} {
		b.raise(t, keyAlert(ReasonProbeFailing, "tool", k))
	}
	b.raise(t, keyAlert(ReasonDuplicate, "tool", "b"))
	b.raise(t, Alert{Reason: ReasonDownstreamUnreachable, Tool: "tool"})
	if _, err := ResolveKey(b.ctx, b.db.Pool, "tool", "c", "resolved by original attempt"); err != nil {
		t.Fatal(err)
	}
	var got []string
	var after OpenAlert
	for {
		page, err := OpenKeyAlertsAfter(b.ctx, b.db.Pool, after, 2)
		if err != nil {
			t.Fatal(err)
		}
		if len(page) == 0 {
			break
		}
		for _, a := range page {
			if a.Tool != "tool" || a.LastRaisedAt.IsZero() {
				t.Errorf("open alert %+v", a)
			}
			got = append(got, a.Key+"/"+string(a.Reason))
		}
		after = page[len(page)-1]
	}
	want := []string{"a/probe_failing", "b/duplicate_effect", "b/probe_failing", "d/probe_failing"}
	if !slices.Equal(got, want) {
		t.Errorf("open key alerts %v, want %v", got, want)
	}
	if first, err := OpenKeyAlerts(b.ctx, b.db.Pool, 1); err != nil || len(first) != 1 || first[0].Key != "a" {
		t.Errorf("OpenKeyAlerts(1) = %v, %v", first, err)
	}
}

func TestBackoffGrowsAndCaps(t *testing.T) {
	d := &Dispatcher{cfg: Config{BackoffBase: 10 * time.Second, BackoffMax: time.Minute, PermanentBackoff: time.Hour}}
	for attempts, want := range []time.Duration{10 * time.Second, 20 * time.Second, 40 * time.Second, time.Minute, time.Minute} {
		for range 20 {
			got := d.delay(ClassRetryable, attempts, 0)
			if got < want/2 || got > want {
				t.Fatalf("attempts %d: delay %s outside [%s, %s]", attempts, got, want/2, want)
			}
		}
	}
	if got := d.delay(ClassRateLimited, 0, 90*time.Second); got != 90*time.Second {
		t.Errorf("Retry-After floor: %s", got)
	}
	d.cfg.PermanentRetry = time.Minute
	for attempts, want := range []time.Duration{time.Minute, 2 * time.Minute, 4 * time.Minute, 8 * time.Minute, 16 * time.Minute, 32 * time.Minute, time.Hour, time.Hour} {
		if got := d.delay(ClassPermanent, attempts, 0); got != want {
			t.Errorf("permanent after %d attempts: %s, want %s", attempts, got, want)
		}
	}
	if got := d.delay(ClassRetryable, 1000, 0); got > time.Minute {
		t.Errorf("huge attempts: %s", got)
	}
}

// A dispatcher whose lease was taken over while Slack answered must not
// mark the rows sent: they are the new holder's now, which posts them and
// marks them itself. The takeover happens inside the first post, so the
// order is fixed.
func TestLeaseTakenOverMidPostIsNotMarkedSent(t *testing.T) {
	t.Parallel()
	b := setup(t)
	srv := newFakeSlack(t, nil)
	b.raise(t, keyAlert(ReasonNoProbe, "mystery", "wf-1:x"))
	b.raise(t, keyAlert(ReasonNoProbe, "mystery", "wf-2:x"))

	taker := b.dispatcher(srv.botNotifier(t), nil, func(c *Config) { c.Owner = "taker" })
	var takerToken string
	slow := NotifierFunc(func(ctx context.Context, m Message) (bool, error) {
		// Slack is slow: the lease expires and another dispatcher claims
		// the rows before this post returns.
		b.clock.Advance(DefaultLease)
		takerToken = taker.leaseToken()
		if _, items, err := taker.claim(ctx, takerToken); err != nil || len(items) != 2 {
			return false, fmt.Errorf("takeover claimed %d rows: %v", len(items), err) //nolint:errorlint // err may be nil (wrong count): %w would print %!w(<nil>)
		}
		return srv.botNotifier(t).Notify(ctx, m)
	})
	late := b.dispatcher(slow, nil, func(c *Config) { c.Owner = "late" })
	rep := b.run(t, late)
	if rep.Messages != 1 || rep.LeaseLost != 2 {
		t.Fatalf("report %+v: want the message posted and both alerts counted as lease lost", rep)
	}
	if n := b.db.Count(t, "alert_outbox WHERE status = 'pending' AND attempts = 0 AND lease_owner = $1", takerToken); n != 2 {
		t.Fatalf("%d of 2 rows still pending under the new holder's lease: the late dispatcher marked rows it no longer held", n)
	}
	if !strings.Contains(b.logs.String(), "lease was taken over") {
		t.Errorf("no warning logged:\n%s", b.logs.String())
	}
}

// A 429 holds back every post to the webhook or channel until its
// Retry-After, not only the rows it refused: an alert raised 0.1s later
// waits too (issue 10 item 17).
func TestRateLimitHoldsBackAlertsRaisedAfterIt(t *testing.T) {
	t.Parallel()
	for _, tr := range transports {
		t.Run(tr.name, func(t *testing.T) {
			t.Parallel()
			b := setup(t)
			srv := newFakeSlack(t, func(n int, _ string) reply {
				if n == 0 {
					return reply{status: 429, header: map[string]string{"Retry-After": "20"}, body: "rate_limited"}
				}
				return reply{status: 200}
			})
			d := b.dispatcher(tr.notifier(srv, t), nil)
			b.raise(t, keyAlert(ReasonDuplicate, "charge_card", "wf-1:charge"))
			start := b.clock.Now()
			if rep := b.run(t, d); rep.FailedMessages != 1 {
				t.Fatalf("report %+v: want the 429", rep)
			}
			b.clock.Advance(100 * time.Millisecond)
			b.raise(t, keyAlert(ReasonNoProbe, "mystery", "wf-2:x"))
			for _, at := range []time.Duration{time.Second, 10 * time.Second, 19900 * time.Millisecond} {
				b.clock.Advance(start.Add(at).Sub(b.clock.Now()))
				rep := b.run(t, d)
				if n := len(srv.requests()); n != 1 {
					t.Fatalf("%s after the 429: %d requests, want none before Retry-After (20s)", at, n)
				}
				if rep.RateLimitedUntil == nil || !rep.RateLimitedUntil.Equal(start.Add(20*time.Second)) {
					t.Fatalf("report %+v: want RateLimitedUntil = 429 + 20s", rep)
				}
			}
			b.clock.Advance(start.Add(20 * time.Second).Sub(b.clock.Now()))
			rep := b.run(t, d)
			if rep.Delivered != 2 || len(srv.accepted()) != 2 {
				t.Fatalf("report %+v, %d accepted: want both alerts once Retry-After passed", rep, len(srv.accepted()))
			}
		})
	}
}

// A firing notice and its resolved notice pending together (a purge pass
// and a reconcile pass raced at start-up) give one message with the final
// state, not FIRING then RESOLVED (issue 10 item 11).
func TestFiredAndResolvedInOnePassPostsFinalStateOnly(t *testing.T) {
	t.Parallel()
	b := setup(t)
	srv := newFakeSlack(t, nil)
	d := b.dispatcher(srv.botNotifier(t), nil)
	b.raise(t, keyAlert(ReasonExpiredProcessing, "create_ticket", "wf-1:s1"))
	b.raise(t, keyAlert(ReasonExpiredProcessing, "create_ticket", "wf-2:s1"))
	if n, err := ResolveKey(b.ctx, b.db.Pool, "create_ticket", "wf-1:s1", "completed by the original attempt"); err != nil || n != 1 {
		t.Fatalf("ResolveKey = %d, %v", n, err)
	}
	b.raise(t, Alert{Reason: ReasonDownstreamUnreachable, Tool: "create_ticket", Details: Details{Keys: 2}})
	if _, err := ResolveTool(b.ctx, b.db.Pool, "create_ticket", "breaker closed"); err != nil {
		t.Fatal(err)
	}

	rep := b.run(t, d)
	if rep.Claimed != 5 || rep.Messages != 3 || rep.Pending != 0 {
		t.Fatalf("report %+v: want 5 rows claimed, settled by 3 messages", rep)
	}
	msgs := srv.accepted()
	var firing, resolved []string
	for _, m := range msgs {
		text := strings.Join(m.texts(t), "\n")
		switch {
		case strings.HasPrefix(m.Text, "[FIRING]"):
			firing = append(firing, text)
		case strings.HasPrefix(m.Text, "[RESOLVED]"):
			resolved = append(resolved, text)
		}
	}
	if len(firing) != 1 || !strings.Contains(firing[0], "wf-2:s1") || strings.Contains(firing[0], "wf-1:s1") {
		t.Fatalf("firing messages %q: want one, for wf-2:s1 only", firing)
	}
	all := strings.Join(resolved, "\n")
	if len(resolved) != 2 || !strings.Contains(all, "wf-1:s1") || strings.Count(all, "Fired and resolved before it could be delivered") != 2 {
		t.Fatalf("resolved messages %q: want wf-1:s1 and the tool, each saying it fired and resolved", resolved)
	}
	if n := b.db.Count(t, "alert_outbox WHERE status = 'sent'"); n != 5 {
		t.Errorf("%d rows sent, want all 5 settled", n)
	}
}
