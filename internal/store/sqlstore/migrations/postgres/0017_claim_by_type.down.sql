DROP INDEX tasks_claim;
ALTER TABLE tasks ALTER COLUMN type TYPE TEXT COLLATE "default";
CREATE INDEX tasks_claim ON tasks(priority, run_at, created_at) WHERE status = 'pending';
