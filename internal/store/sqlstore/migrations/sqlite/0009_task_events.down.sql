INSERT INTO events (run_id, seq, type, step, data, at)
SELECT t.id, json_extract(e.value, '$.seq'), json_extract(e.value, '$.type'), COALESCE(json_extract(e.value, '$.step'), ''), e.value -> '$.data', json_extract(e.value, '$.at')
FROM tasks t, json_each('[' || substr(t.events, 2) || ']') AS e
WHERE t.events <> '';
ALTER TABLE tasks DROP COLUMN events
