package ferry_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/ferryhq/ferry"
	"github.com/ferryhq/ferry/client"
	"github.com/ferryhq/ferry/internal/ferrytest"
	"github.com/ferryhq/ferry/internal/store/postgres/pgtest"
)

func refusal(err error) string {
	var ae *client.APIError
	if errors.As(err, &ae) {
		path := "-"
		if len(ae.Details) > 0 {
			path = ae.Details[0].Path
		}
		return fmt.Sprintf("%d %s path=%s", ae.StatusCode, ae.Code, path)
	}
	if err == nil {
		return "accepted"
	}
	return fmt.Sprintf("%T", err)
}

// TestEmbeddedRefusesAsHTTPDoes: the embedded task and trigger methods
// refuse what the server refuses, with the same *client.APIError status,
// code and details[0].path. Each case calls the engine and the HTTP client
// with the same input. (An audit found each of these different.)
func TestEmbeddedRefusesAsHTTPDoes(t *testing.T) {
	srv := ferrytest.Start(t)
	e, ctx := srv.Engine, context.Background()
	c := client.New(srv.URL, srv.Key)
	if _, _, err := c.ApplyWorkflow(ctx, "w", []byte(`{"name": "w", "tasks": {"a": {"sleep": "1h"}}}`)); err != nil {
		t.Fatal(err)
	}
	big := json.RawMessage(`{"s":"` + strings.Repeat("x", 2<<20) + `"}`)
	deep := json.RawMessage(strings.Repeat("[", 1001) + strings.Repeat("]", 1001))
	claimOne := func(typ string, s interface {
		CreateTask(context.Context, client.NewTask) (*client.Task, bool, error)
		ClaimTasks(context.Context, client.ClaimRequest) ([]client.ClaimedTask, error)
	}) client.ClaimedTask {
		if _, _, err := s.CreateTask(ctx, client.NewTask{Type: typ}); err != nil {
			t.Fatal(err)
		}
		got, err := s.ClaimTasks(ctx, client.ClaimRequest{Types: []string{typ}})
		if err != nil || len(got) != 1 {
			t.Fatal(got, err)
		}
		return got[0]
	}
	cases := []struct {
		name           string
		embedded, http func() error
	}{
		{"CreateTask RetryDelay 1µs",
			func() error {
				_, _, err := e.CreateTask(ctx, client.NewTask{Type: "a.b.v1", RetryDelay: time.Microsecond})
				return err
			},
			func() error {
				_, _, err := c.CreateTask(ctx, client.NewTask{Type: "a.b.v1", RetryDelay: time.Microsecond})
				return err
			}},
		{"CreateTask unversioned type",
			func() error { _, _, err := e.CreateTask(ctx, client.NewTask{Type: "bad"}); return err },
			func() error { _, _, err := c.CreateTask(ctx, client.NewTask{Type: "bad"}); return err }},
		{"CreateTask 2 MiB payload",
			func() error { _, _, err := e.CreateTask(ctx, client.NewTask{Type: "a.b.v1", Payload: big}); return err },
			func() error { _, _, err := c.CreateTask(ctx, client.NewTask{Type: "a.b.v1", Payload: big}); return err }},
		{"CompleteTask 2 MiB result",
			func() error { ct := claimOne("big.e.v1", e); return e.CompleteTask(ctx, ct.ID, ct.LeaseToken, big) },
			func() error { ct := claimOne("big.h.v1", c); return c.CompleteTask(ctx, ct.ID, ct.LeaseToken, big) }},
		{"Trigger 2 MiB input",
			func() error { _, err := e.Trigger(ctx, "w", big, ""); return err },
			func() error { _, _, err := c.Trigger(ctx, "w", big, ""); return err }},
		{"Trigger input not JSON",
			func() error { _, err := e.Trigger(ctx, "w", json.RawMessage(`{`), ""); return err },
			func() error { _, _, err := c.Trigger(ctx, "w", json.RawMessage(`{`), ""); return err }},
		{"Trigger input nested 1,001 levels",
			func() error { _, err := e.Trigger(ctx, "w", deep, ""); return err },
			func() error { _, _, err := c.Trigger(ctx, "w", deep, ""); return err }},
		{"CompleteTaskAndClaim next without types",
			func() error {
				ct := claimOne("n.e.v1", e)
				_, err := e.CompleteTaskAndClaim(ctx, ct.ID, ct.LeaseToken, nil, client.ClaimRequest{})
				return err
			},
			func() error {
				ct := claimOne("n.h.v1", c)
				_, err := c.CompleteTaskAndClaim(ctx, ct.ID, ct.LeaseToken, nil, client.ClaimRequest{})
				return err
			}},
		{"ClaimTasks Max -1",
			func() error {
				_, err := e.ClaimTasks(ctx, client.ClaimRequest{Types: []string{"zz.%"}, Max: -1})
				return err
			},
			func() error {
				_, err := c.ClaimTasks(ctx, client.ClaimRequest{Types: []string{"zz.%"}, Max: -1})
				return err
			}},
		{"ClaimTasks Lease -1s",
			func() error {
				_, err := e.ClaimTasks(ctx, client.ClaimRequest{Types: []string{"zz.%"}, Lease: -time.Second})
				return err
			},
			func() error {
				_, err := c.ClaimTasks(ctx, client.ClaimRequest{Types: []string{"zz.%"}, Lease: -time.Second})
				return err
			}},
		{"Heartbeat lease -1s",
			func() error {
				ct := claimOne("hb.e.v1", e)
				_, err := e.Heartbeat(ctx, ct.ID, ct.LeaseToken, -time.Second)
				return err
			},
			func() error {
				ct := claimOne("hb.h.v1", c)
				_, err := c.Heartbeat(ctx, ct.ID, ct.LeaseToken, -time.Second)
				return err
			}},
	}
	for _, tc := range cases {
		em, ht := refusal(tc.embedded()), refusal(tc.http())
		if strings.HasPrefix(tc.name, "Trigger input n") {
			// The HTTP body is the input (its path ""); the engine's
			// parameter is named.
			ht = strings.Replace(ht, "path=", "path=input", 1)
		}
		if em != ht || ht == "accepted" {
			t.Errorf("%s: embedded %s, HTTP %s; want the same refusal", tc.name, em, ht)
		}
	}
}

