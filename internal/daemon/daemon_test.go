package daemon

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/ledgerkeeper/ledgerkeeper/internal/pgtest"
	"github.com/ledgerkeeper/ledgerkeeper/ledger/ledgertest/testwait"
)

func TestMain(m *testing.M) { pgtest.Main(m) } // goroutine leaks are checked there too

func get(t *testing.T, url string) (int, string) {
	t.Helper()
	resp, err := http.Get(url)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

// stop stops d, failing the test if Stop does not return in time (a job
// that never sees its cancellation).
func stop(t *testing.T, d *Daemon) {
	t.Helper()
	done := make(chan struct{})
	go func() {
		d.Stop()
		close(done)
	}()
	testwait.Recv(t, done, testwait.Timeout)
}

func TestEndpointsAndJobs(t *testing.T) {
	reg := prometheus.NewRegistry()
	ran := make(chan struct{}, 10)
	var ready atomic.Bool
	d, err := New(Config{
		Listen:     "127.0.0.1:0",
		Registry:   reg,
		RunAtStart: true,
		Ready: func(context.Context) error {
			if !ready.Load() {
				return errors.New("database unreachable")
			}
			return nil
		},
		Jobs: []Job{
			{Name: "ok", Spec: "@every 1h", Run: func(context.Context) error { ran <- struct{}{}; return nil }},
			{Name: "fails", Spec: "@every 1h", Run: func(context.Context) error { ran <- struct{}{}; return errors.New("boom") }},
			{Name: "panics", Spec: "@every 1h", Run: func(context.Context) error { ran <- struct{}{}; panic("bug") }},
		},
	})
	if err != nil {
		t.Fatal(err)
	}
	if err := d.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	defer d.Stop()
	for range 3 {
		testwait.Recv(t, ran, testwait.Timeout)
	}
	base := "http://" + d.Addr()
	if code, body := get(t, base+"/healthz"); code != 200 || body != "ok\n" {
		t.Fatalf("healthz %d %q", code, body)
	}
	if code, body := get(t, base+"/readyz"); code != 503 || !strings.Contains(body, "database unreachable") {
		t.Fatalf("readyz %d %q", code, body)
	}
	ready.Store(true)
	if code, _ := get(t, base+"/readyz"); code != 200 {
		t.Fatalf("readyz after ready: %d", code)
	}
	// Poll until the three runs are counted: each job's result is
	// recorded after its Run returns, on its own goroutine, in any order.
	counted := func() (ok, fails, panics float64) {
		return testutil.ToFloat64(d.metrics.runs.WithLabelValues("ok", "ok")),
			testutil.ToFloat64(d.metrics.runs.WithLabelValues("fails", "error")),
			testutil.ToFloat64(d.metrics.runs.WithLabelValues("panics", "error"))
	}
	testwait.Eventually(t, func() bool {
		ok, fails, panics := counted()
		return ok+fails+panics >= 3
	}, testwait.Timeout, "the three runs to be counted")
	if ok, fails, panics := counted(); ok != 1 || fails != 1 || panics != 1 {
		t.Fatalf("runs counted: ok %v, failed %v, panicked (as errors) %v; want 1 each", ok, fails, panics)
	}
	if code, body := get(t, base+"/metrics"); code != 200 || !strings.Contains(body, `ledgerkeeper_job_runs_total{result="ok",task="ok"} 1`) {
		t.Fatalf("metrics %d:\n%s", code, body)
	}
}

func TestJobNeverOverlapsItself(t *testing.T) {
	release := make(chan struct{})
	started := make(chan struct{}, 10)
	var running, maxRunning atomic.Int32
	d, err := New(Config{Jobs: []Job{{Name: "slow", Spec: "@every 1s", Run: func(ctx context.Context) error {
		n := running.Add(1)
		for {
			m := maxRunning.Load()
			if n <= m || maxRunning.CompareAndSwap(m, n) {
				break
			}
		}
		started <- struct{}{}
		select {
		case <-release:
		case <-ctx.Done():
		}
		running.Add(-1)
		return nil
	}}}, RunAtStart: true})
	if err != nil {
		t.Fatal(err)
	}
	if err := d.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	testwait.Recv(t, started, testwait.Timeout)
	testwait.Eventually(t, func() bool {
		return testutil.ToFloat64(d.metrics.skipped.WithLabelValues("slow")) >= 1
	}, testwait.Timeout, "a scheduled tick to be skipped while the job runs")
	close(release)
	stop(t, d)
	if maxRunning.Load() != 1 {
		t.Fatalf("job overlapped itself: %d at once", maxRunning.Load())
	}
}

func TestStopCancelsRunningJobs(t *testing.T) {
	started := make(chan struct{})
	var sawCancel atomic.Bool
	d, err := New(Config{Jobs: []Job{{Name: "long", Spec: "@every 1h", Run: func(ctx context.Context) error {
		close(started)
		<-ctx.Done()
		sawCancel.Store(true)
		return ctx.Err()
	}}}, RunAtStart: true})
	if err != nil {
		t.Fatal(err)
	}
	if err := d.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	testwait.Recv(t, started, testwait.Timeout)
	stop(t, d)
	if !sawCancel.Load() {
		t.Fatal("Stop returned before the running job saw its cancellation")
	}
}

func TestStartStopStress(t *testing.T) {
	for range 50 {
		d, err := New(Config{Listen: "127.0.0.1:0", Jobs: []Job{{Name: "j", Spec: "@every 1s", Run: func(context.Context) error { return nil }}}, RunAtStart: true})
		if err != nil {
			t.Fatal(err)
		}
		d.Stop() // before Start: a no-op
		if err := d.Start(context.Background()); err != nil {
			t.Fatal(err)
		}
		if err := d.Start(context.Background()); err == nil {
			t.Fatal("second Start accepted")
		}
		d.Stop()
		d.Stop()
	}
}

func TestBadSpecAndBusyPort(t *testing.T) {
	if _, err := New(Config{Jobs: []Job{{Name: "x", Spec: "every hour"}}}); err == nil || !strings.Contains(err.Error(), "bad cron spec") {
		t.Fatalf("err = %v", err)
	}
	a, _ := New(Config{Listen: "127.0.0.1:0"})
	if err := a.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	defer a.Stop()
	b, _ := New(Config{Listen: a.Addr()})
	if err := b.Start(context.Background()); err == nil || !strings.Contains(err.Error(), "listen on") {
		t.Fatalf("busy port: %v", err)
	}
	b.Stop()
}

// recordHandler keeps every log record, for tests that assert on logs.
type recordHandler struct {
	mu      sync.Mutex
	records []slog.Record
}

func (h *recordHandler) Enabled(context.Context, slog.Level) bool { return true }
func (h *recordHandler) WithGroup(string) slog.Handler            { return h }
func (h *recordHandler) WithAttrs(as []slog.Attr) slog.Handler {
	return &attrHandler{h: h, attrs: as}
}
func (h *recordHandler) Handle(_ context.Context, r slog.Record) error {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.records = append(h.records, r.Clone())
	return nil
}

// find returns the attributes of the first record with msg, or nil.
func (h *recordHandler) find(msg string) map[string]string {
	h.mu.Lock()
	defer h.mu.Unlock()
	for _, r := range h.records {
		if r.Message != msg {
			continue
		}
		attrs := map[string]string{}
		r.Attrs(func(a slog.Attr) bool {
			attrs[a.Key] = a.Value.String()
			return true
		})
		return attrs
	}
	return nil
}

type attrHandler struct {
	h     *recordHandler
	attrs []slog.Attr
}

func (a *attrHandler) Enabled(context.Context, slog.Level) bool { return true }
func (a *attrHandler) WithGroup(string) slog.Handler            { return a }
func (a *attrHandler) WithAttrs(as []slog.Attr) slog.Handler {
	return &attrHandler{h: a.h, attrs: append(append([]slog.Attr{}, a.attrs...), as...)}
}
func (a *attrHandler) Handle(ctx context.Context, r slog.Record) error {
	r = r.Clone()
	r.AddAttrs(a.attrs...)
	return a.h.Handle(ctx, r)
}

// TestPanicRecoveredLoggedCounted: a job that panics is recovered by cron's
// Recover, logged with its stack, counted as an error run, and runs again at
// its next tick (a panic must not leave SkipIfStillRunning's token taken,
// which would skip the job forever).
func TestPanicRecoveredLoggedCounted(t *testing.T) {
	logs := &recordHandler{}
	var calls atomic.Int32
	again := make(chan struct{}, 10)
	d, err := New(Config{Logger: slog.New(logs), RunAtStart: true, Jobs: []Job{{Name: "flaky", Spec: "@every 1s", Run: func(context.Context) error {
		if calls.Add(1) == 1 {
			panic("bug in job")
		}
		again <- struct{}{}
		return nil
	}}}})
	if err != nil {
		t.Fatal(err)
	}
	if err := d.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	testwait.Recv(t, again, testwait.Timeout) // the tick after the panic ran
	// The run is counted when it returns, just after it signalled: wait
	// for the count, not for the stop (which may come first).
	testwait.Eventually(t, func() bool { return testutil.ToFloat64(d.metrics.runs.WithLabelValues("flaky", "ok")) >= 1 },
		testwait.Timeout, "the run after the panic counted ok")
	stop(t, d)
	if got := testutil.ToFloat64(d.metrics.runs.WithLabelValues("flaky", "error")); got != 1 {
		t.Errorf("error runs = %v, want 1 (the panic)", got)
	}
	if got := testutil.ToFloat64(d.metrics.runs.WithLabelValues("flaky", "ok")); got < 1 {
		t.Errorf("ok runs = %v, want the run after the panic counted", got)
	}
	if got := testutil.ToFloat64(d.metrics.skipped.WithLabelValues("flaky")); got != 0 {
		t.Errorf("skipped = %v after a panic, want 0", got)
	}
	attrs := logs.find("job panicked")
	if attrs == nil {
		t.Fatal(`no "job panicked" log record`)
	}
	if attrs["job"] != "flaky" || attrs["err"] != "bug in job" || !strings.Contains(attrs["stack"], "daemon_test.go") {
		t.Errorf("panic logged as %v, want job, err and the stack", attrs)
	}
}
