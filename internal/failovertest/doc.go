// Package failovertest holds the failover scenarios (its tests only): a
// real `ledgerkeeper serve` process and a tool server behind
// ledger.Middleware, both on a multi-host URL, through a planned
// pg_auto_failover switchover, a kill -9 of the primary, and a role flip
// in which the old primary turns read-only without closing its sockets
// (internal/hatest starts the databases). A package of its own so that its
// CI time shows apart.
package failovertest
