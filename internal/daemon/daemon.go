// Package daemon runs `ledgerkeeper serve`: scheduled jobs (reconcile,
// purge, alert dispatch) on robfig/cron, and an HTTP listener with
// /metrics, /healthz and /readyz.
//
// Replicas need no leader: every job is safe to run in several processes at
// once (leases for reconcile, an advisory lock for purge, SKIP LOCKED for
// alert delivery). Within one process a job never overlaps itself: a tick
// that finds the previous run still going is skipped and counted.
package daemon

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"github.com/robfig/cron/v3"
)

// Job is one scheduled task.
type Job struct {
	// Name labels logs and metrics ("reconcile", "purge", "alerts").
	Name string
	// Spec is a robfig/cron spec ("@every 30s", "0 * * * *").
	Spec string
	// Timeout bounds one run. Default 10m.
	Timeout time.Duration
	// Run does the work. A returned error is logged and counted; the
	// schedule goes on.
	Run func(ctx context.Context) error
}

// Config configures a Daemon.
type Config struct {
	// Listen is the HTTP address (":9464"). Empty: no listener.
	Listen string
	Jobs   []Job
	// Registry receives the daemon's own series and serves /metrics.
	Registry *prometheus.Registry
	// Ready is /readyz's check (database reachable, schema current).
	Ready func(ctx context.Context) error
	// RunAtStart runs every job once right after Start, then on schedule.
	RunAtStart bool
	// ShutdownTimeout bounds Stop. Default 30s.
	ShutdownTimeout time.Duration
	Logger          *slog.Logger
}

// Daemon is the serve loop. Start it once; Stop is safe before Start and
// more than once.
type Daemon struct {
	cfg     Config
	cron    *cron.Cron
	srv     *http.Server
	ln      net.Listener
	metrics *jobMetrics

	mu      sync.Mutex
	cancel  context.CancelFunc
	wg      sync.WaitGroup
	started bool
	stopped bool
}

// New validates the job specs and returns a daemon.
func New(cfg Config) (*Daemon, error) {
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	if cfg.Registry == nil {
		cfg.Registry = prometheus.NewRegistry()
	}
	cfg.ShutdownTimeout = cmp.Or(cfg.ShutdownTimeout, 30*time.Second)
	parser := cron.NewParser(cron.Minute | cron.Hour | cron.Dom | cron.Month | cron.Dow | cron.Descriptor)
	d := &Daemon{
		cfg:     cfg,
		cron:    cron.New(cron.WithParser(parser), cron.WithLogger(&cronLogger{log: cfg.Logger})),
		metrics: newJobMetrics(cfg.Registry),
	}
	for _, j := range cfg.Jobs {
		if _, err := parser.Parse(j.Spec); err != nil {
			return nil, fmt.Errorf("schedule of %s: bad cron spec %q: %w", j.Name, j.Spec, err)
		}
	}
	return d, nil
}

// Start binds the listener (so a busy port fails here, not later), then
// starts the scheduler. It returns at once.
func (d *Daemon) Start(ctx context.Context) error {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.started {
		return errors.New("daemon already started")
	}
	d.started = true
	runCtx, cancel := context.WithCancel(context.WithoutCancel(ctx))
	d.cancel = cancel
	if d.cfg.Listen != "" {
		ln, err := net.Listen("tcp", d.cfg.Listen)
		if err != nil {
			cancel()
			return fmt.Errorf("listen on %s: %w", d.cfg.Listen, err)
		}
		d.ln = ln
		d.srv = &http.Server{Handler: d.handler(), ReadHeaderTimeout: 5 * time.Second}
		d.wg.Add(1)
		go func() {
			defer d.wg.Done()
			if err := d.srv.Serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
				d.cfg.Logger.Error("http server", "err", err)
			}
		}()
	}
	for _, j := range d.cfg.Jobs {
		// One chain per job, so that each job's logger adapter counts its
		// own skips. SkipIfStillRunning stands outside Recover: a panic is
		// recovered before it could unwind past SkipIfStillRunning, which
		// would then never give its run token back and skip the job forever.
		log := &cronLogger{log: d.cfg.Logger.With("job", j.Name), skipped: d.metrics.skipped.WithLabelValues(j.Name)}
		job := cron.NewChain(cron.SkipIfStillRunning(log), cron.Recover(log)).Then(cron.FuncJob(func() { d.runJob(runCtx, j) }))
		if _, err := d.cron.AddJob(j.Spec, job); err != nil {
			cancel()
			return err
		}
		if d.cfg.RunAtStart {
			// The same wrapped job as the schedule's: a tick during this
			// run is skipped and counted like any other.
			d.wg.Add(1)
			go func() {
				defer d.wg.Done()
				job.Run()
			}()
		}
	}
	d.cron.Start()
	d.cfg.Logger.Info("ledgerkeeper serving", "listen", d.Addr(), "jobs", len(d.cfg.Jobs))
	return nil
}

// Addr is the bound listen address ("" without a listener).
func (d *Daemon) Addr() string {
	if d.ln == nil {
		return ""
	}
	return d.ln.Addr().String()
}

