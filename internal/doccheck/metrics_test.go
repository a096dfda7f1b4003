package doccheck

import (
	"context"
	"log/slog"
	"maps"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/ledgerkeeper/ledgerkeeper/alerts"
	"github.com/ledgerkeeper/ledgerkeeper/expiry"
	"github.com/ledgerkeeper/ledgerkeeper/internal/daemon"
	"github.com/ledgerkeeper/ledgerkeeper/reconcile"
)

// recorder is a Registerer that keeps every collector registered with it,
// so the test can read their descriptions (a Gather would miss vectors
// that have no series yet).
type recorder struct{ cs []prometheus.Collector }

func (r *recorder) Register(c prometheus.Collector) error   { r.cs = append(r.cs, c); return nil }
func (r *recorder) MustRegister(cs ...prometheus.Collector) { r.cs = append(r.cs, cs...) }
func (r *recorder) Unregister(prometheus.Collector) bool    { return true }

var (
	fqNameRE = regexp.MustCompile(`fqName: "([^"]+)"`)
	varRE    = regexp.MustCompile(`variableLabels: \{([^}]*)\}`)
	constRE  = regexp.MustCompile(`constLabels: \{([^}]*)\}`)
)

// servedMetrics is every ledgerkeeper_* metric `serve` registers (built
// the way cmd/ledgerkeeper's serve builds them), with its label names.
// They are registered as a serve with a ledgers section registers them
// (serve_fleet.go): a ledger's series with the label ledger, the database
// series with database. A single-ledger serve exports the same series
// without those two labels, so a selector valid here is valid there.
func servedMetrics(t *testing.T) map[string][]string {
	t.Helper()
	rec := &recorder{}
	daemon.RegisterBuildInfo(rec)
	ledger := prometheus.WrapRegistererWith(prometheus.Labels{"ledger": "doc"}, rec)
	reconcile.NewMetrics(ledger)
	expiry.NewMetrics(ledger)
	alerts.NewMetrics(ledger)
	daemon.NewLedgerMetrics(ledger)
	daemon.NewDatabaseHealth(prometheus.WrapRegistererWith(prometheus.Labels{"database": "db:5432/doc"}, rec), slog.New(slog.DiscardHandler))
	jobs := prometheus.NewRegistry() // daemon.New wants a *Registry
	noop := func(context.Context) error { return nil }
	if _, err := daemon.New(daemon.Config{Registry: jobs, Jobs: []daemon.Job{{Name: "observe", Spec: "@every 1m", Ledger: "doc", Run: noop}}}); err != nil {
		t.Fatal(err)
	}
	rec.MustRegister(jobs)
	out := map[string][]string{}
	for _, c := range rec.cs {
		ch := make(chan *prometheus.Desc, 64)
		go func() { c.Describe(ch); close(ch) }()
		for d := range ch {
			s := d.String()
			m := fqNameRE.FindStringSubmatch(s)
			if m == nil {
				t.Fatalf("cannot read a metric name from %s", s)
			}
			var labels []string
			for _, re := range []*regexp.Regexp{varRE, constRE} {
				if lm := re.FindStringSubmatch(s); lm != nil {
					for _, l := range strings.Split(lm[1], ",") {
						l = strings.TrimSpace(l)
						if i := strings.IndexAny(l, "=:"); i >= 0 {
							l = l[:i]
						}
						if l = strings.Trim(l, `"`); l != "" {
							labels = append(labels, l)
						}
					}
				}
			}
			out[m[1]] = labels
		}
	}
	if len(out) < 20 {
		t.Fatalf("only %d metrics registered: %v", len(out), slices.Sorted(maps.Keys(out)))
	}
	return out
}

// scrapeLabels are added by Prometheus and Kubernetes service discovery,
// not by ledgerkeeper.
var scrapeLabels = map[string]bool{"job": true, "instance": true, "namespace": true, "pod": true,
	"container": true, "endpoint": true, "service": true, "le": true, "__name__": true}

func read(t *testing.T, rel string) string {
	t.Helper()
	b, err := os.ReadFile(filepath.Join("..", "..", rel))
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

var (
	// A metric name, with an optional selector; a name followed by * or
	// {name} is a family the text talks about, not one metric.
	metricRE   = regexp.MustCompile(`ledgerkeeper_[a-z0-9_]*[a-z0-9](\{[^}]*\})?`)
	matcherRE  = regexp.MustCompile(`([a-zA-Z_][a-zA-Z0-9_]*)\s*(=~|!~|!=|=)`)
	notMetrics = map[string]bool{"ledgerkeeper_runs": true, "ledgerkeeper_citus_layout": true, "ledgerkeeper_schema_migrations": true} // tables
)

// lookup finds a name as registered, or as a histogram's or summary's
// _bucket/_sum/_count series.
func lookup(served map[string][]string, name string) ([]string, bool) {
	if l, ok := served[name]; ok {
		return l, true
	}
	for _, suf := range []string{"_bucket", "_sum", "_count"} {
		if base, ok := strings.CutSuffix(name, suf); ok {
			if l, ok := served[base]; ok {
				return append(l, "le"), true
			}
		}
	}
	return nil, false
}

// Every ledgerkeeper_* metric the alert rules, their tests, the dashboard
// and the docs name exists in what serve registers, and every label they
// select it by is one of its labels (issue 10 item 15).
func TestDocumentedMetricsExist(t *testing.T) {
	served := servedMetrics(t)
	for _, rel := range []string{
		"deploy/prometheus/alerts.yaml", "deploy/prometheus/alerts_test.yaml", "deploy/grafana/ledgerkeeper.json",
		"README.md", "runbook.md", "deploy/README.md", "ARCHITECTURE.md",
	} {
		text := read(t, rel)
		for _, loc := range metricRE.FindAllStringSubmatchIndex(text, -1) {
			name := text[loc[0]:loc[1]]
			if loc[2] >= 0 {
				name = text[loc[0]:loc[2]]
			}
			if rest := text[loc[1]:]; strings.HasPrefix(rest, "*") || strings.HasPrefix(text[loc[0]:], name+"_*") || notMetrics[name] {
				continue
			}
			if strings.HasSuffix(text[:loc[0]], ":") || strings.HasSuffix(text[:loc[0]], "ledgerkeeper") {
				continue // a recording rule's name (ledgerkeeper:…)
			}
			labels, ok := lookup(served, name)
			if !ok {
				t.Errorf("%s names %s, which serve does not export", rel, name)
				continue
			}
			if loc[2] < 0 {
				continue
			}
			sel := text[loc[2]:loc[3]]
			for _, m := range matcherRE.FindAllStringSubmatch(sel, -1) {
				if l := m[1]; !scrapeLabels[l] && !slices.Contains(labels, l) {
					t.Errorf("%s selects %s by label %q; its labels are %v", rel, name, l, labels)
				}
			}
		}
	}
}
