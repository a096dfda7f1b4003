-- +goose Up
-- Canaries marked by an operator (`ledgerkeeper probe canary add`): effects
-- known to exist downstream (a ticket kept for the purpose, never deleted
-- there), which a tool's probe self-check probes as present-side witnesses
-- when no key was completed recently. request_body is what the probe's
-- templates read: given by the operator, else copied from the key's ledger
-- row when it had one. Operator-maintained: no retention purges these rows,
-- and there is deliberately no foreign key to idempotency_keys, because a
-- canary outlives its key's row (the purge deletes that after it expires).
CREATE TABLE probe_canaries (
    tool          varchar(64)  NOT NULL,
    key           varchar(128) NOT NULL,
    request_body  jsonb        NULL,
    reason        text         NOT NULL,
    actor         text         NOT NULL,
    created_at    timestamptz  NOT NULL DEFAULT now(),
    PRIMARY KEY (tool, key)
);

-- +goose Down
DROP TABLE probe_canaries;
