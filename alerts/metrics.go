package alerts

import (
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promauto"
)

// Metrics are the dispatcher's Prometheus series. A nil *Metrics records
// nothing, so tests and the CLI need no registry.
type Metrics struct {
	sentMessages *prometheus.CounterVec
	sentAlerts   *prometheus.CounterVec
	failures     *prometheus.CounterVec
	pendingNow   prometheus.Gauge
	oldestAge    prometheus.Gauge
	permanentNow prometheus.Gauge
	nextAttempt  prometheus.Gauge
}

// NewMetrics registers the series with reg (nil: not registered). It
// panics if they are already registered, like promauto.
func NewMetrics(reg prometheus.Registerer) *Metrics {
	f := promauto.With(reg)
	m := &Metrics{
		sentMessages: f.NewCounterVec(prometheus.CounterOpts{
			Name: "ledgerkeeper_alerts_sent_messages_total",
			Help: "Slack messages delivered, by alert reason and kind (firing, resolved).",
		}, []string{"reason", "kind"}),
		sentAlerts: f.NewCounterVec(prometheus.CounterOpts{
			Name: "ledgerkeeper_alerts_sent_alerts_total",
			Help: "Alerts (outbox rows) delivered inside those messages, by reason and kind.",
		}, []string{"reason", "kind"}),
		failures: f.NewCounterVec(prometheus.CounterOpts{
			Name: "ledgerkeeper_alerts_delivery_failures_total",
			Help: "Messages Slack did not take, by class: retryable, rate_limited, permanent (needs a human).",
		}, []string{"class"}),
		pendingNow: f.NewGauge(prometheus.GaugeOpts{
			Name: "ledgerkeeper_alerts_pending",
			Help: "Alerts waiting in the outbox, as of the last dispatcher pass.",
		}),
		oldestAge: f.NewGauge(prometheus.GaugeOpts{
			Name: "ledgerkeeper_alerts_oldest_pending_age_seconds",
			Help: "Age of the oldest undelivered alert, as of the last dispatcher pass (0: none).",
		}),
		permanentNow: f.NewGauge(prometheus.GaugeOpts{
			Name: "ledgerkeeper_alerts_pending_permanent_failure",
			Help: "Pending alerts whose last delivery failed permanently (bad token, channel, webhook).",
		}),
		nextAttempt: f.NewGauge(prometheus.GaugeOpts{
			Name: "ledgerkeeper_alerts_next_attempt_timestamp_seconds",
			Help: "When the earliest pending alert is next tried (Unix seconds), as of the last dispatcher pass (0: none pending). After a permanent failure: 1m, 2m, 4m, 8m, then every 15m by default; after a 429: its Retry-After.",
		}),
	}
	// Known label values exist from the start, so rate() and absent()
	// rules work before the first failure.
	for _, c := range []FailureClass{ClassRetryable, ClassRateLimited, ClassPermanent} {
		m.failures.WithLabelValues(string(c))
	}
	for _, r := range Reasons {
		for _, k := range []Kind{KindFiring, KindResolved} {
			m.sentMessages.WithLabelValues(string(r), string(k))
			m.sentAlerts.WithLabelValues(string(r), string(k))
		}
	}
	return m
}

func (m *Metrics) sent(k Kind, r Reason, alerts int) {
	if m == nil {
		return
	}
	m.sentMessages.WithLabelValues(string(r), string(k)).Inc()
	m.sentAlerts.WithLabelValues(string(r), string(k)).Add(float64(alerts))
}

func (m *Metrics) failed(c FailureClass) {
	if m == nil {
		return
	}
	m.failures.WithLabelValues(string(c)).Inc()
}

func (m *Metrics) pending(h DeliveryHealth) {
	if m == nil {
		return
	}
	m.pendingNow.Set(float64(h.Pending))
	m.oldestAge.Set(h.OldestPendingAge)
	m.permanentNow.Set(float64(h.Permanent))
	next := 0.0
	if h.NextAttemptAt != nil {
		next = float64(h.NextAttemptAt.UnixNano()) / 1e9
	}
	m.nextAttempt.Set(next)
}
