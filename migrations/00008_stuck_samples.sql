-- +goose Up
-- The console's chart of stuck keys over the last 24 hours: one row per
-- tool per 5-minute bucket, written by serve's observe job (an upsert per
-- tool per bucket, whichever replica comes first or last: the counts are
-- the ledger's, the same from any of them) and pruned there past 25 hours.
-- at is the bucket's start, computed by the writer and bound as a
-- parameter. About 288 rows per tool: no index beyond the key.
CREATE TABLE stuck_samples (
    tool       varchar(64)  NOT NULL,
    at         timestamptz  NOT NULL,
    stuck      integer      NOT NULL CHECK (stuck >= 0),
    in_flight  integer      NOT NULL CHECK (in_flight >= 0),
    PRIMARY KEY (tool, at)
);

-- +goose Down
DROP TABLE stuck_samples;
