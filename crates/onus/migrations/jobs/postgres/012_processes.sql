-- The processes sharing the database, as each last said it was there: a runtime writes its row
-- (host, pid, queues and slots, the kinds it handles) at start and every few seconds, and removes
-- it when it stops gracefully; a named pull worker is seen by its claims. Rows not seen for an
-- hour are removed by any runtime. What runs where is read from here and from onus_live's
-- lease owners (a runtime's id is the owner its leases carry).
CREATE TABLE onus_processes (
    id         text        PRIMARY KEY,
    role       text        NOT NULL,
    host       text        NOT NULL,
    pid        bigint,
    version    text        NOT NULL,
    detail     jsonb       NOT NULL,
    started_at timestamptz NOT NULL,
    seen_at    timestamptz NOT NULL
);
-- A job's page links to the alert its exhaustion raised.
CREATE INDEX onus_alerts_job ON onus_alerts (job_id);
