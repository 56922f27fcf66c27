-- The job's row is written at its insert and when it finishes; an unfinished job's scheduling
-- and lease live in a narrow row of onus_live, which claims, the rescuer, lease keys and unique
-- keys read and write. onus_jobs is a view of both. The same layout as on PostgreSQL (see its
-- migration 10), where it makes the job row's updates HOT.
--
-- Counts: onus_live's triggers count the unfinished states (inserts count themselves, as since
-- migration 5); a job's arrival in a finished state, and a finished row's removal, is counted by
-- the statement that writes it.

DROP TRIGGER IF EXISTS onus_jobs_counted_update;
DROP TRIGGER IF EXISTS onus_jobs_counted_delete;

ALTER TABLE onus_jobs RENAME TO onus_job_rows;
DROP INDEX IF EXISTS onus_jobs_available;
DROP INDEX IF EXISTS onus_jobs_delayed;
DROP INDEX IF EXISTS onus_jobs_expiring;
DROP INDEX IF EXISTS onus_jobs_unique;
DROP INDEX IF EXISTS onus_jobs_lease_waiters;
DROP INDEX IF EXISTS onus_jobs_keyed_waiting;
DROP INDEX IF EXISTS onus_jobs_rate_keyed_waiting;
-- Retention keeps its index by state and end (SQLite has no HOT updates to keep).

CREATE TABLE onus_live (
    id               INTEGER PRIMARY KEY,
    queue            TEXT    NOT NULL,
    kind             TEXT    NOT NULL,
    priority         INTEGER NOT NULL,
    state            TEXT    NOT NULL,
    run_at           INTEGER NOT NULL,
    created_at       INTEGER NOT NULL,
    attempt          INTEGER NOT NULL,
    attempted_at     INTEGER,
    lease_key        TEXT,
    rate_key         TEXT,
    unique_key       TEXT,
    lease_wait       INTEGER NOT NULL DEFAULT 0,
    lease_owner      TEXT,
    lease_expires_at INTEGER,
    cancel_requested INTEGER NOT NULL DEFAULT 0
);
INSERT INTO onus_live (id, queue, kind, priority, state, run_at, created_at, attempt, attempted_at, lease_key,
                       rate_key, unique_key, lease_wait, lease_owner, lease_expires_at, cancel_requested)
SELECT id, queue, kind, priority, state, run_at, created_at, attempt, attempted_at, lease_key,
       rate_key, unique_key, lease_wait, lease_owner, lease_expires_at, cancel_requested
FROM onus_job_rows WHERE state NOT IN ('completed', 'discarded', 'cancelled');

CREATE INDEX onus_live_available ON onus_live (queue, priority, run_at, id) WHERE state = 'available';
CREATE INDEX onus_live_delayed ON onus_live (queue, run_at) WHERE state IN ('scheduled', 'retryable', 'snoozed');
CREATE INDEX onus_live_expiring ON onus_live (lease_expires_at) WHERE state = 'running';
CREATE UNIQUE INDEX onus_live_unique ON onus_live (kind, unique_key) WHERE unique_key IS NOT NULL;
CREATE INDEX onus_live_lease_waiters ON onus_live (lease_key, run_at) WHERE state = 'snoozed' AND lease_wait = 1;
CREATE INDEX onus_live_keyed ON onus_live (lease_key) WHERE lease_key IS NOT NULL AND state IN ('available', 'scheduled', 'retryable', 'snoozed');
CREATE INDEX onus_live_rate_keyed ON onus_live (rate_key) WHERE rate_key IS NOT NULL AND state IN ('available', 'scheduled', 'retryable', 'snoozed');

CREATE VIEW onus_jobs AS
SELECT j.id, j.kind, j.queue, j.args, j.priority,
       CASE WHEN l.id IS NULL THEN j.state ELSE l.state END AS state,
       CASE WHEN l.id IS NULL THEN j.attempt ELSE l.attempt END AS attempt,
       j.max_attempts,
       CASE WHEN l.id IS NULL THEN j.run_at ELSE l.run_at END AS run_at,
       j.created_at,
       CASE WHEN l.id IS NULL THEN j.attempted_at ELSE l.attempted_at END AS attempted_at,
       j.finalized_at, j.errors, j.snoozes, j.discard_reason, j.unique_key, j.lease_key,
       CASE WHEN l.id IS NULL THEN j.lease_owner ELSE l.lease_owner END AS lease_owner,
       CASE WHEN l.id IS NULL THEN j.lease_expires_at ELSE l.lease_expires_at END AS lease_expires_at,
       CASE WHEN l.id IS NULL THEN j.cancel_requested ELSE l.cancel_requested END AS cancel_requested,
       CASE WHEN l.id IS NULL THEN j.lease_wait ELSE l.lease_wait END AS lease_wait,
       j.tags, j.progress, j.result, j.rate_key
FROM onus_job_rows j LEFT JOIN onus_live l ON l.id = j.id;

CREATE TRIGGER onus_live_counted_delete AFTER DELETE ON onus_live BEGIN
    UPDATE onus_job_counts SET n = n - 1 WHERE queue = old.queue AND kind = old.kind AND state = old.state;
END;

CREATE TRIGGER onus_live_counted_update AFTER UPDATE OF state ON onus_live
WHEN old.state <> new.state BEGIN
    UPDATE onus_job_counts SET n = n - 1 WHERE queue = old.queue AND kind = old.kind AND state = old.state;
    INSERT INTO onus_job_counts (queue, kind, state, n) VALUES (new.queue, new.kind, new.state, 1)
        ON CONFLICT (queue, kind, state) DO UPDATE SET n = n + 1;
    INSERT INTO onus_job_history (minute, kind, state, n)
        SELECT coalesce(new.attempted_at,
                        CAST((julianday('now') - 2440587.5) * 86400000000 AS INTEGER)) / 60000000 * 60000000,
               new.kind, new.state, 1
        WHERE new.state = 'retryable'
        ON CONFLICT (minute, kind, state) DO UPDATE SET n = n + 1;
END;
