INSERT INTO queue (kind, run_id, step, attempt, due_at) SELECT 'run_expire', id, '', 0, expires_at FROM runs WHERE status IN ('running', 'paused');
DROP INDEX runs_expiry;
