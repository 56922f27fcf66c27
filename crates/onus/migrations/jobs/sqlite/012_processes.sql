-- The processes sharing the database, as each last said it was there: a runtime writes its row
-- (host, pid, queues and slots, the kinds it handles) at start and every few seconds, and removes
-- it when it stops gracefully; a named pull worker is seen by its claims. Rows not seen for an
-- hour are removed by any runtime. What runs where is read from here and from onus_live's
-- lease owners (a runtime's id is the owner its leases carry).
CREATE TABLE onus_processes (
    id         TEXT    PRIMARY KEY,
    role       TEXT    NOT NULL,
    host       TEXT    NOT NULL,
    pid        INTEGER,
    version    TEXT    NOT NULL,
    detail     TEXT    NOT NULL,
    started_at INTEGER NOT NULL,
    seen_at    INTEGER NOT NULL
);
-- A job's page links to the alert its exhaustion raised.
CREATE INDEX onus_alerts_job ON onus_alerts (job_id);
