-- Events in rows (a task's and a run's own, and the earlier events an
-- events row packs) are written by position, [seq,"type",at,"step",data],
-- instead of as objects with keys ({"seq":…,"type":…,"step":…,
-- "data":…,"at":…}): the keys were a quarter of an event's bytes,
-- rewritten with every version of its row. Rows written before this
-- migration keep their objects and are read as they are (a row may hold
-- both forms), so nothing is rewritten and this migration changes no
-- table: it marks the schema as one an older Ferry cannot read.
SELECT 1
