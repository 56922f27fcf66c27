-- A completion appends the job's end instead of updating its row (docs/benchmarks.md, "Fourth
-- round": an end log). The completion batch writes one row here per job it completes; the job's
-- row keeps what it had (as inserted, or as its last failed attempt left it), so the job row is
-- written once in a job's life that succeeds: no second version of it waits for a vacuum, and the
-- completion writes a small row in place of a wide one. A completion of another kind (with a
-- result, of a periodic job, by the rescuer) and every other ending still update the job's row.
-- A completed job never runs again (a manual retry takes only discarded and cancelled jobs), so
-- its end is never undone: it goes with its job (a delete, retention).
--
-- onus_jobs reads a job's state, attempt, run_at, attempted_at, end and cancel request from its
-- narrow row while it is unfinished, from its end once it completed this way, and from its row
-- otherwise.

CREATE TABLE onus_job_ends (
    id               bigint      PRIMARY KEY,
    attempt          integer     NOT NULL,
    attempted_at     timestamptz,
    run_at           timestamptz NOT NULL,
    finalized_at     timestamptz NOT NULL,
    cancel_requested boolean     NOT NULL
);

CREATE OR REPLACE VIEW onus_jobs AS
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
       CASE WHEN l.id IS NOT NULL THEN l.lease_wait WHEN e.id IS NOT NULL THEN false ELSE j.lease_wait END AS lease_wait,
       j.tags, j.progress, j.result, j.rate_key
FROM onus_job_rows j LEFT JOIN onus_live l ON l.id = j.id LEFT JOIN onus_job_ends e ON e.id = j.id;

ALTER TABLE onus_job_ends SET (autovacuum_vacuum_scale_factor = 0.05, autovacuum_analyze_scale_factor = 0.05);
