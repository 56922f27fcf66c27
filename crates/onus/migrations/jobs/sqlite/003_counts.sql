-- Counts per (queue, kind, state) and a per-minute history of outcomes, kept by triggers so that
-- the panel, /queues and /metrics never count every job. SQLite has one writer at a time, so the
-- triggers update the counters in place.
CREATE TABLE onus_job_counts (
    queue TEXT    NOT NULL,
    kind  TEXT    NOT NULL,
    state TEXT    NOT NULL,
    n     INTEGER NOT NULL,
    PRIMARY KEY (queue, kind, state)
) WITHOUT ROWID;

-- Jobs that reached completed, retryable or discarded, by the minute (in microseconds) they got there.
CREATE TABLE onus_job_history (
    minute INTEGER NOT NULL,
    kind   TEXT    NOT NULL,
    state  TEXT    NOT NULL,
    n      INTEGER NOT NULL,
    PRIMARY KEY (minute, kind, state)
) WITHOUT ROWID;

CREATE TRIGGER onus_jobs_counted_insert AFTER INSERT ON onus_jobs BEGIN
    INSERT INTO onus_job_counts (queue, kind, state, n) VALUES (new.queue, new.kind, new.state, 1)
        ON CONFLICT (queue, kind, state) DO UPDATE SET n = n + 1;
END;

CREATE TRIGGER onus_jobs_counted_delete AFTER DELETE ON onus_jobs BEGIN
    UPDATE onus_job_counts SET n = n - 1 WHERE queue = old.queue AND kind = old.kind AND state = old.state;
END;

CREATE TRIGGER onus_jobs_counted_update AFTER UPDATE OF state, queue, kind ON onus_jobs
WHEN old.state <> new.state OR old.queue <> new.queue OR old.kind <> new.kind BEGIN
    UPDATE onus_job_counts SET n = n - 1 WHERE queue = old.queue AND kind = old.kind AND state = old.state;
    INSERT INTO onus_job_counts (queue, kind, state, n) VALUES (new.queue, new.kind, new.state, 1)
        ON CONFLICT (queue, kind, state) DO UPDATE SET n = n + 1;
    INSERT INTO onus_job_history (minute, kind, state, n)
        SELECT coalesce(new.finalized_at, new.attempted_at,
                        CAST((julianday('now') - 2440587.5) * 86400000000 AS INTEGER)) / 60000000 * 60000000,
               new.kind, new.state, 1
        WHERE new.state IN ('completed', 'retryable', 'discarded')
        ON CONFLICT (minute, kind, state) DO UPDATE SET n = n + 1;
END;

-- The jobs already there.
INSERT INTO onus_job_counts (queue, kind, state, n)
SELECT queue, kind, state, count(*) FROM onus_jobs WHERE true GROUP BY queue, kind, state;
