-- Secrets the server keeps for every process sharing the database: the API token (its current
-- version and, for a grace period after a rotation, the previous ones), push-kind signing secrets.
CREATE TABLE onus_server_secrets (
    name       text        NOT NULL,
    version    bigint      NOT NULL,
    value      text        NOT NULL,
    created_at timestamptz NOT NULL,
    expires_at timestamptz,
    PRIMARY KEY (name, version)
);
