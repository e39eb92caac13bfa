-- A finished run's unfinished tasks are found by their ids, which the
-- runtime reads from the run's steps (each task step's request names its
-- task), not through an index of tasks by run. tasks_run took an entry
-- at every task's insert and again at its claim (a new row version, still
-- unfinished) to serve that one statement: 6 % of Postgres's WAL records
-- in the jobs and chain10 workloads.
DROP INDEX tasks_run
