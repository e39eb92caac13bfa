// Command testworker is a worker process for the end-to-end tests: it pulls
// tasks from a Ferry server with package worker and either completes them
// at once (--mode noop) or holds them until it is killed (--mode hang).
// Every task it starts handling is appended to --out as one line holding the
// task id, synced to disk before the handler goes on, so a test can count
// executions even across a SIGKILL.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"time"

	"github.com/ferryhq/ferry/client"
	"github.com/ferryhq/ferry/worker"
)

func main() {
	if err := run(); err != nil {
		fmt.Fprintln(os.Stderr, "testworker:", err)
		os.Exit(1)
	}
}

func run() error {
	server := flag.String("server", "http://127.0.0.1:8080", "Ferry server base URL")
	apiKey := flag.String("api-key", "", "API key (default $FERRY_API_KEY)")
	types := flag.String("types", "", "comma-separated exact task types to handle")
	concurrency := flag.Int("concurrency", 1, "tasks handled at once")
	lease := flag.Duration("lease", 30*time.Second, "lease per claim")
	mode := flag.String("mode", "noop", "noop: complete at once; hang: hold the task until killed")
	out := flag.String("out", "", "file to append one line per handled task id to")
	id := flag.String("worker-id", "", "worker id (default hostname-pid)")
	flag.Parse()
	if *apiKey == "" {
		*apiKey = os.Getenv("FERRY_API_KEY")
	}
	if *types == "" {
		return errors.New("--types is required")
	}
	if *mode != "noop" && *mode != "hang" {
		return fmt.Errorf("--mode %q: use noop or hang", *mode)
	}
	log := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelInfo}))

	var rec *recorder
	if *out != "" {
		f, err := os.OpenFile(*out, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
		if err != nil {
			return err
		}
		defer f.Close()
		rec = newRecorder(f)
	}

	w := worker.New(client.New(*server, *apiKey), worker.Config{
		Concurrency: *concurrency, Lease: *lease, WorkerID: *id, Logger: log,
	})
	handler := func(ctx context.Context, t *worker.Task) (any, error) {
		if rec != nil {
			if err := rec.record(t.ID); err != nil {
				return nil, fmt.Errorf("record execution: %w", err)
			}
		}
		if *mode == "hang" {
			<-ctx.Done()
			return nil, context.Cause(ctx)
		}
		return map[string]any{"ok": true, "worker": w.ID()}, nil
	}
	for _, typ := range strings.Split(*types, ",") {
		w.Handle(strings.TrimSpace(typ), handler)
	}

	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	log.Info("testworker ready", "server", *server, "types", *types, "mode", *mode)
	return w.Run(ctx)
}

// recorder appends lines to a file, syncing each batch of concurrent
// writers once (group commit) before any of them goes on.
type recorder struct {
	reqs chan recordReq
}

type recordReq struct {
	line string
	done chan error
}

func newRecorder(f *os.File) *recorder {
	r := &recorder{reqs: make(chan recordReq, 256)}
	go func() {
		for req := range r.reqs {
			batch := []recordReq{req}
		drain:
			for {
				select {
				case more := <-r.reqs:
					batch = append(batch, more)
				default:
					break drain
				}
			}
			var b strings.Builder
			for _, q := range batch {
				b.WriteString(q.line)
				b.WriteByte('\n')
			}
			_, err := f.WriteString(b.String())
			if err == nil {
				err = f.Sync()
			}
			for _, q := range batch {
				q.done <- err
			}
		}
	}()
	return r
}

func (r *recorder) record(id string) error {
	done := make(chan error, 1)
	r.reqs <- recordReq{line: id, done: done}
	return <-done
}
