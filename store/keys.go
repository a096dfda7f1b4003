package store

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/ledgerkeeper/ledgerkeeper/ledger"
)

// ErrHeld: the key is on hold; only release lifts it. A tool never sees it
// (holds stop the reconciler and resolve, not Claim), so it lives here.
var ErrHeld = errors.New("idempotency key is on hold")

// Beginner starts transactions (a pool or a connection).
type Beginner interface {
	ledger.DBTX
	Begin(ctx context.Context) (pgx.Tx, error)
}

// Pool is the ledger's database as a long-lived service holds it: a
// *pgxpool.Pool, or a pool in a ledger's schema (ledger.InSchema over one,
// every statement qualified). A connection taken out with Acquire is the
// pool's own, unqualified: use it through ledger.SameSchema(pool, conn).
type Pool interface {
	Beginner
	BeginTx(ctx context.Context, opts pgx.TxOptions) (pgx.Tx, error)
	SendBatch(ctx context.Context, b *pgx.Batch) pgx.BatchResults
	Acquire(ctx context.Context) (*pgxpool.Conn, error)
}

// oneKey reads the first row of a statement that selects ledger.KeyColumns
// as a whole ledger.Key, by column name; pgx.ErrNoRows when there is none.
// It takes Query's two results: oneKey(db.Query(ctx, q, args...)).
func oneKey(rows pgx.Rows, err error) (ledger.Key, error) {
	if err != nil {
		return ledger.Key{}, err
	}
	return pgx.CollectOneRow(rows, pgx.RowToStructByName[ledger.Key])
}

// keyColumnsOf is ledger.KeyColumns qualified by a table alias, for
// statements that join idempotency_keys to a table with columns of the same
// names (key, tool, claimed_at, updated_at).
func keyColumnsOf(alias string) string {
	cols := strings.Split(ledger.KeyColumns, ",")
	for i, c := range cols {
		cols[i] = alias + "." + strings.TrimSpace(c)
	}
	return strings.Join(cols, ", ")
}

// wrap turns a pgx error into ours, naming the operation: pgx's ErrNoRows
// becomes ledger.ErrNotFound, as it does in ledger.
func wrap(op string, err error) error {
	if err == nil {
		return nil
	}
	if errors.Is(err, pgx.ErrNoRows) {
		return fmt.Errorf("%s: %w", op, ledger.ErrNotFound)
	}
	return fmt.Errorf("%s: %w", op, err)
}

// validBody checks a body is JSON (jsonb would refuse it with a less useful
// error).
func validBody(what string, b json.RawMessage) error {
	if b != nil && !json.Valid(b) {
		return fmt.Errorf("%w: %s is not valid JSON", ledger.ErrInvalid, what)
	}
	return nil
}

// nullJSON passes a nil body as SQL NULL.
func nullJSON(b json.RawMessage) any {
	if b == nil {
		return nil
	}
	return string(b)
}
