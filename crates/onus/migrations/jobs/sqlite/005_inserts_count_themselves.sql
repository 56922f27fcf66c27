-- Inserts add to the counters themselves, once per (queue, kind, state) of a batch, instead of
-- a trigger that updated a counter row for every row inserted: a third of a batch insert's time
-- in SQLite (measured on this project's benchmark machine). Every insert of a job goes through
-- the store's insert (`store::insert::insert`), which counts in the same transaction.
DROP TRIGGER IF EXISTS onus_jobs_counted_insert;
