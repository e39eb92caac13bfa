DROP TABLE api_keys;
DROP TABLE events;
DROP TABLE queue;
DROP TABLE step_runs;
DROP TABLE runs;
DROP TABLE workflow_versions;
DROP TABLE workflows;
