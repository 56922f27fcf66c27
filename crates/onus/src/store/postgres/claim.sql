-- Claims up to $6 due jobs of queue $4 whose kind is in $5, for owner $2 at $1, leased until $3.
-- It writes only the jobs' narrow rows in onus_live (see migration 10) and reads the rest of each
-- job from onus_job_rows. Two range scans of onus_live's partial indexes (due available jobs by priority; delayed jobs whose run_at has
-- passed, oldest first), each locking with SKIP LOCKED so concurrent claimers never wait on or
-- take each other's rows, merged by priority. A paused queue (onus_queues.paused_at set) claims nothing.
-- `/*after*/` is where a claim that resumes from this process's cursor adds
-- `AND (queue, priority, run_at, id) > ($4, $7, $8, $9)` (see `Cursors` in mod.rs); the last
-- column returned says which scan found the job (0 available, 1 delayed). The claimed rows are
-- written by their ids as an array (`= ANY(ARRAY(...))`) and their job rows read one by one
-- (`LATERAL`), so no plan joins two sets on an estimate: onus_live's statistics lag its churn,
-- and plans that trusted them walked the whole table, or one set once per row of the other,
-- for every claim.
WITH available AS (
    SELECT id, priority, run_at, 0 AS src FROM onus_live
    WHERE state = 'available' AND queue = $4 AND kind = ANY($5) /*after*/
      AND NOT EXISTS (SELECT 1 FROM onus_queues WHERE name = $4 AND paused_at IS NOT NULL)
    ORDER BY priority, run_at, id
    LIMIT $6
    FOR UPDATE SKIP LOCKED
), delayed AS (
    SELECT id, priority, run_at, 1 AS src FROM onus_live
    WHERE state IN ('scheduled', 'retryable', 'snoozed') AND queue = $4 AND run_at <= $1 AND kind = ANY($5)
      AND NOT EXISTS (SELECT 1 FROM onus_queues WHERE name = $4 AND paused_at IS NOT NULL)
    ORDER BY run_at
    LIMIT $6
    FOR UPDATE SKIP LOCKED
), picked AS (
    SELECT id, src FROM (SELECT * FROM available UNION ALL SELECT * FROM delayed) due
    ORDER BY priority, run_at, id
    LIMIT $6
), taken AS (
    UPDATE onus_live l
    SET state = 'running', attempt = l.attempt + 1, attempted_at = $1,
        lease_owner = $2, lease_expires_at = $3, cancel_requested = false, lease_wait = false
    WHERE l.id = ANY(ARRAY(SELECT id FROM picked))
    RETURNING l.id, l.state, l.attempt, l.run_at, l.attempted_at, l.lease_owner, l.lease_expires_at,
        CASE WHEN l.id = ANY(ARRAY(SELECT id FROM available)) THEN 0 ELSE 1 END AS src
)
SELECT j.id, j.kind, j.queue, j.args, j.priority, t.state, t.attempt, j.max_attempts, t.run_at, j.created_at,
    t.attempted_at, j.finalized_at, j.errors, j.snoozes, j.discard_reason, j.unique_key, j.lease_key,
    t.lease_owner, t.lease_expires_at, false AS cancel_requested, j.tags, t.src
FROM taken t CROSS JOIN LATERAL (SELECT * FROM onus_job_rows j WHERE j.id = t.id) j