// TestEmbeddedUnknownIDOnPostgres: an id that is not UTF-8 text without
// NUL names no task: not_found, as the HTTP API answers, not Postgres's
// encoding error.
func TestEmbeddedUnknownIDOnPostgres(t *testing.T) {
	dsn := pgtest.DSN(t)
	srv := ferrytest.Start(t, func(c *ferry.Config) { c.Database = dsn })
	e, ctx := srv.Engine, context.Background()
	c := client.New(srv.URL, srv.Key)
	for _, id := range []string{"a\x00b", "a\xffb"} {
		_, err := e.GetTask(ctx, id)
		_, herr := c.GetTask(ctx, id)
		if !client.HasCode(err, client.CodeNotFound) {
			t.Errorf("GetTask(%q): embedded %v (%T); HTTP %v", id, err, err, herr)
		}
		if _, err := e.CancelTask(ctx, id); !client.HasCode(err, client.CodeNotFound) {
			t.Errorf("CancelTask(%q): embedded %v", id, err)
		}
		if err := e.CompleteTask(ctx, id, "tok", nil); !client.HasCode(err, client.CodeNotFound) {
			t.Errorf("CompleteTask(%q): embedded %v", id, err)
		}
	}
}

// startOn starts a server on a fresh database of db ("sqlite", or
// "postgres": a schema of its own) with opts, stopped when the test ends.
func startOn(t *testing.T, db string, opts ...func(*ferry.Config)) *ferrytest.Server {
	t.Helper()
	if db == "postgres" {
		dsn := pgtest.DSN(t)
		opts = append(opts, func(c *ferry.Config) { c.Database = dsn })
	}
	return ferrytest.Start(t, opts...)
}

