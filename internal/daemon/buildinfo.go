package daemon

import (
	"github.com/prometheus/client_golang/prometheus"

	"github.com/ledgerkeeper/ledgerkeeper/internal/version"
)

// RegisterBuildInfo registers ledgerkeeper_build_info, a constant 1 whose
// labels name the running release, so that a dashboard (and an operator
// during a rollback) can tell which version each replica runs.
func RegisterBuildInfo(reg prometheus.Registerer) { registerBuildInfo(reg, version.Get()) }

func registerBuildInfo(reg prometheus.Registerer, info version.Info) {
	g := prometheus.NewGauge(prometheus.GaugeOpts{
		Name: "ledgerkeeper_build_info",
		Help: "1, labelled with the running binary's version, VCS revision and Go version (ledgerkeeper version).",
		ConstLabels: prometheus.Labels{
			"version":    info.Version,
			"revision":   info.Revision,
			"go_version": info.GoVersion,
		},
	})
	g.Set(1)
	reg.MustRegister(g)
}
