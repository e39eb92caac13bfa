CREATE TABLE workflows (
    id          TEXT PRIMARY KEY,
    name        TEXT NOT NULL,
    version     BIGINT NOT NULL,
    enabled     BOOLEAN NOT NULL DEFAULT TRUE,
    deleted_at  BIGINT,
    created_at  BIGINT NOT NULL,
    updated_at  BIGINT NOT NULL
);
CREATE UNIQUE INDEX workflows_live_name ON workflows(name) WHERE deleted_at IS NULL;

CREATE TABLE workflow_versions (
    workflow_id TEXT NOT NULL REFERENCES workflows(id),
    version     BIGINT NOT NULL,
    fingerprint TEXT NOT NULL,
    definition  TEXT NOT NULL,
    created_at  BIGINT NOT NULL,
    PRIMARY KEY (workflow_id, version)
);

CREATE TABLE runs (
    id              TEXT PRIMARY KEY,
    workflow_id     TEXT NOT NULL REFERENCES workflows(id),
    version         BIGINT NOT NULL,
    status          TEXT NOT NULL,
    input           TEXT NOT NULL,
    trigger_headers TEXT NOT NULL,
    idempotency_key TEXT,
    error           TEXT NOT NULL DEFAULT '',
    event_seq       BIGINT NOT NULL DEFAULT 0,
    expires_at      BIGINT NOT NULL,
    started_at      BIGINT NOT NULL,
    finished_at     BIGINT,
    updated_at      BIGINT NOT NULL
);
CREATE INDEX runs_workflow ON runs(workflow_id, id);
CREATE INDEX runs_workflow_status ON runs(workflow_id, status);
CREATE UNIQUE INDEX runs_idempotency ON runs(workflow_id, idempotency_key) WHERE idempotency_key IS NOT NULL;

CREATE TABLE step_runs (
    run_id          TEXT NOT NULL REFERENCES runs(id),
    name            TEXT NOT NULL,
    position        BIGINT NOT NULL,
    type            TEXT NOT NULL,
    status          TEXT NOT NULL,
    attempt         BIGINT NOT NULL DEFAULT 0,
    callback_token  TEXT,
    status_code     BIGINT,
    duration_ms     BIGINT,
    request         TEXT,
    body            BYTEA,
    headers         TEXT,
    is_truncated    BOOLEAN NOT NULL DEFAULT FALSE,
    blocked         BOOLEAN NOT NULL DEFAULT FALSE,
    error           TEXT NOT NULL DEFAULT '',
    wake_at         BIGINT,
    started_at      BIGINT,
    finished_at     BIGINT,
    PRIMARY KEY (run_id, name)
);
CREATE UNIQUE INDEX step_runs_token ON step_runs(callback_token) WHERE callback_token IS NOT NULL;

CREATE TABLE queue (
    id          BIGINT GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    kind        TEXT NOT NULL,
    run_id      TEXT NOT NULL,
    step        TEXT NOT NULL DEFAULT '',
    attempt     BIGINT NOT NULL DEFAULT 0,
    due_at      BIGINT NOT NULL,
    lease_token TEXT,
    lease_until BIGINT
);
CREATE INDEX queue_due ON queue(due_at);
CREATE INDEX queue_run ON queue(run_id);

CREATE TABLE events (
    run_id  TEXT NOT NULL,
    seq     BIGINT NOT NULL,
    type    TEXT NOT NULL,
    step    TEXT NOT NULL DEFAULT '',
    data    TEXT,
    at      BIGINT NOT NULL,
    PRIMARY KEY (run_id, seq)
);

CREATE TABLE api_keys (
    hash       TEXT PRIMARY KEY,
    name       TEXT NOT NULL,
    created_at BIGINT NOT NULL
);
