DROP INDEX queue_leased;
DROP INDEX queue_due;
CREATE INDEX queue_due ON queue(due_at);
