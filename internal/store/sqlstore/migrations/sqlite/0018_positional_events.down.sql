-- Rewrites the events written by position back into objects, for a Ferry
-- from before migration 18. (SQLite's JSON functions write objects and
-- arrays in data without their whitespace.)
UPDATE tasks SET events = CASE WHEN events LIKE '~%' THEN '~' ELSE '' END || COALESCE((
  SELECT group_concat(o, '' ORDER BY k) FROM (SELECT e.key AS k, ',' || CASE WHEN e.type <> 'array' THEN e.value ELSE
      '{"seq":' || (e.value ->> '$[0]') || ',"type":' || (e.value -> '$[1]')
      || CASE WHEN json_array_length(e.value) > 3 AND json_type(e.value, '$[3]') = 'text' AND e.value ->> '$[3]' <> '' THEN ',"step":' || (e.value -> '$[3]') ELSE '' END
      || CASE WHEN json_array_length(e.value) = 5 THEN ',"data":' || (e.value -> '$[4]')
              WHEN json_array_length(e.value) = 4 AND json_type(e.value, '$[3]') <> 'text' THEN ',"data":' || (e.value -> '$[3]') ELSE '' END
      || ',"at":' || (e.value ->> '$[2]') || '}' END AS o
    FROM json_each('[' || substr(ltrim(events, '~'), 2) || ']') AS e)), '')
WHERE events LIKE '%,[%';
UPDATE runs SET events = (
  SELECT group_concat(o, '' ORDER BY k) FROM (SELECT e.key AS k, ',' || CASE WHEN e.type <> 'array' THEN e.value ELSE
      '{"seq":' || (e.value ->> '$[0]') || ',"type":' || (e.value -> '$[1]')
      || CASE WHEN json_array_length(e.value) > 3 AND json_type(e.value, '$[3]') = 'text' AND e.value ->> '$[3]' <> '' THEN ',"step":' || (e.value -> '$[3]') ELSE '' END
      || CASE WHEN json_array_length(e.value) = 5 THEN ',"data":' || (e.value -> '$[4]')
              WHEN json_array_length(e.value) = 4 AND json_type(e.value, '$[3]') <> 'text' THEN ',"data":' || (e.value -> '$[3]') ELSE '' END
      || ',"at":' || (e.value ->> '$[2]') || '}' END AS o
    FROM json_each('[' || substr(events, 2) || ']') AS e))
WHERE events LIKE '%,[%';
UPDATE events SET earlier = (
  SELECT group_concat(o, '' ORDER BY k) FROM (SELECT e.key AS k, ',' || CASE WHEN e.type <> 'array' THEN e.value ELSE
      '{"seq":' || (e.value ->> '$[0]') || ',"type":' || (e.value -> '$[1]')
      || CASE WHEN json_array_length(e.value) > 3 AND json_type(e.value, '$[3]') = 'text' AND e.value ->> '$[3]' <> '' THEN ',"step":' || (e.value -> '$[3]') ELSE '' END
      || CASE WHEN json_array_length(e.value) = 5 THEN ',"data":' || (e.value -> '$[4]')
              WHEN json_array_length(e.value) = 4 AND json_type(e.value, '$[3]') <> 'text' THEN ',"data":' || (e.value -> '$[3]') ELSE '' END
      || ',"at":' || (e.value ->> '$[2]') || '}' END AS o
    FROM json_each('[' || substr(earlier, 2) || ']') AS e))
WHERE earlier LIKE '%,[%';
