-- Claims filter types while walking tasks_claim in claim order. A type
-- index let the planner intersect both and sort the whole backlog instead
-- (chosen whenever statistics were stale), and cost a write per task.
DROP INDEX tasks_type;
-- Expired leases are found by walking this small index from its start.
CREATE INDEX tasks_lease ON tasks(lease_until) WHERE status = 'leased';
