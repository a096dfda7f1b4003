package reconcile

import (
	"time"

	"github.com/ledgerkeeper/ledgerkeeper/store"
	"github.com/prometheus/client_golang/prometheus"
)

// Metrics are the engine's Prometheus series.
type Metrics struct {
	probes        *prometheus.CounterVec
	probeDuration *prometheus.HistogramVec
	decisions     *prometheus.CounterVec
	passes        *prometheus.CounterVec
	passDuration  prometheus.Histogram
	breakerOpens  *prometheus.CounterVec
	lastPass      prometheus.Gauge
	check         *checkMetrics
	// rateWait, pauses and pausedUntil: the polite prober (ratelimit.go).
	rateWait    *prometheus.CounterVec
	pauses      *prometheus.CounterVec
	pausedUntil *prometheus.GaugeVec
	// unreachableShards: a Citus ledger's workers the last pass could not
	// reach (shards.go).
	unreachableShards *prometheus.GaugeVec
}

// NewMetrics registers the engine's series with reg.
func NewMetrics(reg prometheus.Registerer) *Metrics {
	m := &Metrics{
		probes: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "ledgerkeeper_reconcile_probes_total",
			Help: "Probes run, by tool and verdict. A key of a tool without a probe is not probed and not counted here (see decisions_total{action=\"no_probe\"}).",
		}, []string{"tool", "verdict"}),
		probeDuration: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "ledgerkeeper_reconcile_probe_duration_seconds",
			Help:    "Latency of the probes that ran, by tool.",
			Buckets: prometheus.ExponentialBuckets(0.005, 2, 12),
		}, []string{"tool"}),
		decisions: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "ledgerkeeper_reconcile_decisions_total",
			Help: "Reconcile decisions recorded, by tool and action.",
		}, []string{"tool", "action"}),
		passes: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "ledgerkeeper_reconcile_passes_total",
			Help: "Reconcile passes, by result (ok, error, including a database that cannot be reached, or stopped by a shutdown).",
		}, []string{"result"}),
		passDuration: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name:    "ledgerkeeper_reconcile_pass_duration_seconds",
			Help:    "Duration of reconcile passes.",
			Buckets: prometheus.ExponentialBuckets(0.01, 2, 14),
		}),
		breakerOpens: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "ledgerkeeper_reconcile_breaker_opens_total",
			Help: "Times a tool's circuit breaker opened.",
		}, []string{"tool"}),
		lastPass: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "ledgerkeeper_reconcile_last_success_timestamp_seconds",
			Help: "Unix time of the last reconcile pass that finished without error.",
		}),
	}
	m.unreachableShards = prometheus.NewGaugeVec(prometheus.GaugeOpts{
		Name: "ledgerkeeper_reconcile_unreachable_shards",
		Help: "Shards of a Citus ledger the last reconcile pass could not read, by worker (host:port): their keys wait for the worker.",
	}, []string{"node"})
	m.rateWait = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "ledgerkeeper_reconcile_probe_rate_limit_wait_seconds_total",
		Help: "Seconds probes of a tool waited for its probe.rate_limit (this process), by tool.",
	}, []string{"tool"})
	m.pauses = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "ledgerkeeper_reconcile_probe_pauses_total",
		Help: "Times a tool's downstream paused its probing with a 429 or 503 and Retry-After (this process), by tool. No attempt is counted against the keys.",
	}, []string{"tool"})
	m.pausedUntil = prometheus.NewGaugeVec(prometheus.GaugeOpts{
		Name: "ledgerkeeper_reconcile_probe_paused_until_timestamp_seconds",
		Help: "Unix time until which a downstream's Retry-After paused the tool's probing in this process (in the past: not paused).",
	}, []string{"tool"})
	reg.MustRegister(m.probes, m.probeDuration, m.decisions, m.passes, m.passDuration, m.breakerOpens, m.lastPass,
		m.rateWait, m.pauses, m.pausedUntil, m.unreachableShards)
	for _, r := range []string{"ok", "error", "stopped"} {
		m.passes.WithLabelValues(r) // from zero: the first failure is an increase
	}
	m.check = newCheckMetrics(reg)
	return m
}

// initTool starts a configured tool's counters at zero, so that rate() and
// increase() see their first event. no_probe is a decision, not a verdict:
// a tool without a probe moves decisions_total{action="no_probe"} and no
// probe series.
func (m *Metrics) initTool(tool string) {
	m.check.initTool(tool)
	m.breakerOpens.WithLabelValues(tool)
	m.rateWait.WithLabelValues(tool)
	m.pauses.WithLabelValues(tool)
	for _, v := range []string{"found", "not_found", "duplicate", "unknown"} {
		m.probes.WithLabelValues(tool, v)
	}
	for _, a := range []string{ActionCompleted, ActionMarkedRetryable, ActionBackoff, ActionDuplicate, ActionNoProbe,
		ActionWithheldUntrusted, ActionWithheldUnwitnessed} {
		m.decisions.WithLabelValues(tool, a)
	}
}

// observeProbe counts a probe that ran, with its verdict and latency. It is
// never called for a key of a tool without a probe: that is no probe
// failure, and counting it as verdict unknown would make a tool that has
// no probe look like one whose probe fails (LedgerkeeperProbeErrorsHigh).
func (m *Metrics) observeProbe(tool, verdict string, d time.Duration) {
	m.probes.WithLabelValues(tool, verdict).Inc()
	m.probeDuration.WithLabelValues(tool).Observe(d.Seconds())
}

// observeDecision counts a decision of the pass by its action, no_probe
// included.
func (m *Metrics) observeDecision(tool, action string) {
	m.decisions.WithLabelValues(tool, action).Inc()
}

func (m *Metrics) breakerOpened(tool string) { m.breakerOpens.WithLabelValues(tool).Inc() }

// rateLimitWaited counts time a probe waited for its tool's rate limit. m
// may be nil.
func (m *Metrics) rateLimitWaited(tool string, d time.Duration) {
	if m != nil {
		m.rateWait.WithLabelValues(tool).Add(d.Seconds())
	}
}

// probePaused records a downstream's pause of a tool's probing: counted
// when it starts, the gauge moved whenever it lengthens. m may be nil.
func (m *Metrics) probePaused(tool string, until time.Time, started bool) {
	if m == nil {
		return
	}
	if started {
		m.pauses.WithLabelValues(tool).Inc()
	}
	m.pausedUntil.WithLabelValues(tool).Set(float64(until.UnixMilli()) / 1000)
}

// observeShards sets the unreachable shards gauge from a pass's faults
// (nil: every shard read).
func (m *Metrics) observeShards(e *store.ShardsUnreachableError) {
	if m == nil {
		return
	}
	m.unreachableShards.Reset()
	if e == nil {
		return
	}
	for _, node := range e.Nodes() {
		m.unreachableShards.WithLabelValues(node).Set(float64(len(e.ShardsOn(node))))
	}
}

func (m *Metrics) observePass(r Report, err error) {
	if r.DryRun {
		return
	}
	m.passDuration.Observe(r.Duration.Seconds())
	if err != nil {
		m.passes.WithLabelValues("error").Inc()
		return
	}
	if r.Stopped {
		// Asked to stop: not a failure, nor a pass that got through.
		m.passes.WithLabelValues("stopped").Inc()
		return
	}
	m.passes.WithLabelValues("ok").Inc()
	m.lastPass.Set(float64(r.StartedAt.Add(r.Duration).Unix()))
}
