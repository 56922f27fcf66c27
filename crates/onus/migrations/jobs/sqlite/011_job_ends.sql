-- The table of completed jobs' ends that PostgreSQL's completion batch appends to instead of
-- updating the job's row (see the PostgreSQL migration of the same number). SQLite's completions
-- update the job's row (it keeps no dead row versions to vacuum), so here it stays empty; the
-- view and the flows that read it are the same on both.
--
-- onus_jobs reads a job's state, attempt, run_at, attempted_at, end and cancel request from its
-- narrow row while it is unfinished, from its end once it completed this way, and from its row
-- otherwise.

CREATE TABLE onus_job_ends (
    id               INTEGER PRIMARY KEY,
    attempt          INTEGER NOT NULL,
    attempted_at     INTEGER,
    run_at           INTEGER NOT NULL,
    finalized_at     INTEGER NOT NULL,
    cancel_requested INTEGER NOT NULL
);

DROP VIEW onus_jobs;
CREATE VIEW onus_jobs AS
SELECT j.id, j.kind, j.queue, j.args, j.priority,
       CASE WHEN l.id IS NOT NULL THEN l.state WHEN e.id IS NOT NULL THEN 'completed' ELSE j.state END AS state,
       CASE WHEN l.id IS NOT NULL THEN l.attempt WHEN e.id IS NOT NULL THEN e.attempt ELSE j.attempt END AS attempt,
       j.max_attempts,
       CASE WHEN l.id IS NOT NULL THEN l.run_at WHEN e.id IS NOT NULL THEN e.run_at ELSE j.run_at END AS run_at,
       j.created_at,
       CASE WHEN l.id IS NOT NULL THEN l.attempted_at WHEN e.id IS NOT NULL THEN e.attempted_at
            ELSE j.attempted_at END AS attempted_at,
       CASE WHEN e.id IS NOT NULL THEN e.finalized_at ELSE j.finalized_at END AS finalized_at,
       j.errors, j.snoozes, j.discard_reason, j.unique_key, j.lease_key,
       CASE WHEN l.id IS NOT NULL THEN l.lease_owner WHEN e.id IS NOT NULL THEN NULL ELSE j.lease_owner END AS lease_owner,
       CASE WHEN l.id IS NOT NULL THEN l.lease_expires_at WHEN e.id IS NOT NULL THEN NULL
            ELSE j.lease_expires_at END AS lease_expires_at,
       CASE WHEN l.id IS NOT NULL THEN l.cancel_requested WHEN e.id IS NOT NULL THEN e.cancel_requested
            ELSE j.cancel_requested END AS cancel_requested,
       CASE WHEN l.id IS NOT NULL THEN l.lease_wait WHEN e.id IS NOT NULL THEN 0 ELSE j.lease_wait END AS lease_wait,
       j.tags, j.progress, j.result, j.rate_key
FROM onus_job_rows j LEFT JOIN onus_live l ON l.id = j.id LEFT JOIN onus_job_ends e ON e.id = j.id;

