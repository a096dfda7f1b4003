package daemon

import (
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/ledgerkeeper/ledgerkeeper/internal/version"
)

func TestBuildInfoCarriesTheStampedVersion(t *testing.T) {
	reg := prometheus.NewRegistry()
	registerBuildInfo(reg, version.Info{Version: "v1.2.3-4-g0123abc", Revision: "0123abcdef", GoVersion: "go1.26.8"})
	want := `# HELP ledgerkeeper_build_info 1, labelled with the running binary's version, VCS revision and Go version (ledgerkeeper version).
# TYPE ledgerkeeper_build_info gauge
ledgerkeeper_build_info{go_version="go1.26.8",revision="0123abcdef",version="v1.2.3-4-g0123abc"} 1
`
	if err := testutil.GatherAndCompare(reg, strings.NewReader(want), "ledgerkeeper_build_info"); err != nil {
		t.Fatal(err)
	}
}

// RegisterBuildInfo (what serve calls) reports this binary's own build, the
// same the version command prints.
func TestRegisterBuildInfoReportsThisBinary(t *testing.T) {
	reg := prometheus.NewRegistry()
	RegisterBuildInfo(reg)
	info := version.Get()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	if len(mfs) != 1 || mfs[0].GetName() != "ledgerkeeper_build_info" || len(mfs[0].GetMetric()) != 1 {
		t.Fatalf("gathered %v, want one ledgerkeeper_build_info series", mfs)
	}
	m := mfs[0].GetMetric()[0]
	labels := map[string]string{}
	for _, l := range m.GetLabel() {
		labels[l.GetName()] = l.GetValue()
	}
	want := map[string]string{"version": info.Version, "revision": info.Revision, "go_version": info.GoVersion}
	for k, v := range want {
		if labels[k] != v || v == "" {
			t.Errorf("label %s = %q, want %q (non-empty)", k, labels[k], v)
		}
	}
	if got := m.GetGauge().GetValue(); got != 1 {
		t.Errorf("value = %v, want 1", got)
	}
}