// TestEmbeddedWorkflowRefusalsAsHTTP: ApplyWorkflow, Trigger and
// TriggerBatch refuse as the HTTP API does, with a *client.APIError of
// the same status, code and details[0].path, on both databases. (An
// unknown or disabled workflow was an error wrapping an internal
// sentinel, and an invalid definition an internal type: a caller could
// tell them apart only by their text.)
func TestEmbeddedWorkflowRefusalsAsHTTP(t *testing.T) {
	for _, db := range []string{"sqlite", "postgres"} {
		t.Run(db, func(t *testing.T) {
			t.Parallel()
			srv := startOn(t, db)
			e, ctx := srv.Engine, context.Background()
			c := client.New(srv.URL, srv.Key)
			if _, _, err := e.ApplyWorkflow(ctx, []byte(`{"name": "off", "enabled": false, "tasks": {"a": {"sleep": "1h"}}}`)); err != nil {
				t.Fatal(err)
			}
			badDef := []byte(`{"name": "bad", "tasks": {"a": {"needs": ["b"], "sleep": "1s"}}}`)
			cases := []struct {
				name, want     string
				embedded, http func() error
			}{
				{"Trigger unknown workflow", "404 not_found path=-",
					func() error { _, err := e.Trigger(ctx, "nope", nil, ""); return err },
					func() error { _, _, err := c.Trigger(ctx, "nope", nil, ""); return err }},
				{"Trigger disabled workflow", "409 workflow_disabled path=-",
					func() error { _, err := e.Trigger(ctx, "off", nil, ""); return err },
					func() error { _, _, err := c.Trigger(ctx, "off", nil, ""); return err }},
				{"TriggerBatch unknown workflow", "404 not_found path=-",
					func() error { _, err := e.TriggerBatch(ctx, "nope", []ferry.TriggerInput{{}}); return err },
					func() error { _, err := c.TriggerBatch(ctx, "nope", []client.BatchRun{{}}); return err }},
				{"TriggerBatch disabled workflow", "409 workflow_disabled path=-",
					func() error { _, err := e.TriggerBatch(ctx, "off", []ferry.TriggerInput{{}}); return err },
					func() error { _, err := c.TriggerBatch(ctx, "off", []client.BatchRun{{}}); return err }},
				{"ApplyWorkflow invalid definition", "422 invalid_workflow path=tasks.a.needs[0]",
					func() error { _, _, err := e.ApplyWorkflow(ctx, badDef); return err },
					func() error { _, _, err := c.ApplyWorkflow(ctx, "bad", badDef); return err }},
				{"ApplyWorkflow not JSON or YAML", "400 invalid_json path=",
					func() error { _, _, err := e.ApplyWorkflow(ctx, []byte(`{"name": `)); return err },
					func() error { _, _, err := c.ApplyWorkflow(ctx, "x", []byte(`{"name": `)); return err }},
			}
			for _, tc := range cases {
				em, ht := refusal(tc.embedded()), refusal(tc.http())
				if em != ht || ht != tc.want {
					t.Errorf("%s: embedded %s, HTTP %s; want both %s", tc.name, em, ht, tc.want)
				}
			}
			deep := json.RawMessage(strings.Repeat("[", 1001) + strings.Repeat("]", 1001))
			if _, err := e.TriggerBatch(ctx, "off", []ferry.TriggerInput{{}, {Input: deep}}); refusal(err) != "400 invalid_json path=inputs[1].input" {
				t.Errorf("TriggerBatch with an input nested 1,001 levels: %s (%v), want 400 invalid_json path=inputs[1].input", refusal(err), err)
			}
			_, err := e.TriggerBatch(ctx, "off", make([]ferry.TriggerInput, ferry.MaxTriggerBatch+1))
			if got := refusal(err); got != "400 invalid_request path=inputs" {
				t.Errorf("TriggerBatch of %d inputs: %s (%v), want 400 invalid_request path=inputs", ferry.MaxTriggerBatch+1, got, err)
			}
		})
	}
}
