DROP INDEX tasks_run;
CREATE INDEX tasks_run ON tasks(run_id) WHERE run_id IS NOT NULL
