-- Onus schema for SQLite, version 1. Times are microseconds since the Unix epoch, UTC.
CREATE TABLE onus_jobs (
    id               INTEGER PRIMARY KEY AUTOINCREMENT,
    kind             TEXT    NOT NULL,
    queue            TEXT    NOT NULL,
    args             TEXT    NOT NULL,
    priority         INTEGER NOT NULL DEFAULT 0,
    state            TEXT    NOT NULL,
    attempt          INTEGER NOT NULL DEFAULT 0,
    max_attempts     INTEGER NOT NULL,
    run_at           INTEGER NOT NULL,
    created_at       INTEGER NOT NULL,
    attempted_at     INTEGER,
    finalized_at     INTEGER,
    errors           TEXT    NOT NULL DEFAULT '[]',
    snoozes          INTEGER NOT NULL DEFAULT 0,
    discard_reason   TEXT,
    unique_key       TEXT,
    lease_key        TEXT,
    lease_owner      TEXT,
    lease_expires_at INTEGER,
    cancel_requested INTEGER NOT NULL DEFAULT 0,
    lease_wait       INTEGER NOT NULL DEFAULT 0
);

-- Claims read only these two partial indexes, so their cost never grows with finished jobs.
CREATE INDEX onus_jobs_available ON onus_jobs (queue, priority, run_at, id) WHERE state = 'available';
CREATE INDEX onus_jobs_delayed ON onus_jobs (queue, run_at) WHERE state IN ('scheduled', 'retryable', 'snoozed');
-- Heartbeats and the rescuer.
CREATE INDEX onus_jobs_running ON onus_jobs (lease_owner, lease_expires_at) WHERE state = 'running';
CREATE INDEX onus_jobs_expiring ON onus_jobs (lease_expires_at) WHERE state = 'running';
-- Retention.
CREATE INDEX onus_jobs_finalized ON onus_jobs (state, finalized_at) WHERE finalized_at IS NOT NULL;
-- Unique keys hold while a job is unfinished.
CREATE UNIQUE INDEX onus_jobs_unique ON onus_jobs (kind, unique_key)
    WHERE unique_key IS NOT NULL AND state NOT IN ('completed', 'discarded', 'cancelled');
-- Jobs snoozed behind a busy lease key (lease_wait = 1), woken when a slot frees.
CREATE INDEX onus_jobs_lease_waiters ON onus_jobs (lease_key, run_at) WHERE state = 'snoozed' AND lease_wait = 1;
-- Listing by kind.
CREATE INDEX onus_jobs_kind ON onus_jobs (kind, id);

CREATE TABLE onus_leases (
    key        TEXT    NOT NULL,
    slot       INTEGER NOT NULL,
    job_id     INTEGER NOT NULL,
    busy_until INTEGER NOT NULL,
    PRIMARY KEY (key, slot)
);

CREATE TABLE onus_rate_windows (
    key          TEXT    NOT NULL,
    window_start INTEGER NOT NULL,
    window_end   INTEGER NOT NULL,
    used         INTEGER NOT NULL,
    PRIMARY KEY (key, window_start)
);

CREATE TABLE onus_leader (
    name       TEXT PRIMARY KEY,
    holder     TEXT    NOT NULL,
    expires_at INTEGER NOT NULL
);

CREATE TABLE onus_periodic (
    name            TEXT PRIMARY KEY,
    kind            TEXT NOT NULL,
    schedule        TEXT NOT NULL,
    last_period_at  INTEGER,
    last_job_id     INTEGER,
    last_run_at     INTEGER,
    last_state      TEXT,
    last_failure_at INTEGER,
    last_error      TEXT,
    next_run_at     INTEGER
);

CREATE TABLE onus_alerts (
    id         INTEGER PRIMARY KEY AUTOINCREMENT,
    job_id     INTEGER NOT NULL,
    kind       TEXT    NOT NULL,
    message    TEXT    NOT NULL,
    created_at INTEGER NOT NULL,
    acked_at   INTEGER
);
CREATE INDEX onus_alerts_open ON onus_alerts (id) WHERE acked_at IS NULL;
