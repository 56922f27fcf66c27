-- Secrets the server keeps for every process sharing the database: the API token (its current
-- version and, for a grace period after a rotation, the previous ones), push-kind signing secrets.
-- Times are Unix microseconds.
CREATE TABLE onus_server_secrets (
    name       TEXT    NOT NULL,
    version    INTEGER NOT NULL,
    value      TEXT    NOT NULL,
    created_at INTEGER NOT NULL,
    expires_at INTEGER,
    PRIMARY KEY (name, version)
);
