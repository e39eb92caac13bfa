-- Postgres drops the foreign keys of runs and step_runs here (see its
-- migration of the same number). SQLite keeps them: its check is a probe
-- of an index in the same process, and turning it off measured within
-- the noise of chain10.
SELECT 1
