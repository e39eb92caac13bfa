CREATE INDEX tasks_run ON tasks(run_id) WHERE run_id IS NOT NULL AND status IN ('pending', 'leased')
