-- Tenants (a customer of the team: an event of tenant T reaches only endpoints of tenant T, an
-- event without one only endpoints without one), headers sent with every delivery, test events
-- addressed to one endpoint, the job of each delivery, and when an endpoint was disabled.
ALTER TABLE onus_endpoints ADD COLUMN tenant TEXT;
ALTER TABLE onus_endpoints ADD COLUMN headers TEXT NOT NULL DEFAULT '{}';
ALTER TABLE onus_endpoints ADD COLUMN disabled_at BIGINT;
CREATE INDEX IF NOT EXISTS onus_endpoints_tenant ON onus_endpoints (tenant, created_at);
ALTER TABLE onus_events ADD COLUMN tenant TEXT;
ALTER TABLE onus_events ADD COLUMN only_endpoint TEXT;
CREATE INDEX IF NOT EXISTS onus_events_tenant ON onus_events (tenant, created_at);
ALTER TABLE onus_deliveries ADD COLUMN job_id BIGINT;
