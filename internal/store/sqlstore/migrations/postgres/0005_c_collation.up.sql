-- Keys compare byte by byte. Ids, tokens, keys and statuses are compared
-- in every index they are in, and under a database's default collation
-- (en_US.UTF-8, C.UTF-8) each comparison goes through the C library's
-- strcoll and loses abbreviated keys. With COLLATE "C" they are memcmp.
-- Their order is unchanged for the ASCII they hold. Workflow names keep
-- the database's collation: they are listed in it.
ALTER TABLE workflows ALTER COLUMN id TYPE TEXT COLLATE "C";
ALTER TABLE workflow_versions ALTER COLUMN workflow_id TYPE TEXT COLLATE "C";
ALTER TABLE runs ALTER COLUMN id TYPE TEXT COLLATE "C", ALTER COLUMN workflow_id TYPE TEXT COLLATE "C", ALTER COLUMN status TYPE TEXT COLLATE "C", ALTER COLUMN idempotency_key TYPE TEXT COLLATE "C";
ALTER TABLE step_runs ALTER COLUMN run_id TYPE TEXT COLLATE "C", ALTER COLUMN name TYPE TEXT COLLATE "C", ALTER COLUMN callback_token TYPE TEXT COLLATE "C";
ALTER TABLE tasks ALTER COLUMN id TYPE TEXT COLLATE "C", ALTER COLUMN run_id TYPE TEXT COLLATE "C", ALTER COLUMN idempotency_key TYPE TEXT COLLATE "C", ALTER COLUMN status TYPE TEXT COLLATE "C";
ALTER TABLE queue ALTER COLUMN run_id TYPE TEXT COLLATE "C";
ALTER TABLE events ALTER COLUMN run_id TYPE TEXT COLLATE "C"
