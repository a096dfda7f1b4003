package reconcile

import "github.com/prometheus/client_golang/prometheus"

// checkMetrics are the self-check's series.
type checkMetrics struct {
	trusted       *prometheus.GaugeVec
	checks        *prometheus.CounterVec
	disagreements *prometheus.CounterVec
}

func newCheckMetrics(reg prometheus.Registerer) *checkMetrics {
	m := &checkMetrics{
		trusted: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "ledgerkeeper_probe_trusted",
			Help: "1 while the tool's probe passes its self-check, 0 while it is untrusted or its check is inconclusive (no key of the tool changes state).",
		}, []string{"tool"}),
		checks: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "ledgerkeeper_probe_self_checks_total",
			Help: "Probe self-checks run by this replica, by tool and outcome (trusted, untrusted, inconclusive).",
		}, []string{"tool", "outcome"}),
		disagreements: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "ledgerkeeper_probe_self_check_disagreements_total",
			Help: "Completed keys that a trusted probe did not find as stored (a record deleted or changed downstream), by tool.",
		}, []string{"tool"}),
	}
	reg.MustRegister(m.trusted, m.checks, m.disagreements)
	return m
}

func (m *checkMetrics) initTool(tool string) {
	for _, o := range []string{CheckTrusted, CheckUntrusted, CheckInconclusive} {
		m.checks.WithLabelValues(tool, o)
	}
	m.disagreements.WithLabelValues(tool)
}

// observeCheck records a self-check.
func (m *Metrics) observeCheck(r CheckResult) {
	if m == nil || m.check == nil {
		return
	}
	v := 0.0
	if r.Trusted() {
		v = 1
	}
	m.check.trusted.WithLabelValues(r.Tool).Set(v)
	m.check.checks.WithLabelValues(r.Tool, r.Outcome).Inc()
	m.check.disagreements.WithLabelValues(r.Tool).Add(float64(r.Disagreements))
}
