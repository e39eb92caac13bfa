DROP INDEX tasks_lease;
CREATE INDEX tasks_type ON tasks(type text_pattern_ops);
