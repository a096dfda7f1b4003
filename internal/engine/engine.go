// Package engine says which database engine this process's ledger is on:
// PostgreSQL (the default) or a Citus coordinator. Most of ledgerkeeper's
// statements run unchanged on both (ARCHITECTURE.md, "Running on Citus");
// the few that cannot (a row lock across shards: the lease, the decisions'
// locking read) take a Citus shape in package store when Citus() is true.
//
// The choice is per process, made once at start from what the program is
// connected to (Detect), because the store's functions take any
// connection rather than a store value; the test harness (internal/pgtest)
// sets it when it runs the tests against Citus.
package engine

import (
	"context"
	"errors"
	"fmt"
	"sync/atomic"

	"github.com/jackc/pgx/v5"

	"github.com/ledgerkeeper/ledgerkeeper/ledger"
)

// state is unknown (0), PostgreSQL (1) or Citus (2).
var state atomic.Int32

// SetCitus makes this process use the Citus shapes (on) or the PostgreSQL
// ones (off): the store's, and the tool side's claim
// (ledger.UseCitusShapes), which the example tool server and the
// conformance runs share with the daemon in one process.
func SetCitus(on bool) {
	if on {
		state.Store(2)
	} else {
		state.Store(1)
	}
	ledger.UseCitusShapes(on)
}

// Citus reports whether the Citus shapes are in use (false while the
// engine is unknown).
func Citus() bool { return state.Load() == 2 }

// Ensure detects the engine through db when nothing has set it yet: a
// program that uses the store on a pool of its own, without ledgerkeeper's
// connect, still gets the statements its database accepts. The store calls
// it before each statement that has two shapes; after the first answer it
// costs an atomic load. A failed detection leaves the engine unknown
// (PostgreSQL's shapes; the statement's own error follows on Citus).
func Ensure(ctx context.Context, db Querier) {
	if state.Load() != 0 {
		return
	}
	if c, err := Detect(ctx, db); err == nil {
		SetCitus(c)
	}
}

// Querier is what Detect needs of a connection (a pool, a conn, a tx).
type Querier interface {
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
}

// Detect reports whether db's database has the citus extension. On Citus it
// must be the coordinator's: ledgerkeeper keeps its small tables there and
// its purge lock is a session lock on that one node, so a connection to a
// worker is refused with what to do instead.
func Detect(ctx context.Context, db Querier) (bool, error) {
	var ok, coordinator bool
	err := db.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM pg_extension WHERE extname = 'citus')`).Scan(&ok)
	if err != nil {
		return false, fmt.Errorf("look for the citus extension: %w", err)
	}
	if !ok {
		return false, nil
	}
	if err := db.QueryRow(ctx, `SELECT citus_is_coordinator()`).Scan(&coordinator); err != nil {
		return false, fmt.Errorf("ask Citus whether this is its coordinator: %w", err)
	}
	if !coordinator {
		return false, errors.New("this database is a Citus worker's: connect ledgerkeeper to the Citus coordinator (its small tables and the purge lock live there)")
	}
	return true, nil
}
