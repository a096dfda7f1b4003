-- +goose Up
-- The seen-set of Slack interactions (package interact): one row per
-- delivery identity (a signed request, or a payload's own identity: a
-- click's user + action_ts + action_id, a modal's view id + hash), shared
-- by every replica, so one action is handled once whichever replica or
-- transport it reached, and a replayed request is refused. Rows are
-- short-lived: expired ones are deleted in bounded batches by the claims
-- that follow them.
CREATE TABLE slack_seen (
    id          text         PRIMARY KEY,
    expires_at  timestamptz  NOT NULL
);
CREATE INDEX slack_seen_expires_at_idx ON slack_seen (expires_at);

-- +goose Down
DROP TABLE slack_seen;
