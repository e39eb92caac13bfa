CREATE TABLE tasks (
    id               TEXT PRIMARY KEY,
    type             TEXT NOT NULL,
    payload          TEXT NOT NULL,
    status           TEXT NOT NULL,
    priority         INTEGER NOT NULL DEFAULT 100,
    run_at           INTEGER NOT NULL,
    idempotency_key  TEXT,
    attempt          INTEGER NOT NULL DEFAULT 0,
    max_attempts     INTEGER NOT NULL,
    retry_delay_ms   INTEGER NOT NULL DEFAULT 0,
    leased_by        TEXT NOT NULL DEFAULT '',
    lease_token      TEXT,
    lease_until      INTEGER,
    reclaimed        INTEGER NOT NULL DEFAULT 0,
    cancel_requested INTEGER NOT NULL DEFAULT 0,
    last_error       TEXT NOT NULL DEFAULT '',
    result           TEXT,
    run_id           TEXT,
    step             TEXT NOT NULL DEFAULT '',
    event_seq        INTEGER NOT NULL DEFAULT 0,
    created_at       INTEGER NOT NULL,
    updated_at       INTEGER NOT NULL,
    finished_at      INTEGER
);
CREATE UNIQUE INDEX tasks_idempotency ON tasks(idempotency_key) WHERE idempotency_key IS NOT NULL;
CREATE INDEX tasks_claim ON tasks(status, priority, run_at, created_at);
CREATE INDEX tasks_type ON tasks(type);
CREATE INDEX tasks_run ON tasks(run_id) WHERE run_id IS NOT NULL;

CREATE TABLE task_types (
    type           TEXT PRIMARY KEY,
    description    TEXT NOT NULL DEFAULT '',
    enabled        INTEGER NOT NULL DEFAULT 1,
    max_attempts   INTEGER NOT NULL DEFAULT 0,
    retry_delay_ms INTEGER NOT NULL DEFAULT 0,
    created_at     INTEGER NOT NULL,
    updated_at     INTEGER NOT NULL
);
