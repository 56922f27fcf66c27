-- Webhook tables for PostgreSQL, version 1: times as Unix microseconds (BIGINT), flags 0/1, JSON as TEXT.
-- Version 2 moves them to the convention of the job tables (timestamptz, boolean, jsonb).
CREATE TABLE IF NOT EXISTS onus_endpoints (
    id              TEXT   PRIMARY KEY,
    url             TEXT   NOT NULL,
    description     TEXT   NOT NULL DEFAULT '',
    event_types     TEXT   NOT NULL DEFAULT '[]',
    secrets         TEXT   NOT NULL,
    enabled         BIGINT NOT NULL DEFAULT 1,
    disabled_reason TEXT,
    failing_since   BIGINT,
    last_failure_at BIGINT,
    created_at      BIGINT NOT NULL,
    updated_at      BIGINT NOT NULL
);

CREATE TABLE IF NOT EXISTS onus_events (
    id         TEXT   PRIMARY KEY,
    type       TEXT   NOT NULL,
    payload    TEXT   NOT NULL,
    created_at BIGINT NOT NULL
);
CREATE INDEX IF NOT EXISTS onus_events_created ON onus_events (created_at);

-- One row per (event, endpoint) ever fanned out: a fan-out that runs again creates no delivery twice.
CREATE TABLE IF NOT EXISTS onus_deliveries (
    event_id    TEXT   NOT NULL,
    endpoint_id TEXT   NOT NULL,
    created_at  BIGINT NOT NULL,
    PRIMARY KEY (event_id, endpoint_id)
);
CREATE INDEX IF NOT EXISTS onus_deliveries_created ON onus_deliveries (created_at);

CREATE TABLE IF NOT EXISTS onus_delivery_attempts (
    id               TEXT   PRIMARY KEY,
    event_id         TEXT   NOT NULL,
    endpoint_id      TEXT   NOT NULL,
    job_id           BIGINT NOT NULL,
    attempt          BIGINT NOT NULL,
    attempted_at     BIGINT NOT NULL,
    status           BIGINT,
    duration_us      BIGINT NOT NULL,
    response_excerpt TEXT   NOT NULL DEFAULT '',
    error            TEXT,
    outcome          TEXT   NOT NULL
);
CREATE INDEX IF NOT EXISTS onus_delivery_attempts_event ON onus_delivery_attempts (event_id, attempted_at);
CREATE INDEX IF NOT EXISTS onus_delivery_attempts_endpoint ON onus_delivery_attempts (endpoint_id, attempted_at);
