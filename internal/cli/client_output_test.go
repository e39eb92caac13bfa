package cli

import (
	"bytes"
	"testing"
	"time"
)

func TestDefinitionName(t *testing.T) {
	for doc, want := range map[string]string{
		`{"name": "a", "tasks": {}}`:           "a",
		"  \n{\"tasks\": {}, \"name\": \"b\"}": "b",
		"name: c\ntasks: {}\n":                 "c",
		"---\nname: \"d\"\n":                   "d",
		`{"name": 5}`:                          "",
		`{"name": `:                            "",
		"- a\n- b\n":                           "",
		"{name: e, tasks: {}}":                 "e",
		"name: [x\n":                           "",
		"":                                     "",
	} {
		if got := definitionName([]byte(doc)); got != want {
			t.Errorf("definitionName(%q) = %q, want %q", doc, got, want)
		}
	}
}

func TestFormatting(t *testing.T) {
	if got := truncate("short", 80); got != "short" {
		t.Errorf("truncate short = %q", got)
	}
	long := "éééééééééé"
	if got := truncate(long, 5); got != "éééé…" {
		t.Errorf("truncate = %q", got)
	}
	if got := truncate("a\nb\tc", 80); got != "a b c" {
		t.Errorf("truncate multi-line = %q", got)
	}
	for d, want := range map[time.Duration]string{
		0:                         "0ms",
		12 * time.Millisecond:     "12ms",
		1534 * time.Millisecond:   "1.53s",
		124600 * time.Millisecond: "2m5s",
	} {
		if got := fmtDuration(d); got != want {
			t.Errorf("fmtDuration(%v) = %q, want %q", d, got, want)
		}
	}
	var buf bytes.Buffer
	tw := newTable(&buf, "A", "B")
	tw.row("x", "")
	tw.row("long value", "two\nlines")
	if err := tw.flush(); err != nil {
		t.Fatal(err)
	}
	want := "A           B\nx           -\nlong value  two lines\n"
	if buf.String() != want {
		t.Errorf("table:\n%q\nwant\n%q", buf.String(), want)
	}
}
