-- +goose Up
-- The idempotency ledger. Column names and statuses are the data contract
-- (ARCHITECTURE.md): tool servers write these rows, ledgerkeeper repairs them.
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

-- "Processing keys of tool T claimed before X" is an index range scan whose
-- cost depends on the number of processing keys only, never on the table's
-- size. Partial: completed rows (99.9% of the table) are not in it.
CREATE INDEX idempotency_keys_processing_idx
    ON idempotency_keys (tool, claimed_at)
    WHERE status = 'processing';

-- Purge pages by expires_at (keyset). No other index may touch a column the
-- tool side's processing -> completed update changes, or that update stops
-- being HOT.
CREATE INDEX idempotency_keys_expires_at_idx ON idempotency_keys (expires_at);

-- Vacuum follows the purge in small steps instead of one large pass.
ALTER TABLE idempotency_keys SET (
    autovacuum_vacuum_scale_factor = 0.02,
    autovacuum_analyze_scale_factor = 0.02
);

-- The reconciler's bookkeeping, one row per key it has looked at. Kept out of
-- idempotency_keys so the tool side's rows stay narrow, its hot-path update
-- stays HOT, and tool servers that write the ledger with their own SQL never
-- see columns that are not theirs. claimed_at ties the state to one attempt:
-- a re-claimed key (failed_retryable -> processing) starts afresh.
CREATE TABLE reconcile_state (
    key                 varchar(128) PRIMARY KEY,
    tool                varchar(64)  NOT NULL,
    claimed_at          timestamptz  NOT NULL,
    attempts            int          NOT NULL DEFAULT 0,
    next_probe_at       timestamptz  NULL,
    lease_owner         text         NULL,
    lease_expires_at    timestamptz  NULL,
    last_verdict        varchar(16)  NULL,
    last_error          text         NULL,
    last_probe_at       timestamptz  NULL,
    first_not_found_at  timestamptz  NULL,
    updated_at          timestamptz  NOT NULL DEFAULT now()
);

-- Operator holds: a held key is neither probed, resolved nor purged.
CREATE TABLE key_holds (
    key        varchar(128) PRIMARY KEY,
    reason     text         NOT NULL,
    actor      text         NOT NULL,
    created_at timestamptz  NOT NULL DEFAULT now()
);

-- Every decision, by the reconciler or an operator (invariant 6).
CREATE TABLE reconcile_audit (
    id          bigserial    PRIMARY KEY,
    key         varchar(128) NOT NULL,
    tool        varchar(64)  NOT NULL,
    attempt     int          NOT NULL,
    verdict     varchar(16)  NOT NULL,
    action      varchar(32)  NOT NULL,
    evidence    jsonb        NULL,
    error       text         NULL,
    actor       text         NOT NULL,
    created_at  timestamptz  NOT NULL DEFAULT now()
);
CREATE INDEX reconcile_audit_key_idx ON reconcile_audit (key, id);
CREATE INDEX reconcile_audit_created_at_idx ON reconcile_audit (created_at);

-- Per-tool circuit breaker across passes and replicas.
CREATE TABLE tool_breakers (
    tool                 varchar(64) PRIMARY KEY,
    consecutive_failures int         NOT NULL DEFAULT 0,
    opens               int         NOT NULL DEFAULT 0,
    open_until           timestamptz NULL,
    last_error           text        NULL,
    updated_at           timestamptz NOT NULL DEFAULT now()
);

-- Alert outbox (invariant 8): written in the transaction of the decision that
-- raises the alert, delivered by the dispatcher. kind is 'firing' or
-- 'resolved'; key and tool are null for tool-wide alerts.
CREATE TABLE alert_outbox (
    id               bigserial    PRIMARY KEY,
    reason           varchar(32)  NOT NULL,
    kind             varchar(16)  NOT NULL DEFAULT 'firing'
                     CHECK (kind IN ('firing', 'resolved')),
    tool             varchar(64)  NULL,
    key              varchar(128) NULL,
    details          jsonb        NOT NULL DEFAULT '{}',
    created_at       timestamptz  NOT NULL DEFAULT now(),
    status           varchar(16)  NOT NULL DEFAULT 'pending'
                     CHECK (status IN ('pending', 'sent')),
    attempts         int          NOT NULL DEFAULT 0,
    next_attempt_at  timestamptz  NOT NULL DEFAULT now(),
    lease_owner      text         NULL,
    lease_expires_at timestamptz  NULL,
    last_error       text         NULL,
    sent_at          timestamptz  NULL
);
CREATE INDEX alert_outbox_pending_idx ON alert_outbox (next_attempt_at) WHERE status = 'pending';
CREATE INDEX alert_outbox_created_at_idx ON alert_outbox (created_at);

-- The last alert per (reason, key): drives renotify_after and resolved notices.
CREATE TABLE alert_state (
    reason           varchar(32)  NOT NULL,
    subject          varchar(200) NOT NULL,
    tool             varchar(64)  NULL,
    key              varchar(128) NULL,
    first_raised_at  timestamptz  NOT NULL DEFAULT now(),
    last_raised_at   timestamptz  NOT NULL DEFAULT now(),
    resolved_at      timestamptz  NULL,
    PRIMARY KEY (reason, subject)
);

-- One row per pass (reconcile, purge, alerts) for `ledgerkeeper status`.
CREATE TABLE ledgerkeeper_runs (
    id          bigserial   PRIMARY KEY,
    kind        varchar(16) NOT NULL,
    actor       text        NOT NULL,
    started_at  timestamptz NOT NULL,
    finished_at timestamptz NOT NULL DEFAULT now(),
    stats       jsonb       NOT NULL DEFAULT '{}',
    error       text        NULL
);
CREATE INDEX ledgerkeeper_runs_kind_idx ON ledgerkeeper_runs (kind, id);

-- +goose Down
DROP TABLE ledgerkeeper_runs;
DROP TABLE alert_state;
DROP TABLE alert_outbox;
DROP TABLE tool_breakers;
DROP TABLE reconcile_audit;
DROP TABLE key_holds;
DROP TABLE reconcile_state;
DROP TABLE idempotency_keys;
