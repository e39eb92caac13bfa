-- Pending tasks indexed by type first: a claim walks each of its types'
-- due tasks alone, however many tasks of other types are waiting (with
-- priority first it read every due task of another type ahead of its
-- own, a table row each, to see its type).
DROP INDEX tasks_claim;
CREATE INDEX tasks_claim ON tasks(type, priority, run_at, created_at) WHERE status = 'pending';
