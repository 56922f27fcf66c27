-- Counts per (queue, kind, state) and a per-minute history of outcomes, kept by statement
-- triggers so that the panel, /queues and /metrics never count every job. A statement appends
-- its net change to onus_job_deltas (append-only: concurrent writers never wait on one counter
-- row); the maintenance leader folds the deltas into onus_job_counts and onus_job_history.
-- A reader adds the deltas not yet folded, so a count is exact in every transaction.
CREATE TABLE onus_job_counts (
    queue text   NOT NULL,
    kind  text   NOT NULL,
    state text   NOT NULL,
    n     bigint NOT NULL,
    PRIMARY KEY (queue, kind, state)
);

-- Jobs that reached completed, retryable or discarded, by the minute they got there.
CREATE TABLE onus_job_history (
    minute timestamptz NOT NULL,
    kind   text        NOT NULL,
    state  text        NOT NULL,
    n      bigint      NOT NULL,
    PRIMARY KEY (minute, kind, state)
);

-- minute is set on the rows that record an arrival in one of the history's states.
CREATE TABLE onus_job_deltas (
    queue  text   NOT NULL,
    kind   text   NOT NULL,
    state  text   NOT NULL,
    minute timestamptz,
    n      bigint NOT NULL
);

CREATE FUNCTION onus_jobs_counted_insert() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO onus_job_deltas (queue, kind, state, n)
    SELECT queue, kind, state, count(*) FROM onus_new GROUP BY queue, kind, state;
    RETURN NULL;
END $$;

CREATE FUNCTION onus_jobs_counted_delete() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO onus_job_deltas (queue, kind, state, n)
    SELECT queue, kind, state, -count(*) FROM onus_old GROUP BY queue, kind, state;
    RETURN NULL;
END $$;

CREATE FUNCTION onus_jobs_counted_update() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO onus_job_deltas (queue, kind, state, minute, n)
    SELECT c.queue, c.kind, c.state, c.minute, sum(c.d)
    FROM onus_new n
    JOIN onus_old o ON o.id = n.id
    CROSS JOIN LATERAL (VALUES
        (o.queue, o.kind, o.state, NULL::timestamptz, -1),
        (n.queue, n.kind, n.state,
         CASE WHEN n.state IN ('completed', 'retryable', 'discarded')
              THEN date_trunc('minute', coalesce(n.finalized_at, n.attempted_at, now())) END, 1)
    ) AS c(queue, kind, state, minute, d)
    WHERE o.state <> n.state OR o.queue <> n.queue OR o.kind <> n.kind
    GROUP BY c.queue, c.kind, c.state, c.minute;
    RETURN NULL;
END $$;

CREATE TRIGGER onus_jobs_counted_insert AFTER INSERT ON onus_jobs
    REFERENCING NEW TABLE AS onus_new FOR EACH STATEMENT EXECUTE FUNCTION onus_jobs_counted_insert();
CREATE TRIGGER onus_jobs_counted_delete AFTER DELETE ON onus_jobs
    REFERENCING OLD TABLE AS onus_old FOR EACH STATEMENT EXECUTE FUNCTION onus_jobs_counted_delete();
CREATE TRIGGER onus_jobs_counted_update AFTER UPDATE ON onus_jobs
    REFERENCING OLD TABLE AS onus_old NEW TABLE AS onus_new
    FOR EACH STATEMENT EXECUTE FUNCTION onus_jobs_counted_update();

-- The jobs already there.
INSERT INTO onus_job_counts (queue, kind, state, n)
SELECT queue, kind, state, count(*) FROM onus_jobs GROUP BY queue, kind, state;
