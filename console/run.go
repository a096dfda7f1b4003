package console

import "net/http"

// RunConfig gives the console what serve runs: the probes (probe now) and
// the reconciler (reconcile this key now). Zero: those buttons are absent.
type RunConfig struct{}

// routesRun registers the self-checks, alerts and runs pages and the probe
// and reconcile actions.
func (h *Handler) routesRun(*http.ServeMux) {}
