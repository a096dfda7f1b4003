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
	"slices"
	"strings"
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
	// Ledger names the ledger the job works on, in a process that keeps
	// several: its series carry a ledger label and its log lines the
	// ledger's name. Empty: the one ledger (no label, as always).
	Ledger string
	// WindDown: at Stop the run's ctx stays alive for up to
	// Config.ShutdownTimeout (the grace) and the run learns of the stop
	// from Stopping(ctx), so it can finish what it started (a reconcile
	// pass writes the decisions of the probes in flight); ctx is cancelled
	// when the grace runs out. Without it, Stop cancels ctx at once.
	WindDown bool
}

type stoppingKey struct{}

// Stopping returns a channel closed when the daemon is asked to stop: a
// WindDown job starts nothing new once it is closed, and finishes what is
// in flight while its ctx lives. Outside a daemon's job it is nil (never
// closed).
func Stopping(ctx context.Context) <-chan struct{} {
	ch, _ := ctx.Value(stoppingKey{}).(chan struct{})
	return ch
}

// Config configures a Daemon.
type Config struct {
	// Listen is the HTTP address (":9464"). Empty: no listener.
	Listen string
	Jobs   []Job
	// Registry receives the daemon's own series and serves /metrics.
	Registry *prometheus.Registry
	// Ready is /readyz's check (database writable, schema current).
	Ready func(ctx context.Context) error
	// LedgersReady, in a process that keeps several ledgers, is each
	// ledger's /readyz check by name (Ready is then not used): the process
	// is ready while any ledger is, and the body names each ledger's state.
	LedgersReady map[string]func(ctx context.Context) error
	// QuietError, when set, names the job errors that get no log line of
	// their own (they are still counted): those of a database known to be
	// failing over, whose failover was logged once (DatabaseHealth.Quiet).
	QuietError func(error) bool
	// RunAtStart runs every job once right after Start, then on schedule.
	RunAtStart bool
	// ShutdownTimeout is the grace Stop gives running jobs (WindDown jobs
	// keep their ctx that long) before it cancels them; Stop then waits at
	// most hardStopWait more for them to give their work back. Default 30s.
	ShutdownTimeout time.Duration
	Logger          *slog.Logger
	// Routes are more handlers on the listener, by http.ServeMux pattern
	// ("POST /slack/interactions"). Ignored without Listen.
	Routes map[string]http.Handler
	// Services run beside the jobs (Slack's Socket Mode): started after
	// the listener, stopped before it shuts down.
	Services []Service
}

// Service is a long-running part of serve other than a scheduled job.
// Start returns at once (the service backgrounds itself); Stop waits for
// it to end and is safe before Start.
type Service interface {
	Start(ctx context.Context) error
	Stop()
}

// Daemon is the serve loop. Start it once; Stop is safe before Start and
// more than once.
type Daemon struct {
	cfg  Config
	cron *cron.Cron
	srv  *http.Server
	ln   net.Listener
	// metrics are the series of the jobs of no named ledger (registered
	// only when there are such jobs, or none at all).
	metrics *jobMetrics
	// ledgerMetrics are the job series of each named ledger (Job.Ledger).
	ledgerMetrics map[string]*jobMetrics

	mu     sync.Mutex
	cancel context.CancelFunc // jobs without WindDown: cancelled at Stop
	// drainCancel cancels WindDown jobs when the grace runs out.
	drainCancel context.CancelFunc
	drainCtx    context.Context
	stopping    chan struct{} // closed at Stop
	wg          sync.WaitGroup
	startRuns   sync.WaitGroup // RunAtStart runs
	started     bool
	stopped     bool
}

// Degraded is a /readyz check's answer for a ledger that works in part:
// ready (200), with the reason in the body. A Citus ledger with a worker
// down is one: the other workers' shards are reconciled and purged.
type Degraded struct {
	Reason string
}

func (d *Degraded) Error() string { return "degraded: " + d.Reason }

