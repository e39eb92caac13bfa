package cli

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/ferryhq/ferry/client"
)

// table writes aligned columns; an empty cell is shown as "-".
type table struct {
	tw *tabwriter.Writer
}

func newTable(out io.Writer, header ...string) *table {
	t := &table{tw: tabwriter.NewWriter(out, 0, 8, 2, ' ', 0)}
	if len(header) > 0 {
		t.row(header...)
	}
	return t
}

func (t *table) row(cells ...string) {
	for i, c := range cells {
		if i > 0 {
			_, _ = io.WriteString(t.tw, "\t")
		}
		c = oneLine(c)
		if c == "" {
			c = "-"
		}
		_, _ = io.WriteString(t.tw, c)
	}
	_, _ = io.WriteString(t.tw, "\n")
}

func (t *table) flush() error { return t.tw.Flush() }

// oneLine keeps a cell on one line and out of tabwriter's column syntax.
func oneLine(s string) string {
	if !strings.ContainsAny(s, "\t\n\r") {
		return s
	}
	return strings.Join(strings.Fields(s), " ")
}

// truncate shortens s to n characters, marking the cut with "…".
func truncate(s string, n int) string {
	s = oneLine(s)
	r := []rune(s)
	if len(r) <= n {
		return s
	}
	return string(r[:n-1]) + "…"
}

// printJSON writes a JSON document indented, keeping its key order.
func printJSON(out io.Writer, raw json.RawMessage) error {
	if len(raw) == 0 {
		raw = json.RawMessage("null")
	}
	var buf bytes.Buffer
	if err := json.Indent(&buf, raw, "", "  "); err != nil {
		return fmt.Errorf("server sent invalid JSON: %w", err)
	}
	buf.WriteByte('\n')
	_, err := out.Write(buf.Bytes())
	return err
}

// printJSONList writes documents as one indented JSON array.
func printJSONList(out io.Writer, raws []json.RawMessage) error {
	if raws == nil {
		raws = []json.RawMessage{}
	}
	b, err := json.Marshal(raws)
	if err != nil {
		return err
	}
	return printJSON(out, b)
}

func fmtTime(t *time.Time) string {
	if t == nil || t.IsZero() {
		return ""
	}
	return t.UTC().Format(time.RFC3339)
}

// fmtDuration rounds a duration for display: 12ms, 1.53s, 2m4s.
func fmtDuration(d time.Duration) string {
	switch {
	case d < time.Second:
		return fmt.Sprintf("%dms", d.Round(time.Millisecond).Milliseconds())
	case d < time.Minute:
		return d.Round(10 * time.Millisecond).String()
	default:
		return d.Round(time.Second).String()
	}
}

// runDuration is how long a finished run took; "" while it runs.
func runDuration(r *client.Run) string {
	if r.FinishedAt == nil {
		return ""
	}
	return fmtDuration(r.FinishedAt.Sub(r.StartedAt))
}
