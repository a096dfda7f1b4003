-- +goose Up
-- Probe self-checks (reconcile.SelfCheck): the last check of each tool's
-- probe against the ledger's own ground truth, shared by every replica. A
-- pass trusts a tool's verdicts only while its latest check here is
-- 'trusted', was made with the same probe configuration (fingerprint) and
-- is younger than self_check.interval.
CREATE TABLE probe_self_checks (
    tool                varchar(64)  PRIMARY KEY,
    outcome             varchar(16)  NOT NULL
                        CONSTRAINT probe_self_checks_outcome_check
                        CHECK (outcome IN ('trusted', 'untrusted', 'inconclusive')),
    fingerprint         text         NOT NULL,
    samples             int          NOT NULL,
    present_failed      int          NOT NULL,
    absent_verdict      varchar(16)  NOT NULL,
    -- disagreements: samples that came back other than found (or found
    -- with other values) while the probe was still trusted, since the
    -- row was created: one record deleted or changed downstream.
    disagreements       bigint       NOT NULL DEFAULT 0,
    summary             text         NOT NULL,
    evidence            jsonb        NOT NULL,
    actor               text         NOT NULL,
    checked_at          timestamptz  NOT NULL DEFAULT now()
);

-- The breaker's half-open trial: after the cooldown, the first replica to
-- set trial_until sends the one probe that decides whether the breaker
-- closes; the others wait for it (or for trial_until to pass, if it died).
ALTER TABLE tool_breakers ADD COLUMN trial_until timestamptz NULL;

-- +goose Down
ALTER TABLE tool_breakers DROP COLUMN trial_until;
DROP TABLE probe_self_checks;
