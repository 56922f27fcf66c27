-- The rate key a job takes a use of before each attempt (its kind's configured rate window, built
-- from its args at insert), so a pause of that key finds and holds the job as one of its lease key
-- does.
ALTER TABLE onus_jobs ADD COLUMN IF NOT EXISTS rate_key text;
CREATE INDEX IF NOT EXISTS onus_jobs_rate_keyed_waiting ON onus_jobs (rate_key)
    WHERE rate_key IS NOT NULL AND state IN ('available', 'scheduled', 'retryable', 'snoozed');
