-- A short run's small steps live in its own row (see packedsteps.go):
-- every write of a step also wrote its run's row, so a step_runs row was
-- a second row version and index entry for each change of a step. The
-- column holds a JSON array of the steps kept there. Steps of longer
-- runs, and steps with a callback token or large values, stay in
-- step_runs, as every step written before this migration does until its
-- run is next written. Readers take both, the run row's copy first.
ALTER TABLE runs ADD COLUMN steps TEXT NOT NULL DEFAULT ''
