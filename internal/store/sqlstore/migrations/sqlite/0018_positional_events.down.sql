-- Rewrites the events written by position back into objects, for a Ferry
-- from before migration 18. (SQLite's JSON functions write objects and
-- arrays in data without their whitespace.) The packed events of the
-- three tables are converted together, by one expression.
CREATE TEMP TABLE ferry_down18 AS
  SELECT 'tasks' AS t, rowid AS r, CASE WHEN events LIKE '~%' THEN '~' ELSE '' END AS mark, substr(ltrim(events, '~'), 2) AS packed FROM tasks WHERE events LIKE '%,[%'
  UNION ALL SELECT 'runs', rowid, '', substr(events, 2) FROM runs WHERE events LIKE '%,[%'
  UNION ALL SELECT 'events', rowid, '', substr(earlier, 2) FROM events WHERE earlier LIKE '%,[%';
CREATE TEMP TABLE ferry_down18_out AS SELECT t, r, mark || COALESCE((
  SELECT group_concat(o, '' ORDER BY k) FROM (SELECT e.key AS k, ',' || CASE WHEN e.type <> 'array' THEN e.value ELSE
      '{"seq":' || (e.value ->> '$[0]') || ',"type":' || (e.value -> '$[1]')
      || CASE WHEN json_array_length(e.value) > 3 AND json_type(e.value, '$[3]') = 'text' AND e.value ->> '$[3]' <> '' THEN ',"step":' || (e.value -> '$[3]') ELSE '' END
      || CASE WHEN json_array_length(e.value) = 5 THEN ',"data":' || (e.value -> '$[4]')
              WHEN json_array_length(e.value) = 4 AND json_type(e.value, '$[3]') <> 'text' THEN ',"data":' || (e.value -> '$[3]') ELSE '' END
      || ',"at":' || (e.value ->> '$[2]') || '}' END AS o
    FROM json_each('[' || packed || ']') AS e)), '') AS v FROM ferry_down18;
UPDATE tasks SET events = (SELECT v FROM ferry_down18_out WHERE t = 'tasks' AND r = tasks.rowid) WHERE rowid IN (SELECT r FROM ferry_down18_out WHERE t = 'tasks');
UPDATE runs SET events = (SELECT v FROM ferry_down18_out WHERE t = 'runs' AND r = runs.rowid) WHERE rowid IN (SELECT r FROM ferry_down18_out WHERE t = 'runs');
UPDATE events SET earlier = (SELECT v FROM ferry_down18_out WHERE t = 'events' AND r = events.rowid) WHERE rowid IN (SELECT r FROM ferry_down18_out WHERE t = 'events');
DROP TABLE ferry_down18_out;
DROP TABLE ferry_down18;
