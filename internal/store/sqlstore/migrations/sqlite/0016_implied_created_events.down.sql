UPDATE tasks SET events = ',{"seq":1,"type":"created","data":{'
    || CASE WHEN run_id IS NULL THEN '' ELSE '"run_id":' || json_quote(run_id) || ',"step":' || json_quote(step) || ',' END
    || '"type":' || json_quote(type) || '},"at":' || created_at || '}' || substr(events, 2)
WHERE events LIKE '~%'
