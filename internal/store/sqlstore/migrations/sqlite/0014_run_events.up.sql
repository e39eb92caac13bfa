-- A run's first events live in its own row, as a task's do (see 0009):
-- every run event is written by a transaction that writes the run's row
-- anyway (its event_seq is there), and the events row each such
-- transaction added was 6–11 % of the machine's work in the jobs
-- workload and up to a fifth in chain10. The column holds the events
-- numbered up to 8, each as ",{json}", and later ones go to the events
-- table, which bounds the row every run update rewrites. Events written
-- before this migration stay in the events table: readers take both.
ALTER TABLE runs ADD COLUMN events TEXT NOT NULL DEFAULT ''
