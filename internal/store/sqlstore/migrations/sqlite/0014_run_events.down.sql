INSERT INTO events (run_id, seq, type, step, data, at)
SELECT r.id, json_extract(e.value, '$.seq'), json_extract(e.value, '$.type'), COALESCE(json_extract(e.value, '$.step'), ''), e.value -> '$.data', json_extract(e.value, '$.at')
FROM runs r, json_each('[' || substr(r.events, 2) || ']') AS e
WHERE r.events <> '';
ALTER TABLE runs DROP COLUMN events
