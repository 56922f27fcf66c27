-- Keys paused until a time (DESIGN: pause a key). While a pause lasts, the waiting jobs holding
-- the key are `scheduled` until its end with `lease_wait` set (held, not snoozed: no attempt and
-- no history entry); a job of the key claimed meanwhile is held when it tries to take the key.
CREATE TABLE onus_key_pauses (
    key       text        PRIMARY KEY,
    until     timestamptz NOT NULL,
    paused_at timestamptz NOT NULL,
    reason    text        NOT NULL
);
-- A pause finds the key's waiting jobs, a resume and the listing its held ones, through this
-- index only: jobs without a lease key are never in it.
CREATE INDEX IF NOT EXISTS onus_jobs_keyed_waiting ON onus_jobs (lease_key)
    WHERE lease_key IS NOT NULL AND state IN ('available', 'scheduled', 'retryable', 'snoozed');
