DROP TABLE task_types;
DROP TABLE tasks;
