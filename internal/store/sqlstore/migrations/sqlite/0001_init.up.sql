CREATE TABLE workflows (
    id          TEXT PRIMARY KEY,
    name        TEXT NOT NULL,
    version     INTEGER NOT NULL,
    enabled     INTEGER NOT NULL DEFAULT 1,
    deleted_at  INTEGER,
    created_at  INTEGER NOT NULL,
    updated_at  INTEGER NOT NULL
);
CREATE UNIQUE INDEX workflows_live_name ON workflows(name) WHERE deleted_at IS NULL;

CREATE TABLE workflow_versions (
    workflow_id TEXT NOT NULL REFERENCES workflows(id),
    version     INTEGER NOT NULL,
    fingerprint TEXT NOT NULL,
    definition  TEXT NOT NULL,
    created_at  INTEGER NOT NULL,
    PRIMARY KEY (workflow_id, version)
);

CREATE TABLE runs (
    id              TEXT PRIMARY KEY,
    workflow_id     TEXT NOT NULL REFERENCES workflows(id),
    version         INTEGER NOT NULL,
    status          TEXT NOT NULL,
    input           TEXT NOT NULL,
    trigger_headers TEXT NOT NULL,
    idempotency_key TEXT,
    error           TEXT NOT NULL DEFAULT '',
    event_seq       INTEGER NOT NULL DEFAULT 0,
    expires_at      INTEGER NOT NULL,
    started_at      INTEGER NOT NULL,
    finished_at     INTEGER,
    updated_at      INTEGER NOT NULL
);
CREATE INDEX runs_workflow ON runs(workflow_id, id);
CREATE INDEX runs_workflow_status ON runs(workflow_id, status);
CREATE UNIQUE INDEX runs_idempotency ON runs(workflow_id, idempotency_key) WHERE idempotency_key IS NOT NULL;

CREATE TABLE step_runs (
    run_id          TEXT NOT NULL REFERENCES runs(id),
    name            TEXT NOT NULL,
    position        INTEGER NOT NULL,
    type            TEXT NOT NULL,
    status          TEXT NOT NULL,
    attempt         INTEGER NOT NULL DEFAULT 0,
    callback_token  TEXT,
    status_code     INTEGER,
    duration_ms     INTEGER,
    request         TEXT,
    body            BLOB,
    headers         TEXT,
    is_truncated    INTEGER NOT NULL DEFAULT 0,
    blocked         INTEGER NOT NULL DEFAULT 0,
    error           TEXT NOT NULL DEFAULT '',
    wake_at         INTEGER,
    started_at      INTEGER,
    finished_at     INTEGER,
    PRIMARY KEY (run_id, name)
);
CREATE UNIQUE INDEX step_runs_token ON step_runs(callback_token) WHERE callback_token IS NOT NULL;

CREATE TABLE queue (
    id          INTEGER PRIMARY KEY AUTOINCREMENT,
    kind        TEXT NOT NULL,
    run_id      TEXT NOT NULL,
    step        TEXT NOT NULL DEFAULT '',
    attempt     INTEGER NOT NULL DEFAULT 0,
    due_at      INTEGER NOT NULL,
    lease_token TEXT,
    lease_until INTEGER
);
CREATE INDEX queue_due ON queue(due_at);
CREATE INDEX queue_run ON queue(run_id);

CREATE TABLE events (
    run_id  TEXT NOT NULL,
    seq     INTEGER NOT NULL,
    type    TEXT NOT NULL,
    step    TEXT NOT NULL DEFAULT '',
    data    TEXT,
    at      INTEGER NOT NULL,
    PRIMARY KEY (run_id, seq)
);

CREATE TABLE api_keys (
    hash       TEXT PRIMARY KEY,
    name       TEXT NOT NULL,
    created_at INTEGER NOT NULL
);
