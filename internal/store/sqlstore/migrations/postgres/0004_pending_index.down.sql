DROP INDEX tasks_claim;
CREATE INDEX tasks_claim ON tasks(status, priority, run_at, created_at);
