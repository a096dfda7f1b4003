package console

import "net/http"

// BulkConfig configures bulk actions by filter.
type BulkConfig struct{}

// routesBulk registers the bulk actions' routes.
func (h *Handler) routesBulk(*http.ServeMux) {}