// readyLedgers answers /readyz for several ledgers: every ledger checked
// at once, one line each ("ledger billing: ready", "ledger support: not
// ready: …"); 200 while any is ready, 503 when none is.
func (d *Daemon) readyLedgers(ctx context.Context, w http.ResponseWriter) {
	names := make([]string, 0, len(d.cfg.LedgersReady))
	for n := range d.cfg.LedgersReady {
		names = append(names, n)
	}
	slices.Sort(names)
	errs := make([]error, len(names))
	var wg sync.WaitGroup
	for i, n := range names {
		wg.Go(func() { errs[i] = d.cfg.LedgersReady[n](ctx) })
	}
	wg.Wait()
	var b strings.Builder
	ready := 0
	for i, n := range names {
		var deg *Degraded
		if errors.As(errs[i], &deg) {
			ready++
			fmt.Fprintf(&b, "ledger %s: ready, degraded: %s\n", n, deg.Reason)
		} else if errs[i] == nil {
			ready++
			fmt.Fprintf(&b, "ledger %s: ready\n", n)
		} else {
			fmt.Fprintf(&b, "ledger %s: not ready: %v\n", n, errs[i])
		}
	}
	w.Header().Set("Content-Type", "text/plain; charset=utf-8")
	w.Header().Set("X-Content-Type-Options", "nosniff")
	switch {
	case ready == 0:
		w.WriteHeader(http.StatusServiceUnavailable)
		_, _ = fmt.Fprintf(w, "not ready: no ledger is ready\n%s", b.String())
	case ready < len(names):
		_, _ = fmt.Fprintf(w, "ready: %d of %d ledgers\n%s", ready, len(names), b.String())
	default:
		_, _ = fmt.Fprintf(w, "ready\n%s", b.String())
	}
}

// metricsOf is the series j counts into.
func (d *Daemon) metricsOf(j Job) *jobMetrics {
	if m := d.ledgerMetrics[j.Ledger]; m != nil {
		return m
	}
	return d.metrics
}

// jobLogger is the logger of j's lines: the job's name, and its ledger's.
func (d *Daemon) jobLogger(j Job) *slog.Logger {
	if j.Ledger != "" {
		return d.cfg.Logger.With("job", j.Name, "ledger", j.Ledger)
	}
	return d.cfg.Logger.With("job", j.Name)
}

