-- The job's row is written twice in its life, not four times with an index entry each
-- (docs/benchmarks.md, "Fourth round").
--
-- - onus_job_rows (the table that was onus_jobs) keeps every job, finished or not. It is written
--   when the job is inserted and when it finishes (and by the few operations that change what it
--   is: a manual retry, progress, a cancel), and its only indexes are on columns no update changes
--   (id, and kind), so those updates are HOT: a new row version on the same page, no index entry,
--   its old version pruned without a vacuum. Its pages are kept half empty for that.
-- - onus_live holds the unfinished jobs' scheduling and lease: one narrow row per job from its
--   insert until it finishes, deleted then. Claims, the rescuer, lease keys and unique keys read
--   it and its indexes; a claim, a renewal, a snooze or a wake-up writes only it. While a job
--   is unfinished its row here says its state, run_at, attempt, attempted_at, lease and cancel
--   request; onus_job_rows has them as of its insert or its last finish.
-- - onus_jobs is a view of both, as every job looks: what reads see is unchanged.
--
-- Counts: statement triggers on onus_live count the moves between unfinished states and out of
-- them; an insert, a job's arrival in a finished state and a finished row's removal are counted
-- by the statement that writes them (the same on SQLite).

DROP TRIGGER IF EXISTS onus_jobs_counted_insert ON onus_jobs;
DROP TRIGGER IF EXISTS onus_jobs_counted_update ON onus_jobs;
DROP TRIGGER IF EXISTS onus_jobs_counted_delete ON onus_jobs;
DROP FUNCTION IF EXISTS onus_jobs_counted_insert();
DROP FUNCTION IF EXISTS onus_jobs_counted_update();
DROP FUNCTION IF EXISTS onus_jobs_counted_delete();

ALTER TABLE onus_jobs RENAME TO onus_job_rows;
ALTER TABLE onus_job_rows RENAME CONSTRAINT onus_jobs_pkey TO onus_job_rows_pkey;
ALTER INDEX onus_jobs_kind RENAME TO onus_job_rows_kind;
ALTER TABLE onus_job_rows SET (fillfactor = 50);
-- Indexes that name a column a claim or a finish changes; onus_live has what they served.
DROP INDEX IF EXISTS onus_jobs_available;
DROP INDEX IF EXISTS onus_jobs_delayed;
DROP INDEX IF EXISTS onus_jobs_expiring;
DROP INDEX IF EXISTS onus_jobs_unique;
DROP INDEX IF EXISTS onus_jobs_lease_waiters;
DROP INDEX IF EXISTS onus_jobs_keyed_waiting;
DROP INDEX IF EXISTS onus_jobs_rate_keyed_waiting;
DROP INDEX IF EXISTS onus_jobs_finalized;
-- Retention finds finished jobs among those created before its cutoff: a block-range index of
-- creation times, which never changes and costs an insert nothing while its range is open.
CREATE INDEX onus_job_rows_created ON onus_job_rows USING brin (created_at);

CREATE TABLE onus_live (
    id               bigint      PRIMARY KEY,
    queue            text        NOT NULL,
    kind             text        NOT NULL,
    priority         smallint    NOT NULL,
    state            text        NOT NULL CHECK (state IN ('available', 'scheduled', 'running', 'retryable', 'snoozed')),
    run_at           timestamptz NOT NULL,
    created_at       timestamptz NOT NULL,
    attempt          integer     NOT NULL,
    attempted_at     timestamptz,
    lease_key        text,
    rate_key         text,
    unique_key       text,
    lease_wait       boolean     NOT NULL DEFAULT false,
    lease_owner      text,
    lease_expires_at timestamptz,
    cancel_requested boolean     NOT NULL DEFAULT false
);
INSERT INTO onus_live (id, queue, kind, priority, state, run_at, created_at, attempt, attempted_at, lease_key,
                       rate_key, unique_key, lease_wait, lease_owner, lease_expires_at, cancel_requested)
