package api_test

import (
	"net/url"
	"strings"
	"testing"
)

// A list's cursor is one of its own next_cursors: a run id for a run
// list, a workflow name for the workflow list. A cursor of the other list,
// or a made-up one, is a 400, not read as a position: a workflow name
// given to a run list answered the list's first page again (names sort
// after run ids), and so did a run id given to the workflow list.
func TestListCursorOfAnotherList(t *testing.T) {
	bothDBs(t, func(t *testing.T, s *fsrv) {
		for _, name := range []string{"a", "b"} {
			if r := s.do("POST", "/api/v1/workflows", `{"name":"`+name+`","tasks":{"n":{"sleep":"1h"}}}`); r.status != 201 {
				t.Fatalf("create %s: %d %s", name, r.status, r.raw)
			}
		}
		for range 2 {
			if r := s.do("POST", "/api/v1/workflows/a/trigger", `{}`); r.status != 201 {
				t.Fatalf("trigger: %d %s", r.status, r.raw)
			}
		}
		next := func(path string) string {
			t.Helper()
			r := s.do("GET", path, "")
			c, _ := r.body["next_cursor"].(string)
			if r.status != 200 || c == "" {
				t.Fatalf("GET %s: %d %s, want 200 with a next_cursor", path, r.status, r.raw)
			}
			return c
		}
		runCursor := next("/api/v1/workflows/a/runs?limit=1")
		wfCursor := next("/api/v1/workflows?limit=1")

		// Each list takes its own cursors.
		for _, p := range []string{"/api/v1/workflows/a/runs?limit=1&cursor=" + runCursor, "/api/v1/workflows?limit=1&cursor=" + wfCursor} {
			if r := s.do("GET", p, ""); r.status != 200 || len(r.body["data"].([]any)) != 1 {
				t.Errorf("GET %s: %d %s, want 200 with one item", p, r.status, r.raw)
			}
		}
		for _, c := range []string{wfCursor, "zzz", strings.ToUpper(runCursor), "{" + runCursor + "}"} {
			want4xx(t, "run list with cursor "+c, s.do("GET", "/api/v1/workflows/a/runs?cursor="+url.QueryEscape(c), ""), 400, "invalid_parameter", "cursor")
		}
		for _, c := range []string{runCursor, "a b", "-a"} {
			want4xx(t, "workflow list with cursor "+c, s.do("GET", "/api/v1/workflows?cursor="+url.QueryEscape(c), ""), 400, "invalid_parameter", "cursor")
		}
	})
}
