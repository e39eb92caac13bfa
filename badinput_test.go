package ferry_test

import (
	"context"
	"encoding/json"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/ferryhq/ferry"
	"github.com/ferryhq/ferry/client"
)

// TestGoAPIRefusesWhatTheDatabasesCannotStore: the embedded Go API
// refuses, as the HTTP API does, input that is not UTF-8 and idempotency
// keys that are too long or hold NUL, naming the field, and stores a
// worker's failure message with NUL or stray bytes replaced (U+FFFD), on
// both databases (Postgres refuses NUL in text).
func TestGoAPIRefusesWhatTheDatabasesCannotStore(t *testing.T) {
	for _, db := range []string{"sqlite", "postgres"} {
		t.Run(db, func(t *testing.T) {
			t.Parallel()
			srv := startOn(t, db)
			e, ctx := srv.Engine, context.Background()
			if _, _, err := client.New(srv.URL, srv.Key).ApplyWorkflow(ctx, "w", []byte(`{"name": "w", "tasks": {"a": {"sleep": "1h"}}}`)); err != nil {
				t.Fatal(err)
			}
			refused := func(what, path string, err error) {
				t.Helper()
				var ae *client.APIError
				if !errors.As(err, &ae) || ae.Code != client.CodeInvalidRequest || len(ae.Details) != 1 || ae.Details[0].Path != path {
					t.Errorf("%s: %v, want invalid_request at %s", what, err, path)
				}
			}
			_, err := e.Trigger(ctx, "w", json.RawMessage("{\"a\":\"\xff\"}"), "")
			// As the HTTP API answers a trigger body that is not UTF-8.
			var ae *client.APIError
			if !errors.As(err, &ae) || ae.Code != client.CodeInvalidJSON || len(ae.Details) != 1 || ae.Details[0].Path != "input" {
				t.Errorf("Trigger with input not UTF-8: %v, want invalid_json at input", err)
			}
			_, err = e.Trigger(ctx, "w", nil, strings.Repeat("k", 256))
			refused("Trigger with a 256-byte key", "idempotency_key", err)
			_, err = e.TriggerBatch(ctx, "w", []ferry.TriggerInput{{}, {IdempotencyKey: "a\x00b"}})
			refused("TriggerBatch with NUL in a key", "inputs[1].idempotency_key", err)
			_, _, err = e.CreateTask(ctx, client.NewTask{Type: "bad.v1", Payload: json.RawMessage("{\"a\":\"\xff\"}")})
			refused("CreateTask with a payload not UTF-8", "payload", err)

			if _, _, err := e.CreateTask(ctx, client.NewTask{Type: "nul.v1", MaxAttempts: 1}); err != nil {
				t.Fatal(err)
			}
			got, err := e.ClaimTasks(ctx, client.ClaimRequest{Types: []string{"nul.v1"}, WorkerID: "w", Wait: 10 * time.Second})
			if err != nil || len(got) != 1 {
				t.Fatalf("claim: %v %v", got, err)
			}
			if err := e.CompleteTask(ctx, got[0].ID, got[0].LeaseToken, json.RawMessage("\"\xff\"")); err == nil {
				t.Error("a result that is not UTF-8 was accepted")
			}
			if err := e.FailTask(ctx, got[0].ID, got[0].LeaseToken, "bad\x00byte \xff", false); err != nil {
				t.Fatalf("FailTask with NUL in its message: %v", err)
			}
			tk, err := e.GetTask(ctx, got[0].ID)
			if err != nil || tk.Status != client.TaskFailed || tk.LastError != "bad\uFFFDbyte \uFFFD" {
				t.Errorf("the failed task: %+v %v, want failed with the message's NUL and stray byte replaced", tk, err)
			}
		})
	}
}
