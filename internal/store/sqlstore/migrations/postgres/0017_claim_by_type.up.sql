-- Pending tasks indexed by type first: a claim walks each of its types'
-- due tasks alone, however many tasks of other types are waiting (with
-- priority first it read every due task of another type ahead of its
-- own, a table row each, to see its type). Types compare byte by byte,
-- as the keys of migration 5 do, so that the types starting with a
-- prefix are one range of the index whatever the database's collation;
-- their order is unchanged for the ASCII they hold.
DROP INDEX tasks_claim;
ALTER TABLE tasks ALTER COLUMN type TYPE TEXT COLLATE "C";
CREATE INDEX tasks_claim ON tasks(type, priority, run_at, created_at) WHERE status = 'pending';
