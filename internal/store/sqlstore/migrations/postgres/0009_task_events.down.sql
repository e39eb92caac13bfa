INSERT INTO events (run_id, seq, type, step, data, at)
SELECT t.id, (e->>'seq')::bigint, e->>'type', COALESCE(e->>'step', ''), (e->'data')::text, (e->>'at')::bigint
FROM tasks t, json_array_elements(('[' || substr(t.events, 2) || ']')::json) AS e
WHERE t.events <> '';
ALTER TABLE tasks DROP COLUMN events
