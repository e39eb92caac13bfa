-- tasks_run serves one query, a finished run's cancellation of its
-- unfinished tasks, so it holds only those: a task leaves it with the
-- update that finishes it instead of being entered once more (every
-- update of a task is a new row version in each index it matches), and
-- it stays as small as the work in flight however many tasks are kept.
DROP INDEX tasks_run;
CREATE INDEX tasks_run ON tasks(run_id) WHERE run_id IS NOT NULL AND status IN ('pending', 'leased')
