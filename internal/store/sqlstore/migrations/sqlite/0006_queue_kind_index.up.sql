-- Each kind of queue item is looked for on its own: the dispatcher wants
-- HTTP attempts, the timer loop wake-ups, webhook timeouts and run
-- expiries. With an index on due_at alone, looking for a due HTTP attempt
-- walked every due wake-up first (a sleeping run's wake-up is a queue row),
-- and the next due time read the whole queue. (kind, due_at, id) gives
-- each kind its own ordered walk. Leased items (HTTP attempts in flight,
-- failed timers held for a lease) are few and have their own index.
DROP INDEX queue_due;
CREATE INDEX queue_due ON queue(kind, due_at, id);
CREATE INDEX queue_leased ON queue(lease_until) WHERE lease_until IS NOT NULL;
