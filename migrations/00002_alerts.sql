-- +goose Up
-- Alert delivery bookkeeping (alerts.Dispatcher, alerts.Health).
-- last_error_class tells a Slack outage (retried with back-off) from an
-- error that needs a human (bad token, missing channel): `ledgerkeeper
-- status` shows the difference. last_attempt_at orders errors by recency.
ALTER TABLE alert_outbox
    ADD COLUMN last_error_class varchar(16) NULL
        CONSTRAINT alert_outbox_last_error_class_check
        CHECK (last_error_class IN ('retryable', 'rate_limited', 'permanent')),
    ADD COLUMN last_attempt_at timestamptz NULL;

-- Open alerts by subject: ResolveKey/ResolveTool look a subject up on every
-- resolution, and the reconciler's sweep pages through open key alerts.
-- The primary key (reason, subject) cannot serve a lookup by subject, and
-- resolved rows (most of the table, kept for history) stay out of this one.
CREATE INDEX alert_state_open_idx ON alert_state (subject) WHERE resolved_at IS NULL;

-- +goose Down
DROP INDEX alert_state_open_idx;
ALTER TABLE alert_outbox
    DROP COLUMN last_attempt_at,
    DROP COLUMN last_error_class;
