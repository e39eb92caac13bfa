package worker

import (
	"context"
	"testing"

	"github.com/ferryhq/ferry/client"
)

// BenchmarkHandlerSpan is what a task's span costs the worker while no
// tracer provider is set (OpenTelemetry's global one, keeping nothing):
// the state every worker runs in unless it traces.
func BenchmarkHandlerSpan(b *testing.B) {
	w := New(nil, Config{})
	w.Handle("task", func(context.Context, *Task) (any, error) { return nil, nil })
	ct := client.ClaimedTask{ID: "t", Type: "task"}
	ctx := context.Background()
	b.ReportAllocs()
	for b.Loop() {
		reg := w.handler(ct.Type)
		_, sp := w.span(ctx, reg.span, ct)
		endSpan(sp, "")
	}
}
