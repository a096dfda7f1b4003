-- +goose Up
-- A downstream's Retry-After is an answer to every replica, not only to the
-- one that asked: the pause's end is kept here, on the tool's breaker row,
-- so that each replica's pass honours it before probing, and the console
-- shows it whichever replica answers. Nothing is counted by it.
ALTER TABLE tool_breakers ADD COLUMN probe_paused_until timestamptz NULL;

-- +goose Down
ALTER TABLE tool_breakers DROP COLUMN probe_paused_until;
