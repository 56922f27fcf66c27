-- One row per mail job whose message a relay accepted, written in the transaction that
-- completes the job (the mark): who accepted it and which recipients the relay refused.
CREATE TABLE onus_mail_sent (
    job_id     INTEGER PRIMARY KEY,
    message_id TEXT    NOT NULL,
    sent_at    INTEGER NOT NULL,
    attempt    INTEGER NOT NULL,
    accepted   TEXT    NOT NULL,   -- JSON array of addresses
    refused    TEXT    NOT NULL    -- JSON array of {address, reply}
);
CREATE INDEX onus_mail_sent_at ON onus_mail_sent (sent_at);

-- Mail jobs that took their rate-window uses, so a later attempt of the same mail takes none;
-- the row goes with the mark.
CREATE TABLE onus_mail_limits_taken (
    job_id   INTEGER PRIMARY KEY,
    taken_at INTEGER NOT NULL
);
