-- A running job's progress as its handler (or pull worker) last reported it:
-- {"fraction": 0.0-1.0, "message": "...", "at": "..."}; and a completed job's small JSON result.
-- Both are read with the job, never by a claim.
ALTER TABLE onus_jobs ADD COLUMN progress TEXT;
ALTER TABLE onus_jobs ADD COLUMN result TEXT;
