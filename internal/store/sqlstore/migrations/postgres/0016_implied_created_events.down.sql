UPDATE tasks SET events = ',{"seq":1,"type":"created","data":{'
    || CASE WHEN run_id IS NULL THEN '' ELSE '"run_id":' || to_json(run_id)::text || ',"step":' || to_json(step)::text || ',' END
    || '"type":' || to_json(type)::text || '},"at":' || created_at || '}' || substr(events, 2)
WHERE events LIKE '~%'
