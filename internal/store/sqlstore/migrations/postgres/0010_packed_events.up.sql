-- The events one transaction writes for one run (or task, past its row's
-- share) go as one row: the last event in the row's columns, the ones
-- before it in earlier, as ",{json}" objects (the form of tasks.events,
-- see 0009), NULL for a row of one event. A job's run wrote four event
-- rows (run started, step started, step succeeded, run completed) in two
-- transactions, now two. seq is the last event's number, so the rows
-- holding the events after n are those with seq > n, as before.
ALTER TABLE events ADD COLUMN earlier TEXT
