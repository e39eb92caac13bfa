INSERT INTO events (run_id, seq, type, step, data, at)
SELECT v.run_id, (e->>'seq')::bigint, e->>'type', COALESCE(e->>'step', ''), (e->'data')::text, (e->>'at')::bigint
FROM events v, json_array_elements(('[' || substr(v.earlier, 2) || ']')::json) AS e
WHERE v.earlier IS NOT NULL;
ALTER TABLE events DROP COLUMN earlier
