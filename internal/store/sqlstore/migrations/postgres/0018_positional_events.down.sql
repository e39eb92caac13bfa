-- Rewrites the events written by position back into objects, for a Ferry
-- from before migration 18 (json, not jsonb, keeps each value's text).
CREATE FUNCTION pg_temp.ferry_events_as_objects(packed TEXT) RETURNS TEXT LANGUAGE SQL AS $$
  SELECT string_agg(',' || CASE WHEN json_typeof(e) <> 'array' THEN e::text ELSE
      '{"seq":' || (e->>0) || ',"type":' || (e->1)::text
      || CASE WHEN json_array_length(e) > 3 AND json_typeof(e->3) = 'string' AND e->>3 <> '' THEN ',"step":' || (e->3)::text ELSE '' END
      || CASE WHEN json_array_length(e) = 5 THEN ',"data":' || (e->4)::text
              WHEN json_array_length(e) = 4 AND json_typeof(e->3) <> 'string' THEN ',"data":' || (e->3)::text ELSE '' END
      || ',"at":' || (e->>2) || '}' END, '' ORDER BY n)
  FROM json_array_elements(('[' || substr(packed, 2) || ']')::json) WITH ORDINALITY AS x(e, n)
$$;
UPDATE tasks SET events = CASE WHEN events LIKE '~%' THEN '~' || COALESCE(pg_temp.ferry_events_as_objects(substr(events, 2)), '')
    ELSE pg_temp.ferry_events_as_objects(events) END
WHERE events LIKE '%,[%';
UPDATE runs SET events = pg_temp.ferry_events_as_objects(events) WHERE events LIKE '%,[%';
UPDATE events SET earlier = pg_temp.ferry_events_as_objects(earlier) WHERE earlier LIKE '%,[%';
