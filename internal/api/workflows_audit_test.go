package api_test

import (
	"encoding/json"
	"fmt"
	"net/http"
	"strings"
	"sync"
	"testing"
	"unicode/utf8"
)

// TestRunUnderAReusedNameIsNotFound: a run of a deleted workflow is not
// reachable, to read or to cancel, under the name a new workflow took
// since, nor under the new one's id; it still is under its own
// workflow's id. (Found by an audit: the name matched the deleted
// workflow's, and the new workflow's route cancelled the old run.)
func TestRunUnderAReusedNameIsNotFound(t *testing.T) {
	s := startF(t, false, nil)
	r := s.do("POST", "/api/v1/workflows", `{"name": "x", "tasks": {"a": {"sleep": "1h"}}}`)
	if r.status != http.StatusCreated {
		t.Fatalf("create: %d %s", r.status, r.raw)
	}
	oldID := r.data()["id"].(string)
	run := s.do("POST", "/api/v1/workflows/x/trigger", `{}`).data()["run_id"].(string)
	if r := s.do("DELETE", "/api/v1/workflows/x", ""); r.status != http.StatusNoContent {
		t.Fatalf("delete: %d %s", r.status, r.raw)
	}
	newID := s.do("POST", "/api/v1/workflows", `{"name": "x", "tasks": {"b": {"sleep": "1h"}}}`).data()["id"].(string)
	for _, path := range []string{"/api/v1/workflows/x/runs/" + run, "/api/v1/workflows/" + newID + "/runs/" + run} {
		if g := s.do("GET", path, ""); g.status != http.StatusNotFound || g.code() != "not_found" {
			t.Errorf("GET %s: %d %s, want 404 not_found", path, g.status, g.code())
		}
	}
	if c := s.do("POST", "/api/v1/workflows/x/runs/"+run+"/cancel", ""); c.status != http.StatusNotFound {
		t.Errorf("cancel under the new workflow's name: %d, want 404", c.status)
	}
	if g := s.do("GET", "/api/v1/workflows/"+oldID+"/runs/"+run, ""); g.status != http.StatusOK || g.data()["status"] != "running" {
		t.Errorf("under its own workflow's id: %d %v, want 200 and still running", g.status, g.data()["status"])
	}
}

// TestEquivalentUpdateAnswersWhatIsStored: an update whose definition
// means the same as the current one keeps the version and the text first
// submitted, and its answer shows that text, as a read then does.
func TestEquivalentUpdateAnswersWhatIsStored(t *testing.T) {
	s := startF(t, false, nil)
	s.do("POST", "/api/v1/workflows", `{"name": "w", "tasks": {"a": {"sleep": "1h"}, "b": {"url": "https://e.example/x"}}}`)
	p := s.do("PUT", "/api/v1/workflows/w", `{"name": "w", "tasks": {"a": {"sleep": 3600}, "b": {"url": "https://e.example/x", "method": "POST", "retries": 5}}}`)
	g := s.do("GET", "/api/v1/workflows/w", "")
	pt, _ := json.Marshal(p.data()["tasks"])
	gt, _ := json.Marshal(g.data()["tasks"])
	if p.status != http.StatusOK || p.data()["version"] != float64(1) || string(pt) != string(gt) {
		t.Errorf("PUT %d version %v tasks %s; GET tasks %s: want 200, version 1, the same tasks", p.status, p.data()["version"], pt, gt)
	}
}

