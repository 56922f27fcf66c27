-- What a delivery's body is: the Standard Webhooks envelope {"type", "timestamp", "data"}
-- ('envelope', what new endpoints get) or the event's payload alone ('raw'). Endpoints made
-- before this migration keep the bare payload their consumers already read.
ALTER TABLE onus_endpoints ADD COLUMN payload text NOT NULL DEFAULT 'raw';
