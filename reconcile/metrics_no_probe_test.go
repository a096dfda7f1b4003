package reconcile

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/ledgerkeeper/ledgerkeeper/internal/pgtest"
	"github.com/ledgerkeeper/ledgerkeeper/ledger"
)

// probeCount is the number of observations in a tool's probe-duration
// histogram, read from the registry as a scrape would.
func probeCount(t *testing.T, reg *prometheus.Registry, tool string) uint64 {
	t.Helper()
	families, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range families {
		if f.GetName() != "ledgerkeeper_reconcile_probe_duration_seconds" {
			continue
		}
		for _, m := range f.GetMetric() {
			for _, l := range m.GetLabel() {
				if l.GetName() == "tool" && l.GetValue() == tool {
					return m.GetHistogram().GetSampleCount()
				}
			}
		}
	}
	return 0
}

// A no_probe decision is not a probe: it moves decisions_total and neither
// probes_total nor the probe-duration histogram, while a probe that ran
// moves both.
func TestNoProbeIsNotAProbeMetric(t *testing.T) {
	t.Parallel()
	reg := prometheus.NewRegistry()
	m := NewMetrics(reg)
	m.initTool("mystery_tool")
	m.initTool("create_ticket")

	// What the engine records for a key of a tool without a probe.
	m.observeDecision("mystery_tool", ActionNoProbe)
	// And for a probe that ran and failed.
	m.observeProbe("create_ticket", "unknown", 20*time.Millisecond)
	m.observeDecision("create_ticket", ActionBackoff)

	for _, c := range []struct {
		name      string
		got, want float64
	}{
		{"mystery_tool probes unknown", testutil.ToFloat64(m.probes.WithLabelValues("mystery_tool", "unknown")), 0},
		{"mystery_tool no_probe decisions", testutil.ToFloat64(m.decisions.WithLabelValues("mystery_tool", ActionNoProbe)), 1},
		{"create_ticket probes unknown", testutil.ToFloat64(m.probes.WithLabelValues("create_ticket", "unknown")), 1},
		{"create_ticket no_probe decisions", testutil.ToFloat64(m.decisions.WithLabelValues("create_ticket", ActionNoProbe)), 0},
	} {
		if c.got != c.want {
			t.Errorf("%s = %v, want %v", c.name, c.got, c.want)
		}
	}
	if n := probeCount(t, reg, "mystery_tool"); n != 0 {
		t.Errorf("mystery_tool probe durations observed = %d, want 0", n)
	}
	if n := probeCount(t, reg, "create_ticket"); n != 1 {
		t.Errorf("create_ticket probe durations observed = %d, want 1", n)
	}
}

// The no_probe series exists at zero from the start, so that increase()
// sees a tool's first no_probe decision.
func TestNoProbeDecisionSeriesStartsAtZero(t *testing.T) {
	t.Parallel()
	reg := prometheus.NewRegistry()
	m := NewMetrics(reg)
	m.initTool("mystery_tool")
	const want = `
# HELP ledgerkeeper_reconcile_decisions_total Reconcile decisions recorded, by tool and action.
# TYPE ledgerkeeper_reconcile_decisions_total counter
ledgerkeeper_reconcile_decisions_total{action="backoff",tool="mystery_tool"} 0
ledgerkeeper_reconcile_decisions_total{action="completed",tool="mystery_tool"} 0
ledgerkeeper_reconcile_decisions_total{action="duplicate_alerted",tool="mystery_tool"} 0
ledgerkeeper_reconcile_decisions_total{action="marked_retryable",tool="mystery_tool"} 0
ledgerkeeper_reconcile_decisions_total{action="no_probe",tool="mystery_tool"} 0
ledgerkeeper_reconcile_decisions_total{action="withheld_unwitnessed",tool="mystery_tool"} 0
ledgerkeeper_reconcile_decisions_total{action="withheld_untrusted",tool="mystery_tool"} 0
`
	if err := testutil.GatherAndCompare(reg, strings.NewReader(want), "ledgerkeeper_reconcile_decisions_total"); err != nil {
		t.Fatal(err)
	}
}

// End to end: a pass over a stuck key of a tool without a probe records a
// no_probe decision and leaves every probe series of that tool at zero.
func TestNoProbePassLeavesProbeMetricsAlone(t *testing.T) {
	t.Parallel()
	db := pgtest.New(t)
	db.Exec(t, `INSERT INTO idempotency_keys (key, tool, request_hash, request_body, created_at, claimed_at, expires_at)
		VALUES ('noprobe', 'mystery_tool', 'h', '{}', now() - interval '1 minute', now() - interval '1 minute', now() + interval '1 day')`)
	reg := prometheus.NewRegistry()
	m := NewMetrics(reg)
	e := New(Config{
		Actor:       "test-replica",
		Tools:       map[string]Policy{"mystery_tool": {ProcessingWindow: 10 * time.Second}},
		BackoffBase: time.Hour,
	}, db.Pool, nil, m)
	rep, err := e.Run(context.Background(), Options{})
	if err != nil {
		t.Fatalf("pass: %v", err)
	}
	if rep.Actions[ActionNoProbe] != 1 {
		t.Fatalf("pass actions = %v, want one no_probe", rep.Actions)
	}
	k, err := ledger.Get(context.Background(), db.Pool, "noprobe")
	if err != nil || k.Status != ledger.StatusProcessing {
		t.Fatalf("key without a probe: %+v, %v (must stay processing)", k, err)
	}
	if got := testutil.ToFloat64(m.decisions.WithLabelValues("mystery_tool", ActionNoProbe)); got != 1 {
		t.Errorf("decisions_total{action=no_probe} = %v, want 1", got)
	}
	for _, v := range []string{"found", "not_found", "duplicate", "unknown"} {
		if got := testutil.ToFloat64(m.probes.WithLabelValues("mystery_tool", v)); got != 0 {
			t.Errorf("probes_total{verdict=%q} = %v, want 0: no probe ran", v, got)
		}
	}
	if n := probeCount(t, reg, "mystery_tool"); n != 0 {
		t.Errorf("probe durations observed = %d, want 0: no probe ran", n)
	}
}