// hardStopWait bounds how long Stop waits, after cancelling the jobs still
// running at the end of the grace, for them to give their leases back and
// record their runs.
const hardStopWait = 10 * time.Second

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
		cfg:  cfg,
		cron: cron.New(cron.WithParser(parser), cron.WithLogger(&cronLogger{log: cfg.Logger})),
	}
	for _, j := range cfg.Jobs {
		if _, err := parser.Parse(j.Spec); err != nil {
			return nil, fmt.Errorf("schedule of %s: bad cron spec %q: %w", j.Name, j.Spec, err)
		}
		switch {
		case j.Ledger == "" && d.metrics == nil:
			d.metrics = newJobMetrics(cfg.Registry)
		case j.Ledger != "" && d.ledgerMetrics[j.Ledger] == nil:
			if d.ledgerMetrics == nil {
				d.ledgerMetrics = map[string]*jobMetrics{}
			}
			d.ledgerMetrics[j.Ledger] = newJobMetrics(prometheus.WrapRegistererWith(prometheus.Labels{"ledger": j.Ledger}, cfg.Registry))
		}
		d.metricsOf(j).init(j.Name)
	}
	if d.metrics == nil && len(d.ledgerMetrics) == 0 {
		d.metrics = newJobMetrics(cfg.Registry)
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
	d.stopping = make(chan struct{})
	base := context.WithValue(context.WithoutCancel(ctx), stoppingKey{}, d.stopping)
	runCtx, cancel := context.WithCancel(base)
	d.cancel = cancel
	d.drainCtx, d.drainCancel = context.WithCancel(base)
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
		log := &cronLogger{log: d.jobLogger(j), skipped: d.metricsOf(j).skipped.WithLabelValues(j.Name)}
		jobCtx := runCtx
		if j.WindDown {
			jobCtx = d.drainCtx
		}
		job := cron.NewChain(cron.SkipIfStillRunning(log), cron.Recover(log)).Then(cron.FuncJob(func() { d.runJob(jobCtx, j) }))
		if _, err := d.cron.AddJob(j.Spec, job); err != nil {
			cancel()
			d.drainCancel()
			return err
		}
		if d.cfg.RunAtStart {
			// The same wrapped job as the schedule's: a tick during this
			// run is skipped and counted like any other.
			d.startRuns.Add(1)
			go func() {
				defer d.startRuns.Done()
				job.Run()
			}()
		}
	}
	for i, svc := range d.cfg.Services {
		if err := svc.Start(runCtx); err != nil {
			for _, started := range d.cfg.Services[:i] {
				started.Stop()
			}
			cancel()
			d.drainCancel()
			if d.srv != nil {
				_ = d.srv.Close()
				d.wg.Wait()
			}
			return fmt.Errorf("start service: %w", err)
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

// Stop stops scheduling and asks running jobs to stop: a job without
// WindDown has its ctx cancelled at once; a WindDown job sees Stopping and
// keeps its ctx for ShutdownTimeout (a reconcile pass's probes in flight
// finish and their decisions are written), then it is cancelled and given
// hardStopWait more to give its work back. Then the services stop (Socket
// Mode finishes the interactions in hand) and the listener shuts down.
func (d *Daemon) Stop() {
	d.mu.Lock()
	if !d.started || d.stopped { // before Start: nothing to stop
		d.mu.Unlock()
		return
	}
	d.stopped = true
	d.mu.Unlock()

	cronDone := d.cron.Stop() // no new runs
	close(d.stopping)         // WindDown jobs start nothing new
	d.cancel()                // the others stop now
	d.cfg.Logger.Info("jobs asked to stop: a reconcile pass leases no more keys, its probes in flight may finish within the grace",
		"shutdown_timeout", d.cfg.ShutdownTimeout)
	jobsDone := make(chan struct{})
	go func() {
		<-cronDone.Done()
		d.startRuns.Wait()
		close(jobsDone)
	}()
	grace := time.NewTimer(d.cfg.ShutdownTimeout)
	defer grace.Stop()
	select {
	case <-jobsDone:
	case <-grace.C:
		d.cfg.Logger.Warn("jobs still running at the end of the shutdown grace: cancelling them (probes still running are given back, not counted)",
			"shutdown_timeout", d.cfg.ShutdownTimeout)
		d.drainCancel()
		hard := time.NewTimer(hardStopWait)
		defer hard.Stop()
		select {
		case <-jobsDone:
		case <-hard.C:
			d.cfg.Logger.Warn("jobs still running after being cancelled; stopping without them")
		}
	}
	d.drainCancel()
	for _, svc := range d.cfg.Services {
		svc.Stop()
	}
	if d.srv != nil {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		_ = d.srv.Shutdown(ctx)
		cancel()
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
	if ctx.Err() != nil || isClosed(Stopping(ctx)) {
		return
	}
	ctx, cancel := context.WithTimeout(ctx, cmp.Or(j.Timeout, 10*time.Minute))
	defer cancel()
	start := time.Now()
	returned := false
	defer func() {
		if !returned { // panicking
			d.metricsOf(j).duration.WithLabelValues(j.Name).Observe(time.Since(start).Seconds())
			d.metricsOf(j).runs.WithLabelValues(j.Name, "error").Inc()
		}
	}()
	err := j.Run(ctx)
	returned = true
	d.metricsOf(j).duration.WithLabelValues(j.Name).Observe(time.Since(start).Seconds())
	switch {
	case err == nil && isClosed(Stopping(ctx)):
		// Stopped gracefully: cut short, not a success.
		d.metricsOf(j).runs.WithLabelValues(j.Name, "cancelled").Inc()
	case err == nil:
		d.metricsOf(j).runs.WithLabelValues(j.Name, "ok").Inc()
		d.metricsOf(j).lastSuccess.WithLabelValues(j.Name).SetToCurrentTime()
	case errors.Is(err, context.Canceled) && ctx.Err() != nil:
		// Shutdown: not an error worth logging.
		d.metricsOf(j).runs.WithLabelValues(j.Name, "cancelled").Inc()
	case d.cfg.QuietError != nil && d.cfg.QuietError(err):
		d.metricsOf(j).runs.WithLabelValues(j.Name, "error").Inc()
		d.jobLogger(j).Debug("job failed while the database fails over", "err", err)
	default:
		d.metricsOf(j).runs.WithLabelValues(j.Name, "error").Inc()
		d.jobLogger(j).Error("job failed", "err", err)
	}
}

func isClosed(ch <-chan struct{}) bool {
	select {
	case <-ch:
		return true
	default:
		return false
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
	for pattern, h := range d.cfg.Routes {
		mux.Handle(pattern, h)
	}
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, _ *http.Request) {
		_, _ = w.Write([]byte("ok\n"))
	})
	mux.HandleFunc("GET /readyz", func(w http.ResponseWriter, r *http.Request) {
		ctx, cancel := context.WithTimeout(r.Context(), 3*time.Second)
		defer cancel()
		if len(d.cfg.LedgersReady) > 0 {
			d.readyLedgers(ctx, w)
			return
		}
		if d.cfg.Ready != nil {
			err := d.cfg.Ready(ctx)
			var deg *Degraded
			if errors.As(err, &deg) {
				w.Header().Set("Content-Type", "text/plain; charset=utf-8")
				w.Header().Set("X-Content-Type-Options", "nosniff")
				_, _ = fmt.Fprintf(w, "ready, degraded: %s\n", deg.Reason)
				return
			}
			if err != nil {
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

// init starts a job's counters at zero, so that a dashboard panel shows 0
// rather than "No data" before the first skipped tick or failed run.
func (m *jobMetrics) init(job string) {
	m.skipped.WithLabelValues(job)
	for _, r := range []string{"ok", "error", "cancelled"} {
		m.runs.WithLabelValues(job, r)
	}
}
