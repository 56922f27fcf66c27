-- Lease renewals and outcomes find running jobs by id (the primary key), so the index of
-- running jobs by owner is never read; dropping it saves an index entry on every claim.
DROP INDEX IF EXISTS onus_jobs_running;
