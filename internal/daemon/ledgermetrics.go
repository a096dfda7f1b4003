package daemon

import (
	"context"
	"log/slog"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/ledgerkeeper/ledgerkeeper/ledger"
	"github.com/ledgerkeeper/ledgerkeeper/reconcile"
	"github.com/ledgerkeeper/ledgerkeeper/store"
)

// LedgerMetrics are gauges of the ledger's state, refreshed by the daemon's
// observe job (not at scrape time: a scrape must never wait on the
// database).
type LedgerMetrics struct {
	stuck       *prometheus.GaugeVec
	inFlight    *prometheus.GaugeVec
	oldestStuck *prometheus.GaugeVec
	p99         *prometheus.GaugeVec
	held        *prometheus.GaugeVec
	oldestHold  *prometheus.GaugeVec
	up          prometheus.Gauge
	breakerOpen *prometheus.GaugeVec

	mu       sync.Mutex
	lastP99  time.Time
	seenTool map[string]bool
	// seenHold: tools that have had a held-keys series, "" (holds on keys
	// no longer in the ledger) included, so that it drops to 0, not away.
	seenHold map[string]bool

	// sampled is the stuck_samples bucket this process last recorded;
	// clock and sampleLog are time.Now and the log of a failed recording
	// (SetSampleLogger).
	sampled   time.Time
	clock     func() time.Time
	sampleLog *slog.Logger
}

// p99Every spaces the processing-time measurement, which reads a bounded
// sample of recent rows (store.ProcessingP99).
const p99Every = 5 * time.Minute

// NewLedgerMetrics registers the gauges with reg.
func NewLedgerMetrics(reg prometheus.Registerer) *LedgerMetrics {
	m := &LedgerMetrics{
		stuck: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "ledgerkeeper_keys_stuck",
			Help: "Processing keys past their tool's window + grace without a fresh heartbeat.",
		}, []string{"tool"}),
		inFlight: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "ledgerkeeper_keys_in_flight",
			Help: "Processing keys inside their window or heartbeating.",
		}, []string{"tool"}),
		oldestStuck: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "ledgerkeeper_keys_oldest_stuck_age_seconds",
			Help: "Age (since claimed_at) of the oldest stuck key; 0 when none.",
		}, []string{"tool"}),
		p99: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "ledgerkeeper_processing_p99_seconds",
			Help: "Observed p99 processing time of keys first claimed in the last hour that the tool side completed (a sample of up to 1,200 per tool).",
		}, []string{"tool"}),
		held: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "ledgerkeeper_keys_held",
			Help: "Keys on hold, by tool (tool=\"\": holds on keys no longer in the ledger).",
		}, []string{"tool"}),
		oldestHold: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "ledgerkeeper_keys_oldest_hold_age_seconds",
			Help: "Age of the tool's oldest hold (since it was put or replaced); 0 when none.",
		}, []string{"tool"}),
		up: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "ledgerkeeper_ledger_up",
			Help: "1 if the last observation of the ledger succeeded.",
		}),
		breakerOpen: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "ledgerkeeper_reconcile_breaker_open",
			Help: "1 while the tool's circuit breaker is open (probing paused), else 0.",
		}, []string{"tool"}),
		seenTool:  map[string]bool{},
		seenHold:  map[string]bool{},
		clock:     time.Now,
		sampleLog: slog.New(slog.DiscardHandler),
	}
	reg.MustRegister(m.stuck, m.inFlight, m.oldestStuck, m.p99, m.held, m.oldestHold, m.up, m.breakerOpen)
	return m
}

// Update refreshes the gauges. Configured tools always have a series (0
// when nothing is stuck), so alert rules see a value, not an absence.
func (m *LedgerMetrics) Update(ctx context.Context, db ledger.DBTX, windows store.Windows, configured []string) error {
	err := m.update(ctx, db, windows, configured)
	if err != nil {
		m.up.Set(0)
	} else {
		m.up.Set(1)
	}
	return err
}

