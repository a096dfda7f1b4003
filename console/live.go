package console

import "net/http"

// LiveConfig configures the overview's auto-refresh and its chart of stuck
// keys over the last 24 hours.
type LiveConfig struct{}

// routesLive registers the live overview's routes.
func (h *Handler) routesLive(*http.ServeMux) {}
