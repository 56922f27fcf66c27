-- Onus schema for PostgreSQL, version 1.
CREATE TABLE onus_jobs (
    id               bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    kind             text        NOT NULL,
    queue            text        NOT NULL,
    args             jsonb       NOT NULL,
    priority         smallint    NOT NULL DEFAULT 0,
    state            text        NOT NULL CHECK (state IN ('available', 'scheduled', 'running', 'retryable',
                                                       'snoozed', 'completed', 'discarded', 'cancelled')),
    attempt          integer     NOT NULL DEFAULT 0,
    max_attempts     integer     NOT NULL,
    run_at           timestamptz NOT NULL,
    created_at       timestamptz NOT NULL,
    attempted_at     timestamptz,
    finalized_at     timestamptz,
    errors           jsonb       NOT NULL DEFAULT '[]',
    snoozes          integer     NOT NULL DEFAULT 0,
    discard_reason   text,
    unique_key       text,
    lease_key        text,
    lease_owner      text,
    lease_expires_at timestamptz,
    cancel_requested boolean     NOT NULL DEFAULT false,
    lease_wait       boolean     NOT NULL DEFAULT false
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
-- Jobs snoozed behind a busy lease key, woken when a slot frees.
CREATE INDEX onus_jobs_lease_waiters ON onus_jobs (lease_key, run_at) WHERE state = 'snoozed' AND lease_wait;
-- Listing by kind.
CREATE INDEX onus_jobs_kind ON onus_jobs (kind, id);

CREATE TABLE onus_leases (
    key        text        NOT NULL,
    slot       integer     NOT NULL,
    job_id     bigint      NOT NULL,
    busy_until timestamptz NOT NULL,
    PRIMARY KEY (key, slot)
);
CREATE INDEX onus_leases_job ON onus_leases (job_id);

CREATE TABLE onus_rate_windows (
    key          text        NOT NULL,
    window_start timestamptz NOT NULL,
    window_end   timestamptz NOT NULL,
    used         integer     NOT NULL,
    PRIMARY KEY (key, window_start)
);

CREATE TABLE onus_leader (
    name       text PRIMARY KEY,
    holder     text        NOT NULL,
    expires_at timestamptz NOT NULL
);

CREATE TABLE onus_periodic (
    name            text PRIMARY KEY,
    kind            text NOT NULL,
    schedule        text NOT NULL,
    last_period_at  timestamptz,
    last_job_id     bigint,
    last_run_at     timestamptz,
    last_state      text,
    last_failure_at timestamptz,
    last_error      text,
    next_run_at     timestamptz
);

CREATE TABLE onus_alerts (
    id         bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    job_id     bigint      NOT NULL,
    kind       text        NOT NULL,
    message    text        NOT NULL,
    created_at timestamptz NOT NULL,
    acked_at   timestamptz
);
CREATE INDEX onus_alerts_open ON onus_alerts (id) WHERE acked_at IS NULL;