// TestConcurrentUpdatesAllApply: updates of one workflow sent at once are
// each applied, one version each, and each answer is its own version's.
// (Found by an audit: on Postgres, an update that waited for another's
// lock failed with a 500, and on SQLite answers were read after the
// commit and could show a later update's version.)
func TestConcurrentUpdatesAllApply(t *testing.T) {
	bothDBs(t, func(t *testing.T, s *fsrv) {
		s.do("POST", "/api/v1/workflows", `{"name": "w", "tasks": {"a": {"sleep": "1h"}}}`)
		const n = 8
		var mu sync.Mutex
		seen := map[float64]bool{}
		var wg sync.WaitGroup
		for i := range n {
			wg.Add(1)
			go func() {
				defer wg.Done()
				sleep := fmt.Sprintf("%dh", i+2)
				r := s.do("PUT", "/api/v1/workflows/w", `{"name": "w", "tasks": {"a": {"sleep": "`+sleep+`"}}}`)
				mu.Lock()
				defer mu.Unlock()
				if r.status != http.StatusOK {
					t.Errorf("PUT %d: %d %s", i, r.status, r.raw)
					return
				}
				v := r.data()["version"].(float64)
				if seen[v] {
					t.Errorf("two answers with version %v", v)
				}
				seen[v] = true
				tasks, _ := json.Marshal(r.data()["tasks"])
				if !strings.Contains(string(tasks), sleep) {
					t.Errorf("PUT %d answered version %v with tasks %s, not its own (%s)", i, v, tasks, sleep)
				}
			}()
		}
		wg.Wait()
		if g := s.do("GET", "/api/v1/workflows/w", ""); g.data()["version"] != float64(n+1) {
			t.Errorf("final version %v, want %d", g.data()["version"], n+1)
		}
	})
}

// TestConcurrentDeletesOneWins: of several deletes of one workflow at
// once, one answers 204 and the others 404, as a delete of a workflow
// already deleted does.
func TestConcurrentDeletesOneWins(t *testing.T) {
	bothDBs(t, func(t *testing.T, s *fsrv) {
		for round := range 5 {
			s.do("POST", "/api/v1/workflows", `{"name": "w", "tasks": {"a": {"sleep": "1h"}}}`)
			codes := concurrently(6, func(int, bool) int { return s.do("DELETE", "/api/v1/workflows/w", "").status })
			n := map[int]int{}
			for _, c := range codes {
				n[c]++
			}
			if n[http.StatusNoContent] != 1 || n[http.StatusNotFound] != 5 {
				t.Errorf("round %d: answers %v, want one 204 and five 404", round, n)
			}
		}
	})
}

// TestCallbackBodyNotUTF8IsAnsweredAsUTF8: a callback whose JSON body
// holds bytes that are not UTF-8 inside a string is stored as it came,
// and the run is answered as JSON in UTF-8 (RFC 8259), the bytes replaced
// by U+FFFD as templates read them.
func TestCallbackBodyNotUTF8IsAnsweredAsUTF8(t *testing.T) {
	bothDBs(t, func(t *testing.T, s *fsrv) {
		s.do("POST", "/api/v1/workflows", `{"name": "w", "tasks": {"a": {"wait_for_webhook": {}}, "b": {"wait_for_webhook": {}}}}`)
		run := s.do("POST", "/api/v1/workflows/w/trigger", `{}`).data()["run_id"].(string)
		tasks := s.do("GET", "/api/v1/runs/"+run, "").data()["tasks"].(map[string]any)
		for step, body := range map[string]string{"a": "{\"x\":\"\xff\xfe\"}", "b": "\xff\xfe raw"} {
			cb := tasks[step].(map[string]any)["callback_url"].(string)
			resp, err := http.Post(s.url+cb[strings.Index(cb, "/wh/"):], "application/json", strings.NewReader(body))
			if err != nil {
				t.Fatal(err)
			}
			resp.Body.Close()
			if resp.StatusCode != http.StatusAccepted {
				t.Fatalf("callback %s: %d", step, resp.StatusCode)
			}
		}
		g := s.do("GET", "/api/v1/runs/"+run, "")
		if !utf8.Valid(g.raw) {
			t.Fatalf("the run's answer is not UTF-8: %q", g.raw)
		}
		a := g.data()["tasks"].(map[string]any)["a"].(map[string]any)["body"]
		if x, _ := a.(map[string]any)["x"].(string); x != "\uFFFD" {
			t.Errorf("a's body %v, want the object with its bytes replaced", a)
		}
	})
}
