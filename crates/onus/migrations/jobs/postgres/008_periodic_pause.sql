-- A periodic schedule paused by hand enqueues nothing until resumed.
ALTER TABLE onus_periodic ADD COLUMN paused_at timestamptz;
