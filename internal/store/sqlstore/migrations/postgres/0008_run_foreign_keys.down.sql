ALTER TABLE runs ADD CONSTRAINT runs_workflow_id_fkey FOREIGN KEY (workflow_id) REFERENCES workflows(id);
ALTER TABLE step_runs ADD CONSTRAINT step_runs_run_id_fkey FOREIGN KEY (run_id) REFERENCES runs(id);
