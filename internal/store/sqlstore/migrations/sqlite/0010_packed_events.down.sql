INSERT INTO events (run_id, seq, type, step, data, at)
SELECT v.run_id, json_extract(e.value, '$.seq'), json_extract(e.value, '$.type'), COALESCE(json_extract(e.value, '$.step'), ''), e.value -> '$.data', json_extract(e.value, '$.at')
FROM events v, json_each('[' || substr(v.earlier, 2) || ']') AS e
WHERE v.earlier IS NOT NULL;
ALTER TABLE events DROP COLUMN earlier
