-- One row per mail job whose message a relay accepted, written in the transaction that
-- completes the job (the mark): who accepted it and which recipients the relay refused.
CREATE TABLE onus_mail_sent (
    job_id     BIGINT      PRIMARY KEY,
    message_id TEXT        NOT NULL,
    sent_at    TIMESTAMPTZ NOT NULL,
    attempt    INTEGER     NOT NULL,
    accepted   JSONB       NOT NULL,
    refused    JSONB       NOT NULL
);
CREATE INDEX onus_mail_sent_at ON onus_mail_sent (sent_at);

-- Mail jobs that took their rate-window uses, so a later attempt of the same mail takes none;
-- the row goes with the mark.
CREATE TABLE onus_mail_limits_taken (
    job_id   BIGINT PRIMARY KEY,
    taken_at TIMESTAMPTZ NOT NULL
);
