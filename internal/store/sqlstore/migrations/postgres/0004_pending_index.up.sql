-- Only pending tasks are walked in claim order: an index of them alone is
-- small, and a task leaves it once (when claimed) instead of moving within
-- it at every change of status.
DROP INDEX tasks_claim;
CREATE INDEX tasks_claim ON tasks(priority, run_at, created_at) WHERE status = 'pending';
