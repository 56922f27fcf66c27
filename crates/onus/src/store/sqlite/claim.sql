-- Claims up to $6 due jobs of queue $4 whose kind is in the JSON array $5, for owner $2 at $1,
-- leased until $3. Two range scans of onus_live's partial indexes (due available jobs by priority;
-- delayed jobs whose run_at has passed, oldest first) merged by priority: never a scan of finished
-- jobs. A paused queue (onus_queues.paused_at set) claims nothing. It writes only the jobs' narrow
-- rows (see migration 10) and returns their ids; the claim reads the jobs after it.
UPDATE onus_live
SET state = 'running', attempt = attempt + 1, attempted_at = $1,
    lease_owner = $2, lease_expires_at = $3, cancel_requested = 0, lease_wait = 0
WHERE NOT EXISTS (SELECT 1 FROM onus_queues WHERE name = $4 AND paused_at IS NOT NULL)
  AND id IN (
    SELECT id FROM (
        SELECT id, priority, run_at FROM (
            SELECT id, priority, run_at FROM onus_live
            WHERE state = 'available' AND queue = $4 AND kind IN (SELECT value FROM json_each($5))
            ORDER BY priority, run_at, id LIMIT $6)
        UNION ALL
        SELECT id, priority, run_at FROM (
            SELECT id, priority, run_at FROM onus_live
            WHERE state IN ('scheduled', 'retryable', 'snoozed') AND queue = $4 AND run_at <= $1
              AND kind IN (SELECT value FROM json_each($5))
            ORDER BY run_at LIMIT $6)
    ) ORDER BY priority, run_at, id LIMIT $6
)
RETURNING id
