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
	running map[string]bool
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
		cron:    cron.New(cron.WithParser(parser), cron.WithLogger(cron.DiscardLogger)),
		running: map[string]bool{},
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
		if _, err := d.cron.AddFunc(j.Spec, func() { d.runJob(runCtx, j) }); err != nil {
			cancel()
			return err
		}
		if d.cfg.RunAtStart {
			d.wg.Add(1)
			go func() {
				defer d.wg.Done()
				d.runJob(runCtx, j)
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

func (d *Daemon) runJob(ctx context.Context, j Job) {
	d.mu.Lock()
	if d.running[j.Name] {
		d.mu.Unlock()
		d.metrics.skipped.WithLabelValues(j.Name).Inc()
		d.cfg.Logger.Debug("previous run still going; tick skipped", "job", j.Name)
		return
	}
	d.running[j.Name] = true
	d.mu.Unlock()
	defer func() {
		d.mu.Lock()
		d.running[j.Name] = false
		d.mu.Unlock()
	}()
	if ctx.Err() != nil {
		return
	}
	ctx, cancel := context.WithTimeout(ctx, cmp.Or(j.Timeout, 10*time.Minute))
	defer cancel()
	start := time.Now()
	err := func() (err error) {
		defer func() {
			if r := recover(); r != nil {
				err = fmt.Errorf("panic: %v", r)
			}
		}()
		return j.Run(ctx)
	}()
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
