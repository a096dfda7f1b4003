package daemon

import (
	"context"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/ledgerkeeper/ledgerkeeper/internal/pgtest"
	"github.com/ledgerkeeper/ledgerkeeper/ledger/ledgertest/testwait"
	"github.com/ledgerkeeper/ledgerkeeper/reconcile"
)

// A WindDown job learns of the stop from Stopping and keeps its ctx through
// the grace, so it can finish what it started; a job without WindDown is
// cancelled at once; Stop waits for both.
func TestWindDownJobKeepsItsContextThroughTheGrace(t *testing.T) {
	started := make(chan struct{}, 2)
	sawStop := make(chan error, 1) // the WindDown job's ctx.Err() when it saw the stop
	finish := make(chan struct{})
	plainDone := make(chan error, 1)
	d, err := New(Config{
		RunAtStart:      true,
		ShutdownTimeout: testwait.Timeout,
		Jobs: []Job{
			{Name: "reconcile", Spec: "@every 1h", WindDown: true, Run: func(ctx context.Context) error {
				started <- struct{}{}
				select {
				case <-Stopping(ctx):
				case <-ctx.Done():
				}
				sawStop <- ctx.Err()
				<-finish // the probes in flight answering within the grace
				return ctx.Err()
			}},
			{Name: "purge", Spec: "@every 1h", Run: func(ctx context.Context) error {
				started <- struct{}{}
				<-ctx.Done()
				plainDone <- ctx.Err()
				return ctx.Err()
			}},
		},
	})
	if err != nil {
		t.Fatal(err)
	}
	if err := d.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	testwait.Recv(t, started, testwait.Timeout)
	testwait.Recv(t, started, testwait.Timeout)
	stopped := make(chan struct{})
	go func() {
		d.Stop()
		close(stopped)
	}()
	if err := testwait.Recv(t, sawStop, testwait.Timeout); err != nil {
		t.Fatalf("the WindDown job's ctx was cancelled at Stop (%v); it must live through the grace", err)
	}
	if err := testwait.Recv(t, plainDone, testwait.Timeout); err == nil {
		t.Fatal("a job without WindDown kept its ctx after Stop")
	}
	select {
	case <-stopped:
		t.Fatal("Stop returned while a WindDown job was still finishing")
	default:
	}
	close(finish)
	testwait.Recv(t, stopped, testwait.Timeout)
	if got := testutil.ToFloat64(d.metrics.runs.WithLabelValues("reconcile", "cancelled")); got != 1 {
		t.Fatalf("a stopped run counted %v times as cancelled; want 1", got)
	}
	if got := testutil.ToFloat64(d.metrics.runs.WithLabelValues("reconcile", "ok")); got != 0 {
		t.Fatalf("a stopped run counted as ok")
	}
}

// When the grace runs out, a WindDown job still running has its ctx
// cancelled (a reconcile pass then gives its probes back), and Stop
// returns.
func TestWindDownJobCancelledWhenTheGraceRunsOut(t *testing.T) {
	started := make(chan struct{}, 1)
	d, err := New(Config{
		RunAtStart:      true,
		ShutdownTimeout: 50 * time.Millisecond,
		Jobs: []Job{{Name: "reconcile", Spec: "@every 1h", WindDown: true, Run: func(ctx context.Context) error {
			started <- struct{}{}
			<-ctx.Done() // a probe that outlives the grace
			return ctx.Err()
		}}},
	})
	if err != nil {
		t.Fatal(err)
	}
	if err := d.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	testwait.Recv(t, started, testwait.Timeout)
	stop(t, d)
}

// Every job's run and skip counters exist from the start: a dashboard
// panel of skipped ticks shows 0, not "No data".
func TestJobSeriesStartAtZero(t *testing.T) {
	reg := prometheus.NewRegistry()
	if _, err := New(Config{Registry: reg, Jobs: []Job{{Name: "purge", Spec: "@every 1h", Run: func(context.Context) error { return nil }}}}); err != nil {
		t.Fatal(err)
	}
	const want = `
# HELP ledgerkeeper_job_skipped_total Ticks skipped because the job's previous run was still going.
# TYPE ledgerkeeper_job_skipped_total counter
ledgerkeeper_job_skipped_total{task="purge"} 0
`
	if err := testutil.GatherAndCompare(reg, strings.NewReader(want), "ledgerkeeper_job_skipped_total"); err != nil {
		t.Fatal(err)
	}
	if n := testutil.CollectAndCount(reg, "ledgerkeeper_job_runs_total"); n != 3 {
		t.Fatalf("job_runs_total has %d series; want ok, error and cancelled", n)
	}
}

// serve's reconcile job logs one Info line per pass, an idle one included,
// with its counts; it is a WindDown job passing the daemon's stop to the
// pass.
func TestReconcileJobLogsEveryPass(t *testing.T) {
	db := pgtest.New(t)
	var buf strings.Builder
	var mu sync.Mutex
	logger := slog.New(slog.NewTextHandler(&lockedWriter{mu: &mu, w: &buf}, nil))
	eng := reconcile.New(reconcile.Config{Actor: "test-replica"}, db.Pool, nil, nil)
	j := ReconcileJob("@every 1h", eng, logger)
	if !j.WindDown {
		t.Fatal("the reconcile job must wind down on shutdown")
	}
	if err := j.Run(context.Background()); err != nil {
		t.Fatal(err)
	}
	mu.Lock()
	out := buf.String()
	mu.Unlock()
	if !strings.Contains(out, `msg="reconcile pass" keys=0 alerts_raised=0 resolved_alerts=0 duration=`) {
		t.Fatalf("idle pass log line: %q", out)
	}
}

type lockedWriter struct {
	mu *sync.Mutex
	w  *strings.Builder
}

func (l *lockedWriter) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.w.Write(p)
}
