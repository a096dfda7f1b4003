package store

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"

	"github.com/jackc/pgx/v5"

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

// keyColumns and scanKey read a whole ledger.Key; they repeat ledger's own
// (unexported there, so a tool server's API stays Claim and friends).
// TestScanKeyReadsEveryColumn keeps the two in step with the struct.
const keyColumns = `key, tool, request_hash, request_body, status, response_code, response_body,
	created_at, claimed_at, updated_at, expires_at, heartbeat_at`

func scanKey(row pgx.Row) (ledger.Key, error) {
	var k ledger.Key
	err := row.Scan(&k.Key, &k.Tool, &k.RequestHash, &k.RequestBody, &k.Status, &k.ResponseCode,
		&k.ResponseBody, &k.CreatedAt, &k.ClaimedAt, &k.UpdatedAt, &k.ExpiresAt, &k.HeartbeatAt)
	return k, err
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
