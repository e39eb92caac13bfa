-- The foreign keys of runs (to workflows) and step_runs (to runs) checked
-- each row written with a query and a FOR KEY SHARE lock: a tenth of
-- Postgres's statement time in the jobs workload, and the lock on the
-- workflow row, taken by every batch of runs at once, made multixacts.
-- They guarded nothing the writes do not already: the runtime creates a
-- run only with its workflow locked FOR SHARE and checked in the same
-- transaction, a run's steps go in the same statement as the run, and
-- no run, step or workflow row is ever deleted (workflows are deleted by
-- setting deleted_at).
ALTER TABLE step_runs DROP CONSTRAINT IF EXISTS step_runs_run_id_fkey;
ALTER TABLE runs DROP CONSTRAINT IF EXISTS runs_workflow_id_fkey;
