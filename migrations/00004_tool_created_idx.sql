-- +goose NO TRANSACTION
-- +goose Up
-- The self-check samples a tool's newest completed keys: a backward range
-- scan on (tool, created_at) that stops after a few rows, whatever the
-- table's size. Neither column is ever updated (a retry re-claims
-- claimed_at, not created_at), so the tool side's processing -> completed
-- update stays HOT. CONCURRENTLY: a large ledger keeps taking writes while
-- the index builds.
CREATE INDEX CONCURRENTLY IF NOT EXISTS idempotency_keys_tool_created_idx
    ON idempotency_keys (tool, created_at);

-- +goose Down
DROP INDEX CONCURRENTLY IF EXISTS idempotency_keys_tool_created_idx;
