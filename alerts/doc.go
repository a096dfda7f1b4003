// Package alerts turns what ledgerkeeper cannot resolve into messages a
// human can act on.
//
// The outbox side (Raise, ResolveKey, ResolveTool) runs inside the
// transaction of the decision that raises the alert, so an alert exists if
// and only if its decision does (invariant 8). alert_state remembers the
// last alert per reason and subject: it drives renotify_after and the
// resolved notices.
package alerts
