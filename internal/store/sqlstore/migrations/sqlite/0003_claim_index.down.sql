CREATE INDEX tasks_type ON tasks(type);