// Stop stops scheduling, cancels running jobs, waits for them (bounded by
// ShutdownTimeout) and shuts the listener down.
func (d *Daemon) Stop() {
	d.mu.Lock()
	if !d.started || d.stopped { // before Start: nothing to stop
		d.mu.Unlock()
		return
	}
	d.stopped = true
	d.mu.Unlock()

	cronDone := d.cron.Stop() // no new runs
	d.cancel()                // running jobs wind down (decisions in flight are still written)
	ctx, cancel := context.WithTimeout(context.Background(), d.cfg.ShutdownTimeout)
	defer cancel()
	select {
	case <-cronDone.Done():
	case <-ctx.Done():
		d.cfg.Logger.Warn("jobs still running at shutdown deadline")
	}
	if d.srv != nil {
		_ = d.srv.Shutdown(ctx)
	}
	d.wg.Wait()
	d.cfg.Logger.Info("ledgerkeeper stopped")
}

// runJob runs j once with its timeout and records the result. It runs
// inside robfig/cron's SkipIfStillRunning and Recover wrappers: overlap and
// panics are theirs to handle; a panic still counts here as an error run
// (the deferred record runs while the panic unwinds to Recover, which logs
// it with its stack).
func (d *Daemon) runJob(ctx context.Context, j Job) {
	if ctx.Err() != nil {
		return
	}
	ctx, cancel := context.WithTimeout(ctx, cmp.Or(j.Timeout, 10*time.Minute))
	defer cancel()
	start := time.Now()
	returned := false
	defer func() {
		if !returned { // panicking
			d.metrics.duration.WithLabelValues(j.Name).Observe(time.Since(start).Seconds())
			d.metrics.runs.WithLabelValues(j.Name, "error").Inc()
		}
	}()
	err := j.Run(ctx)
	returned = true
	d.metrics.duration.WithLabelValues(j.Name).Observe(time.Since(start).Seconds())
	switch {
	case err == nil:
		d.metrics.runs.WithLabelValues(j.Name, "ok").Inc()
		d.metrics.lastSuccess.WithLabelValues(j.Name).SetToCurrentTime()
	case errors.Is(err, context.Canceled) && ctx.Err() != nil:
		// Shutdown: not an error worth logging.
		d.metrics.runs.WithLabelValues(j.Name, "cancelled").Inc()
	default:
		d.metrics.runs.WithLabelValues(j.Name, "error").Inc()
		d.cfg.Logger.Error("job failed", "job", j.Name, "err", err)
	}
}

// cronLogger adapts slog to cron.Logger for one job's wrappers (and, with
// skipped nil, for the scheduler itself). cron's routine messages go to
// Debug. SkipIfStillRunning reports a skipped tick only by logging "skip",
// so that message is also what counts it; TestJobNeverOverlapsItself
// fails if a cron release changes it.
type cronLogger struct {
	log     *slog.Logger
	skipped prometheus.Counter
}

// Info logs cron's routine messages at Debug and counts skipped ticks.
func (l *cronLogger) Info(msg string, keysAndValues ...any) {
	if msg == "skip" && l.skipped != nil {
		l.skipped.Inc()
		l.log.Debug("previous run still going; tick skipped")
		return
	}
	l.log.Debug("cron: "+msg, keysAndValues...)
}

// Error logs cron's errors; from Recover, a job's panic with its stack.
func (l *cronLogger) Error(err error, msg string, keysAndValues ...any) {
	if msg == "panic" {
		msg = "job panicked"
	} else {
		msg = "cron: " + msg
	}
	l.log.Error(msg, append([]any{"err", err}, keysAndValues...)...)
}

func (d *Daemon) handler() http.Handler {
	mux := http.NewServeMux()
	mux.Handle("GET /metrics", promhttp.HandlerFor(d.cfg.Registry, promhttp.HandlerOpts{Registry: d.cfg.Registry}))
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, _ *http.Request) {
		_, _ = w.Write([]byte("ok\n"))
	})
	mux.HandleFunc("GET /readyz", func(w http.ResponseWriter, r *http.Request) {
		if d.cfg.Ready != nil {
			ctx, cancel := context.WithTimeout(r.Context(), 3*time.Second)
			defer cancel()
			if err := d.cfg.Ready(ctx); err != nil {
				http.Error(w, "not ready: "+err.Error(), http.StatusServiceUnavailable)
				return
			}
		}
		_, _ = w.Write([]byte("ready\n"))
	})
	return mux
}

// jobMetrics label the scheduled job "task": a label named "job" would clash
// with Prometheus's scrape job and be renamed exported_job.
type jobMetrics struct {
	runs        *prometheus.CounterVec
	skipped     *prometheus.CounterVec
	duration    *prometheus.HistogramVec
	lastSuccess *prometheus.GaugeVec
}

func newJobMetrics(reg prometheus.Registerer) *jobMetrics {
	m := &jobMetrics{
		runs: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "ledgerkeeper_job_runs_total",
			Help: "Scheduled job runs, by job and result (ok, error, cancelled).",
		}, []string{"task", "result"}),
		skipped: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "ledgerkeeper_job_skipped_total",
			Help: "Ticks skipped because the job's previous run was still going.",
		}, []string{"task"}),
		duration: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "ledgerkeeper_job_duration_seconds",
			Help:    "Duration of scheduled job runs.",
			Buckets: prometheus.ExponentialBuckets(0.01, 2, 16),
		}, []string{"task"}),
		lastSuccess: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "ledgerkeeper_job_last_success_timestamp_seconds",
			Help: "Unix time of the job's last successful run.",
		}, []string{"task"}),
	}
	reg.MustRegister(m.runs, m.skipped, m.duration, m.lastSuccess)
	return m
}
