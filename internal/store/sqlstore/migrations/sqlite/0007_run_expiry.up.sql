-- A run's expiry is read from the run, not from a queue row: every run had
-- a run_expire row, written when it started and deleted when it finished,
-- three index entries and a delete for a timer that almost never fires.
-- runs_expiry holds the runs not finished by expires_at (the timer loop's
-- walk), which a run leaves with the update that finishes it. The
-- rows are dropped: each was due at its run's expires_at, the value it was
-- written from (expires_at never changes).
CREATE INDEX IF NOT EXISTS runs_expiry ON runs(expires_at) WHERE status IN ('running', 'paused');
DELETE FROM queue WHERE kind = 'run_expire';
