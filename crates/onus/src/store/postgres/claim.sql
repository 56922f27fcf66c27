-- Claims up to $6 due jobs of queue $4 whose kind is in $5, for owner $2 at $1, leased until $3.
-- It writes only the jobs' narrow rows in onus_live (see migration 10) and reads the rest of each
-- job from onus_job_rows. Two range scans of onus_live's partial indexes (due available jobs by priority; delayed jobs whose run_at has
-- passed, oldest first), each locking with SKIP LOCKED so concurrent claimers never wait on or
-- take each other's rows, merged by priority. A paused queue (onus_queues.paused_at set) claims nothing.
-- `/*after*/` is where a claim that resumes from this process's cursor adds
-- `AND (queue, priority, run_at, id) > ($4, $7, $8, $9)` (see `Cursors` in mod.rs); the last
-- column returned says which scan found the job (0 available, 1 delayed). The claimed rows are
-- moved by their ids as an array (`= ANY(ARRAY(...))`) and their job rows read one by one
-- (`LATERAL`), so no plan joins two sets on an estimate: onus_live's statistics lag its churn,
-- and plans that trusted them walked the whole table, or one set once per row of the other,
-- for every claim.
--
-- A claimed row is deleted and inserted anew as running, not updated: another claim that meets
-- its stale entry in the index of available jobs then finds a deleted row and passes over it. An
-- updated row it would lock (a locking read in READ COMMITTED locks the newest version before it
-- rechecks the conditions, and keeps the lock when they fail), so the running job's completion
-- waited for that other claim to commit: 23% of the machine idle with four processes. The
-- deletion is counted by onus_live's trigger; the arrival as running by `counted`. The answer is
-- made from the moved rows as they were (`taken` writes exactly those, changed as the answer
-- says), so which scan found a job is its old state, not a search of one list per row. The answer
-- has only what the store kept of each job (`claimed_cols!` in manage.rs): what the claim wrote,
-- the worker knows already.
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
), moved AS (
    DELETE FROM onus_live l
    WHERE l.id = ANY(ARRAY(SELECT id FROM picked))
    RETURNING l.*
), taken AS (
    -- Every column of onus_live, each carried over or set as a claim sets it: a column added to
    -- the table must be added here, or a claim would reset it.
    INSERT INTO onus_live (id, queue, kind, priority, state, run_at, created_at, attempt, attempted_at, lease_key,
                           rate_key, unique_key, lease_wait, lease_owner, lease_expires_at, cancel_requested)
    SELECT id, queue, kind, priority, 'running', run_at, created_at, attempt + 1, $1, lease_key,
           rate_key, unique_key, false, $2, $3, false
    FROM moved
), counted AS (
    INSERT INTO onus_job_deltas (queue, kind, state, n)
    SELECT queue, kind, 'running', count(*) FROM moved GROUP BY queue, kind
)
SELECT j.id, j.kind, j.args, j.priority, m.attempt + 1 AS attempt, j.max_attempts, m.run_at, j.created_at,
    j.errors, j.snoozes, j.unique_key, j.lease_key, j.tags, CASE WHEN m.state = 'available' THEN 0 ELSE 1 END AS src
FROM moved m CROSS JOIN LATERAL (SELECT * FROM onus_job_rows j WHERE j.id = m.id) j
