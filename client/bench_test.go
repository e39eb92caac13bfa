package client_test

import (
	"context"
	"encoding/json"
	"sync"
	"testing"
	"time"

	"github.com/ferryhq/ferry/client"
	"github.com/ferryhq/ferry/internal/ferrytest"
)

// BenchmarkCompleteOverHTTP reports tasks to a real server (SQLite) over
// loopback, one request a task and 100 a request: the time a task, the
// request and the report batch's commit included.
func BenchmarkCompleteOverHTTP(b *testing.B) {
	for _, batch := range []int{1, 100} {
		name := map[int]string{1: "one-a-request", 100: "100-a-request"}[batch]
		b.Run(name, func(b *testing.B) {
			srv := ferrytest.Start(b)
			c := client.New(srv.URL, srv.Key)
			ctx := context.Background()
			var claimed []client.ClaimedTask
			// Created from 32 goroutines: the server writes them in shared
			// transactions, so that large b.N do not take minutes.
			var wg sync.WaitGroup
			next := make(chan struct{})
			for range 32 {
				wg.Add(1)
				go func() {
					defer wg.Done()
					for range next {
						if _, _, err := c.CreateTask(ctx, client.NewTask{Type: "bench.v1"}); err != nil {
							b.Error(err)
						}
					}
				}()
			}
			for range b.N {
				next <- struct{}{}
			}
			close(next)
			wg.Wait()
			if b.Failed() {
				b.FailNow()
			}
			for len(claimed) < b.N {
				got, err := c.ClaimTasks(ctx, client.ClaimRequest{Types: []string{"bench.v1"}, WorkerID: "b", Lease: time.Hour, Max: 100})
				if err != nil {
					b.Fatal(err)
				}
				if len(got) == 0 {
					b.Fatalf("claimed %d of %d tasks", len(claimed), b.N)
				}
				claimed = append(claimed, got...)
			}
			result := json.RawMessage(`{"ok":true}`)
			b.ResetTimer()
			for lo := 0; lo < len(claimed); lo += batch {
				hi := min(lo+batch, len(claimed))
				if batch == 1 {
					if err := c.CompleteTask(ctx, claimed[lo].ID, claimed[lo].LeaseToken, result); err != nil {
						b.Fatal(err)
					}
					continue
				}
				cs := make([]client.Completion, 0, hi-lo)
				for _, t := range claimed[lo:hi] {
					cs = append(cs, client.Completion{ID: t.ID, LeaseToken: t.LeaseToken, Result: result})
				}
				res, err := c.CompleteTasks(ctx, cs, nil)
				if err != nil {
					b.Fatal(err)
				}
				for _, r := range res {
					if r.Err != nil {
						b.Fatal(r.Err)
					}
				}
			}
		})
	}
}
