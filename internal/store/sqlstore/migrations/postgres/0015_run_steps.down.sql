INSERT INTO step_runs (run_id, name, position, type, status, attempt, status_code, duration_ms, request, body, headers, is_truncated, blocked, error, wake_at, started_at, finished_at)
SELECT r.id, e->>'n', (e->>'p')::bigint, e->>'t', e->>'s', COALESCE((e->>'a')::bigint, 0), (e->>'c')::bigint, (e->>'d')::bigint, e->>'q', convert_to(e->>'b', 'UTF8'), (e->'h')::text, COALESCE((e->>'x')::boolean, FALSE), COALESCE((e->>'l')::boolean, FALSE), COALESCE(e->>'e', ''), (e->>'w')::bigint, (e->>'r')::bigint, (e->>'f')::bigint
FROM runs r, json_array_elements(r.steps::json) AS e
WHERE r.steps <> ''
ON CONFLICT (run_id, name) DO UPDATE SET status = EXCLUDED.status, callback_token = EXCLUDED.callback_token, attempt = EXCLUDED.attempt, status_code = EXCLUDED.status_code, duration_ms = EXCLUDED.duration_ms, request = EXCLUDED.request, body = EXCLUDED.body, headers = EXCLUDED.headers, is_truncated = EXCLUDED.is_truncated, blocked = EXCLUDED.blocked, error = EXCLUDED.error, wake_at = EXCLUDED.wake_at, started_at = EXCLUDED.started_at, finished_at = EXCLUDED.finished_at;
ALTER TABLE runs DROP COLUMN steps
