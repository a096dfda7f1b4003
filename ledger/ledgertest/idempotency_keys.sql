-- The idempotency ledger's table, as the daemon's migrations create it
-- (migrations/00001_ledger.sql, 00004 and 00006 in the daemon's module): the
-- tool side's one table, for tests of tool servers. A test in the daemon's
-- module (migrations/ledger_schema_test.go) fails on any difference between
-- this file and the migrated table: columns, types, defaults, constraints,
-- indexes and storage parameters.
CREATE TABLE idempotency_keys (
    key           varchar(128) PRIMARY KEY,
    tool          varchar(64)  NOT NULL,
    request_hash  varchar(64)  NOT NULL,
    request_body  jsonb        NULL,
    status        varchar(16)  NOT NULL DEFAULT 'processing'
                  CONSTRAINT idempotency_keys_status_check
                  CHECK (status IN ('processing', 'completed', 'failed_retryable')),
    response_code int          NULL,
    response_body jsonb        NULL,
    created_at    timestamptz  NOT NULL DEFAULT now(),
    claimed_at    timestamptz  NOT NULL DEFAULT now(),
    updated_at    timestamptz  NOT NULL DEFAULT now(),
    expires_at    timestamptz  NOT NULL,
    heartbeat_at  timestamptz  NULL
);

CREATE INDEX idempotency_keys_processing_idx
    ON idempotency_keys (tool, claimed_at)
    WHERE status = 'processing';

CREATE INDEX idempotency_keys_expires_at_idx ON idempotency_keys (expires_at);

CREATE INDEX idempotency_keys_tool_created_idx ON idempotency_keys (tool, created_at);

CREATE INDEX idempotency_keys_failed_retryable_idx
    ON idempotency_keys (tool)
    WHERE status = 'failed_retryable';

ALTER TABLE idempotency_keys SET (
    autovacuum_vacuum_scale_factor = 0.02,
    autovacuum_analyze_scale_factor = 0.02
);
