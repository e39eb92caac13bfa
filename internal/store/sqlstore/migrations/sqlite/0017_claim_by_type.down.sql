DROP INDEX tasks_claim;
CREATE INDEX tasks_claim ON tasks(priority, run_at, created_at) WHERE status = 'pending';
