package expiry

import (
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// Metrics are the purge's Prometheus series: enough to see from a dashboard
// that purge keeps up (rows deleted, backlog of expired processing keys) and
// that it stays gentle (batch durations and sizes, timeouts). A nil *Metrics
// records nothing.
type Metrics struct {
	rowsDeleted       *prometheus.CounterVec
	batches           *prometheus.CounterVec
	batchDuration     prometheus.Histogram
	batchSize         prometheus.Gauge
	expiredProcessing prometheus.Gauge
	alertsRaised      prometheus.Counter
	passes            *prometheus.CounterVec
	passDuration      prometheus.Histogram
	lastSuccess       prometheus.Gauge
}

// NewMetrics registers the purge's series with reg.
func NewMetrics(reg prometheus.Registerer) *Metrics {
	m := &Metrics{
		rowsDeleted: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "ledgerkeeper_purge_rows_deleted_total",
			Help: "Rows deleted by purge, by table.",
		}, []string{"table"}),
		batches: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "ledgerkeeper_purge_batches_total",
			Help: "Purge batches, by result (ok or timeout).",
		}, []string{"result"}),
		batchDuration: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name:    "ledgerkeeper_purge_batch_duration_seconds",
			Help:    "Duration of one purge batch transaction.",
			Buckets: prometheus.ExponentialBuckets(0.001, 2, 14),
		}),
		batchSize: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "ledgerkeeper_purge_batch_size",
			Help: "Current adaptive batch size of the purge of idempotency_keys.",
		}),
		expiredProcessing: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "ledgerkeeper_purge_expired_processing_keys",
			Help: "Processing keys past expires_at found by the last purge pass (kept, alerted).",
		}),
		alertsRaised: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "ledgerkeeper_purge_alerts_raised_total",
			Help: "expired_processing alerts raised into the outbox by purge.",
		}),
		passes: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "ledgerkeeper_purge_passes_total",
			Help: "Purge passes, by result (ok, budget_exhausted, already_running or error).",
		}, []string{"result"}),
		passDuration: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name:    "ledgerkeeper_purge_pass_duration_seconds",
			Help:    "Duration of purge passes.",
			Buckets: prometheus.ExponentialBuckets(0.01, 2, 17),
		}),
		lastSuccess: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "ledgerkeeper_purge_last_success_timestamp_seconds",
			Help: "Unix time of the end of the last purge pass that finished without error.",
		}),
	}
	reg.MustRegister(m.rowsDeleted, m.batches, m.batchDuration, m.batchSize, m.expiredProcessing,
		m.alertsRaised, m.passes, m.passDuration, m.lastSuccess)
	return m
}

// init starts every series a dashboard panel or alert rule queries at
// zero, so that a panel shows 0 rather than "No data" before the first
// timeout or deletion, and rate() and increase() see the first event.
func (m *Metrics) init(tables []string) {
	if m == nil {
		return
	}
	for _, t := range tables {
		m.rowsDeleted.WithLabelValues(t)
	}
	for _, r := range []string{"ok", "timeout"} {
		m.batches.WithLabelValues(r)
	}
	for _, r := range []string{"ok", "budget_exhausted", "already_running", "error"} {
		m.passes.WithLabelValues(r)
	}
}

func (m *Metrics) observeBatch(d time.Duration, timedOut bool) {
	if m == nil {
		return
	}
	result := "ok"
	if timedOut {
		result = "timeout"
	}
	m.batches.WithLabelValues(result).Inc()
	m.batchDuration.Observe(d.Seconds())
}

func (m *Metrics) deleted(table string, n int64) {
	if m == nil || n == 0 {
		return
	}
	m.rowsDeleted.WithLabelValues(table).Add(float64(n))
}

func (m *Metrics) setBatchSize(n int) {
	if m != nil {
		m.batchSize.Set(float64(n))
	}
}

func (m *Metrics) observeExpired(found int64, raised int) {
	if m == nil {
		return
	}
	m.expiredProcessing.Set(float64(found))
	m.alertsRaised.Add(float64(raised))
}

func (m *Metrics) observePass(r Report, err error) {
	if m == nil {
		return
	}
	switch {
	case err != nil:
		m.passes.WithLabelValues("error").Inc()
	case r.AlreadyRunning:
		m.passes.WithLabelValues("already_running").Inc()
		return
	case r.BudgetExhausted:
		m.passes.WithLabelValues("budget_exhausted").Inc()
	default:
		m.passes.WithLabelValues("ok").Inc()
	}
	m.passDuration.Observe(r.Duration.Seconds())
	if err == nil {
		m.lastSuccess.Set(float64(r.StartedAt.Add(r.Duration).Unix()))
	}
}
