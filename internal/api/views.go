package api

import (
	"bytes"
	"encoding/json"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/ferryhq/ferry/internal/runtime"
	"github.com/ferryhq/ferry/internal/spec"
	"github.com/ferryhq/ferry/internal/store"
)

// ordered is a JSON object that keeps insertion order, so tasks appear in
// the order they were defined.
type ordered struct {
	keys []string
	vals map[string]any
}

func (o *ordered) set(k string, v any) {
	if o.vals == nil {
		o.vals = map[string]any{}
	}
	if _, ok := o.vals[k]; !ok {
		o.keys = append(o.keys, k)
	}
	o.vals[k] = v
}

func (o *ordered) MarshalJSON() ([]byte, error) {
	if b, ok := appendJSON(nil, o, true); ok {
		return b, nil
	}
	var buf bytes.Buffer
	buf.WriteByte('{')
	for i, k := range o.keys {
		if i > 0 {
			buf.WriteByte(',')
		}
		kb, _ := json.Marshal(k)
		buf.Write(kb)
		buf.WriteByte(':')
		vb, err := json.Marshal(o.vals[k])
		if err != nil {
			return nil, err
		}
		buf.Write(vb)
	}
	buf.WriteByte('}')
	return buf.Bytes(), nil
}

func utc(t *time.Time) any {
	if t == nil {
		return nil
	}
	return t.UTC()
}

// workflowJSON renders a workflow. The full view includes the tasks exactly as
// submitted.
func workflowJSON(wf *store.Workflow, def *spec.Workflow, full bool) any {
	o := &ordered{}
	o.set("id", wf.ID)
	o.set("name", wf.Name)
	if def.Description != "" {
		o.set("description", def.Description)
	}
	o.set("trigger", def.Trigger)
	o.set("version", wf.Version)
	o.set("fingerprint", wf.Fingerprint)
	o.set("task_count", len(def.Steps))
	o.set("enabled", wf.Enabled)
	o.set("max_duration", spec.FormatDuration(def.MaxDuration))
	o.set("inserted_at", wf.CreatedAt.UTC())
	o.set("updated_at", wf.UpdatedAt.UTC())
	if full {
		var src struct {
			Tasks json.RawMessage `json:"tasks"`
		}
		_ = json.Unmarshal(def.Source, &src)
		o.set("tasks", src.Tasks)
	}
	return o
}

// runJSON renders a run; with steps, the per-task results in definition
// order.
func runJSON(run *store.Run, steps []*store.StepRun, rt *runtime.Runtime) any {
	o := &ordered{}
	o.set("id", run.ID)
	o.set("workflow_id", run.WorkflowID)
	o.set("workflow", run.WorkflowName)
	o.set("version", run.Version)
	o.set("status", run.Status)
	if run.Error != "" {
		o.set("error", run.Error)
	}
	o.set("started_at", run.StartedAt.UTC())
	o.set("finished_at", utc(run.FinishedAt))
	o.set("expires_at", run.ExpiresAt.UTC())
	if steps == nil {
		return o
	}
	if nestsTooDeep(run.Input) {
		// Started before MaxJSONNesting: answered as its text, not as no
		// answer at all.
		o.set("input", string(run.Input))
	} else {
		o.set("input", run.Input)
	}
	tasks := &ordered{}
	for _, s := range steps {
		t := &ordered{}
		t.set("type", s.Type)
		t.set("status", s.Status)
		t.set("status_code", s.StatusCode)
		t.set("duration_ms", s.DurationMS)
		t.set("attempt", s.Attempt)
		t.set("started_at", utc(s.StartedAt))
		t.set("finished_at", utc(s.FinishedAt))
		if s.Error != "" {
			t.set("error", s.Error)
		}
		if s.WakeAt != nil {
			t.set("wake_at", s.WakeAt.UTC())
		}
		if s.Type == "task" && len(s.Request) > 0 {
			var ref struct {
				TaskID string `json:"task_id"`
			}
			if json.Unmarshal(s.Request, &ref) == nil && ref.TaskID != "" {
				t.set("task_id", ref.TaskID)
			}
		}
		if s.CallbackToken != "" {
			t.set("callback_url", rt.CallbackURL(s.CallbackToken))
		}
		if s.Body != nil {
			// A payload nested deeper than MaxJSONNesting is answered as
			// its text, as one that is not JSON is.
			if json.Valid(s.Body) && !s.Truncated && !nestsTooDeep(s.Body) {
				// Bytes that are not UTF-8 can only be inside its strings
				// (json.Valid lets them through): replaced there, as a
				// template reads them, the answer stays JSON (RFC 8259).
				body := s.Body
				if !utf8.Valid(body) {
					body = []byte(strings.ToValidUTF8(string(body), "\uFFFD"))
				}
				t.set("body", json.RawMessage(body))
			} else {
				t.set("body", string(s.Body))
			}
			t.set("is_truncated", s.Truncated)
		}
		if len(s.Headers) > 0 {
			t.set("headers", s.Headers)
		}
		tasks.set(s.Name, t)
	}
	o.set("tasks", tasks)
	return o
}