SELECT id, queue, kind, priority, state, run_at, created_at, attempt, attempted_at, lease_key,
       rate_key, unique_key, lease_wait, lease_owner, lease_expires_at, cancel_requested
FROM onus_job_rows WHERE state NOT IN ('completed', 'discarded', 'cancelled');

-- Claims read these two, so their cost never grows with finished jobs.
CREATE INDEX onus_live_available ON onus_live (queue, priority, run_at, id) WHERE state = 'available';
CREATE INDEX onus_live_delayed ON onus_live (queue, run_at) WHERE state IN ('scheduled', 'retryable', 'snoozed');
-- The rescuer.
CREATE INDEX onus_live_expiring ON onus_live (lease_expires_at) WHERE state = 'running';
-- Unique keys hold while a job is unfinished, that is while it is here.
CREATE UNIQUE INDEX onus_live_unique ON onus_live (kind, unique_key) WHERE unique_key IS NOT NULL;
-- Jobs asleep behind a busy lease key, woken when a slot frees.
CREATE INDEX onus_live_lease_waiters ON onus_live (lease_key, run_at) WHERE state = 'snoozed' AND lease_wait;
-- A key's pause finds its waiting jobs, a resume its held ones.
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

-- Counts of the unfinished states, from onus_live's changes.
CREATE FUNCTION onus_live_counted_delete() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO onus_job_deltas (queue, kind, state, n)
    SELECT queue, kind, state, -count(*) FROM onus_old GROUP BY queue, kind, state;
    RETURN NULL;
END $$;

-- A job that arrives in `retryable` enters the history at its attempt's minute.
CREATE FUNCTION onus_live_counted_update() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO onus_job_deltas (queue, kind, state, minute, n)
    SELECT queue, kind, state, minute, sum(d) FROM (
        SELECT queue, kind, state, NULL::timestamptz AS minute, -count(*) AS d
        FROM onus_old GROUP BY queue, kind, state
        UNION ALL
        SELECT queue, kind, state,
               CASE WHEN state = 'retryable' THEN date_trunc('minute', coalesce(attempted_at, now())) END,
               count(*)
        FROM onus_new GROUP BY 1, 2, 3, 4
    ) c
    GROUP BY queue, kind, state, minute
    HAVING sum(d) <> 0;
    RETURN NULL;
END $$;

CREATE TRIGGER onus_live_counted_delete AFTER DELETE ON onus_live
    REFERENCING OLD TABLE AS onus_old FOR EACH STATEMENT EXECUTE FUNCTION onus_live_counted_delete();
CREATE TRIGGER onus_live_counted_update AFTER UPDATE ON onus_live
    REFERENCING OLD TABLE AS onus_old NEW TABLE AS onus_new
    FOR EACH STATEMENT EXECUTE FUNCTION onus_live_counted_update();

-- Vacuum settings for tables whose rows come and go with every job (a table's own settings,
-- which apply whatever the server's): autovacuum visits onus_live, the counters' deltas and the
-- lease slots after a fixed number of dead rows rather than a fifth of the table, at full speed
-- (they are small: one narrow row per unfinished job). The job rows' dead versions are mostly
-- pruned without a vacuum (HOT); what is left, and retention's deletions, are vacuumed after a
-- twentieth of the table rather than a fifth.
ALTER TABLE onus_live SET (autovacuum_vacuum_scale_factor = 0, autovacuum_vacuum_threshold = 5000,
                           autovacuum_vacuum_cost_delay = 0, autovacuum_analyze_scale_factor = 0.05);
ALTER TABLE onus_job_deltas SET (autovacuum_vacuum_scale_factor = 0, autovacuum_vacuum_threshold = 2000,
                                 autovacuum_vacuum_cost_delay = 0);
ALTER TABLE onus_leases SET (autovacuum_vacuum_scale_factor = 0, autovacuum_vacuum_threshold = 2000,
                             autovacuum_vacuum_cost_delay = 0);
ALTER TABLE onus_job_rows SET (autovacuum_vacuum_scale_factor = 0.05, autovacuum_analyze_scale_factor = 0.05);
