-- Tags to find jobs by (a JSON array of strings), and queues paused by hand.
ALTER TABLE onus_jobs ADD COLUMN tags jsonb NOT NULL DEFAULT '[]';

-- A queue with paused_at set claims nothing in any process until resumed.
CREATE TABLE onus_queues (
    name       text PRIMARY KEY,
    paused_at  timestamptz,
    updated_at timestamptz NOT NULL
);
