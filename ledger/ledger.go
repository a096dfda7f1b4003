package ledger

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
)

// Statuses of a key (the CHECK constraint's values).
const (
	StatusProcessing      = "processing"
	StatusCompleted       = "completed"
	StatusFailedRetryable = "failed_retryable"
)

// MaxKeyLength and MaxToolLength are the column widths.
const (
	MaxKeyLength  = 128
	MaxToolLength = 64
)

// Sentinel errors: pgx errors never leave this package unwrapped.
var (
	// ErrNotFound: no row for the key.
	ErrNotFound = errors.New("idempotency key not found")
	// ErrConflict: a compare-and-set found the row in another state than
	// the one it was read in (another attempt or the reconciler got there
	// first).
	ErrConflict = errors.New("idempotency key changed concurrently")
	// ErrInvalid: the arguments break the data contract (key too long...).
	ErrInvalid = errors.New("invalid idempotency key data")
)

// DBTX is what every function here runs on: a *pgxpool.Pool, a pgx.Tx or a
// *pgx.Conn.
type DBTX interface {
	Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error)
	Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error)
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
}

// Key is one row of idempotency_keys, read by column name: each field's db
// tag names its column (pgx.RowToStructByName).
type Key struct {
	Key          string          `json:"key" db:"key"`
	Tool         string          `json:"tool" db:"tool"`
	RequestHash  string          `json:"request_hash" db:"request_hash"`
	RequestBody  json.RawMessage `json:"request_body,omitempty" db:"request_body"`
	Status       string          `json:"status" db:"status"`
	ResponseCode *int            `json:"response_code,omitempty" db:"response_code"`
	ResponseBody json.RawMessage `json:"response_body,omitempty" db:"response_body"`
	CreatedAt    time.Time       `json:"created_at" db:"created_at"`
	ClaimedAt    time.Time       `json:"claimed_at" db:"claimed_at"`
	UpdatedAt    time.Time       `json:"updated_at" db:"updated_at"`
	ExpiresAt    time.Time       `json:"expires_at" db:"expires_at"`
	HeartbeatAt  *time.Time      `json:"heartbeat_at,omitempty" db:"heartbeat_at"`
}

// KeyColumns is the select list of a whole Key: the columns of its db tags.
// It exists once so that every statement reading a whole key, here and in
// the reconciler's store, reads the same row; pair it with
// pgx.RowToStructByName[Key], which refuses a column without a field and a
// field without a column.
const KeyColumns = `key, tool, request_hash, request_body, status, response_code, response_body,
	created_at, claimed_at, updated_at, expires_at, heartbeat_at`

// wrap turns a pgx error into ours, naming the operation.
func wrap(op string, err error) error {
	if err == nil {
		return nil
	}
	if errors.Is(err, pgx.ErrNoRows) {
		return fmt.Errorf("%s: %w", op, ErrNotFound)
	}
	return fmt.Errorf("%s: %w", op, err)
}

// Get reads one key.
func Get(ctx context.Context, db DBTX, key string) (Key, error) {
	const q = `SELECT ` + KeyColumns + ` FROM idempotency_keys WHERE key = $1`
	rows, err := db.Query(ctx, q, key)
	if err != nil {
		return Key{}, wrap("get key", err)
	}
	k, err := pgx.CollectOneRow(rows, pgx.RowToStructByName[Key])
	return k, wrap("get key", err)
}

func validKey(key, tool string) error {
	switch {
	case key == "":
		return fmt.Errorf("%w: empty key", ErrInvalid)
	case len(key) > MaxKeyLength:
		return fmt.Errorf("%w: key is %d bytes, at most %d", ErrInvalid, len(key), MaxKeyLength)
	case tool == "":
		return fmt.Errorf("%w: empty tool", ErrInvalid)
	case len(tool) > MaxToolLength:
		return fmt.Errorf("%w: tool is %d bytes, at most %d", ErrInvalid, len(tool), MaxToolLength)
	}
	return nil
}

// validBody checks a body is JSON (jsonb would refuse it with a less useful
// error).
func validBody(what string, b json.RawMessage) error {
	if b != nil && !json.Valid(b) {
		return fmt.Errorf("%w: %s is not valid JSON", ErrInvalid, what)
	}
	return nil
}
