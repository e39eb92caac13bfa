INSERT INTO events (run_id, seq, type, step, data, at)
SELECT r.id, (e->>'seq')::bigint, e->>'type', COALESCE(e->>'step', ''), (e->'data')::text, (e->>'at')::bigint
FROM runs r, json_array_elements(('[' || substr(r.events, 2) || ']')::json) AS e
WHERE r.events <> '';
ALTER TABLE runs DROP COLUMN events
