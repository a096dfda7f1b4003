-- +goose NO TRANSACTION
-- +goose Up
-- `ledgerkeeper status` counts failed_retryable keys per tool exactly (an
-- operator acts on them) without scanning the ledger: this partial index
-- holds only failed_retryable rows, a small population, so the count is a
-- scan of it alone, whatever the table's size. Its cost on the tool side:
-- a claim (processing) and the processing -> completed update (already
-- non-HOT because of idempotency_keys_processing_idx) only evaluate its
-- predicate, false for both, and add no entry; a heartbeat changes no
-- column it reads, so it stays HOT. Only a key marked failed_retryable
-- (by the reconciler or Abandon) adds an entry. CONCURRENTLY: a large
-- ledger keeps taking writes while it builds.
CREATE INDEX CONCURRENTLY IF NOT EXISTS idempotency_keys_failed_retryable_idx
    ON idempotency_keys (tool)
    WHERE status = 'failed_retryable';

-- +goose Down
DROP INDEX CONCURRENTLY IF EXISTS idempotency_keys_failed_retryable_idx;
