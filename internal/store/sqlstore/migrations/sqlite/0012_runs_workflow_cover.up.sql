-- A workflow's runs had two indexes: (workflow_id, id) to page them and
-- (workflow_id, status) to count them by status. A run's insert and the
-- update that changes its status entered both. One index ordered for
-- paging that ends with the status serves both reads: the count walks
-- the workflow's entries in it, as it walked them in the other. (SQLite
-- has no INCLUDE, and status as the last key column orders nothing,
-- ids being unique.) An update that leaves the status unset still leaves
-- the index alone (see runSetSeq).
CREATE INDEX runs_by_workflow ON runs(workflow_id, id, status);
DROP INDEX runs_workflow;
DROP INDEX runs_workflow_status