func (m *LedgerMetrics) update(ctx context.Context, db ledger.DBTX, windows store.Windows, configured []string) error {
	stats, err := store.StuckStats(ctx, db, windows)
	if err != nil {
		return err
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	for _, t := range configured {
		m.seenTool[t] = true
	}
	present := map[string]bool{}
	for _, s := range stats {
		present[s.Tool] = true
		m.seenTool[s.Tool] = true
		m.stuck.WithLabelValues(s.Tool).Set(float64(s.Stuck))
		m.inFlight.WithLabelValues(s.Tool).Set(float64(s.InWindow))
		m.oldestStuck.WithLabelValues(s.Tool).Set(s.OldestStuckAgeSeconds)
	}
	for t := range m.seenTool {
		if !present[t] {
			m.stuck.WithLabelValues(t).Set(0)
			m.inFlight.WithLabelValues(t).Set(0)
			m.oldestStuck.WithLabelValues(t).Set(0)
		}
	}
	m.recordSamples(ctx, db, stats)
	holds, err := store.HoldStats(ctx, db)
	if err != nil {
		return err
	}
	for t := range m.seenTool {
		m.seenHold[t] = true
	}
	heldBy := map[string]store.ToolHolds{}
	for _, h := range holds {
		heldBy[h.Tool] = h
		m.seenHold[h.Tool] = true
	}
	for t := range m.seenHold {
		h := heldBy[t] // zero: no hold
		m.held.WithLabelValues(t).Set(float64(h.Held))
		m.oldestHold.WithLabelValues(t).Set(h.OldestAgeSeconds)
	}
	breakers, err := reconcile.Breakers(ctx, db)
	if err != nil {
		return err
	}
	open := map[string]bool{}
	for _, b := range breakers {
		open[b.Tool] = b.Open
		m.seenTool[b.Tool] = true
	}
	for t := range m.seenTool {
		v := 0.0
		if open[t] {
			v = 1
		}
		m.breakerOpen.WithLabelValues(t).Set(v)
	}
	if time.Since(m.lastP99) >= p99Every {
		lat, err := store.ProcessingP99(ctx, db, time.Hour)
		if err != nil {
			return err
		}
		m.p99.Reset() // a tool without completions in the hour has no p99
		for _, l := range lat {
			m.p99.WithLabelValues(l.Tool).Set(l.P99Seconds)
		}
		m.lastP99 = time.Now()
	}
	return nil
}

// SetSampleLogger sets where a failure to record the console's stuck-keys
// samples is logged (the refresh goes on without them).
func (m *LedgerMetrics) SetSampleLogger(l *slog.Logger) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.sampleLog = l
}

// recordSamples writes the console's chart samples (stuck_samples): each
// tool's stuck and in-flight counts, once per store.SampleEvery bucket in
// this process (a failed write is tried again at the next refresh), and
// prunes samples past store.SampleRetention. Every tool seen gets a row, 0
// when it has no processing key. A database error is logged, never the
// refresh's failure: the gauges matter more than the chart. Called with
// m.mu held.
func (m *LedgerMetrics) recordSamples(ctx context.Context, db ledger.DBTX, stats []store.ToolStats) {
	bucket := store.SampleBucket(m.clock())
	if bucket.Equal(m.sampled) {
		return
	}
	counts := map[string]store.ToolStats{}
	for _, s := range stats {
		counts[s.Tool] = s
	}
	samples := make([]store.StuckSample, 0, len(m.seenTool))
	for t := range m.seenTool {
		c := counts[t]
		samples = append(samples, store.StuckSample{Tool: t, At: bucket, Stuck: c.Stuck, InFlight: c.InWindow})
	}
	if err := store.RecordStuckSamples(ctx, db, samples, bucket.Add(-store.SampleRetention)); err != nil {
		m.sampleLog.Warn("recording the console's stuck-keys samples failed (tried again at the next refresh)", "err", err)
		return
	}
	m.sampled = bucket
}
