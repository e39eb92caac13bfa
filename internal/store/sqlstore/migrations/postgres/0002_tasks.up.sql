CREATE TABLE tasks (
    id               TEXT PRIMARY KEY,
    type             TEXT NOT NULL,
    payload          TEXT NOT NULL,
    status           TEXT NOT NULL,
    priority         BIGINT NOT NULL DEFAULT 100,
    run_at           BIGINT NOT NULL,
    idempotency_key  TEXT,
    attempt          BIGINT NOT NULL DEFAULT 0,
    max_attempts     BIGINT NOT NULL,
    retry_delay_ms   BIGINT NOT NULL DEFAULT 0,
    leased_by        TEXT NOT NULL DEFAULT '',
    lease_token      TEXT,
    lease_until      BIGINT,
    reclaimed        BOOLEAN NOT NULL DEFAULT FALSE,
    cancel_requested BOOLEAN NOT NULL DEFAULT FALSE,
    last_error       TEXT NOT NULL DEFAULT '',
    result           TEXT,
    run_id           TEXT,
    step             TEXT NOT NULL DEFAULT '',
    event_seq        BIGINT NOT NULL DEFAULT 0,
    created_at       BIGINT NOT NULL,
    updated_at       BIGINT NOT NULL,
    finished_at      BIGINT
);
CREATE UNIQUE INDEX tasks_idempotency ON tasks(idempotency_key) WHERE idempotency_key IS NOT NULL;
CREATE INDEX tasks_claim ON tasks(status, priority, run_at, created_at);
CREATE INDEX tasks_type ON tasks(type text_pattern_ops);
CREATE INDEX tasks_run ON tasks(run_id) WHERE run_id IS NOT NULL;

CREATE TABLE task_types (
    type           TEXT PRIMARY KEY,
    description    TEXT NOT NULL DEFAULT '',
    enabled        BOOLEAN NOT NULL DEFAULT TRUE,
    max_attempts   BIGINT NOT NULL DEFAULT 0,
    retry_delay_ms BIGINT NOT NULL DEFAULT 0,
    created_at     BIGINT NOT NULL,
    updated_at     BIGINT NOT NULL
);
