-- A task's first events live in its own row: every task event is written
-- by a transaction that writes the task row anyway (its event_seq is
-- there), and the three event rows of every job (created, claimed,
-- succeeded) were an eighth of Postgres's work in the jobs workload.
-- The column holds the events numbered up to 8, each as ",{json}", so
-- that appending is a concatenation and '[' || substr(events, 2) || ']'
-- is a JSON array. Later events (a long task's heartbeats) go to the
-- events table, which bounds the row. Events written before this
-- migration stay in the events table: readers take both.
ALTER TABLE tasks ADD COLUMN events TEXT NOT NULL DEFAULT ''
