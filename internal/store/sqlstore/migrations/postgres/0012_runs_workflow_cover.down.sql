CREATE INDEX runs_workflow ON runs(workflow_id, id);
CREATE INDEX runs_workflow_status ON runs(workflow_id, status);
DROP INDEX runs_by_workflow
