package alerts_test

import (
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/ledgerkeeper/ledgerkeeper/alerts"
)

// The dashboard's "messages sent" panels query these before anything was
// ever sent: every reason and kind exists at zero from the start.
func TestSentSeriesStartAtZero(t *testing.T) {
	t.Parallel()
	reg := prometheus.NewRegistry()
	alerts.NewMetrics(reg)
	want := 2 * len(alerts.Reasons)
	if n := testutil.CollectAndCount(reg, "ledgerkeeper_alerts_sent_messages_total"); n != want {
		t.Fatalf("%d sent_messages series at start, want %d", n, want)
	}
	if n := testutil.CollectAndCount(reg, "ledgerkeeper_alerts_sent_alerts_total"); n != want {
		t.Fatalf("%d sent_alerts series at start, want %d", n, want)
	}
}
