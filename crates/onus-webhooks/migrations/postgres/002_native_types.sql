-- The webhook tables in the PostgreSQL convention of the job tables: instants as timestamptz,
-- flags as boolean, JSON as jsonb. Existing rows are converted in place.
ALTER TABLE onus_endpoints
    ALTER COLUMN event_types DROP DEFAULT,
    ALTER COLUMN event_types TYPE jsonb USING event_types::jsonb,
    ALTER COLUMN event_types SET DEFAULT '[]',
    ALTER COLUMN secrets TYPE jsonb USING secrets::jsonb,
    ALTER COLUMN enabled DROP DEFAULT,
    ALTER COLUMN enabled TYPE boolean USING enabled <> 0,
    ALTER COLUMN enabled SET DEFAULT true,
    ALTER COLUMN failing_since TYPE timestamptz USING timestamptz 'epoch' + failing_since * interval '1 microsecond',
    ALTER COLUMN last_failure_at TYPE timestamptz USING timestamptz 'epoch' + last_failure_at * interval '1 microsecond',
    ALTER COLUMN created_at TYPE timestamptz USING timestamptz 'epoch' + created_at * interval '1 microsecond',
    ALTER COLUMN updated_at TYPE timestamptz USING timestamptz 'epoch' + updated_at * interval '1 microsecond';

ALTER TABLE onus_events
    ALTER COLUMN payload TYPE jsonb USING payload::jsonb,
    ALTER COLUMN created_at TYPE timestamptz USING timestamptz 'epoch' + created_at * interval '1 microsecond';

ALTER TABLE onus_deliveries
    ALTER COLUMN created_at TYPE timestamptz USING timestamptz 'epoch' + created_at * interval '1 microsecond';

ALTER TABLE onus_delivery_attempts
    ALTER COLUMN attempt TYPE integer,
    ALTER COLUMN attempted_at TYPE timestamptz USING timestamptz 'epoch' + attempted_at * interval '1 microsecond',
    ALTER COLUMN status TYPE integer;
