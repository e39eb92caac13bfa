package sqlstore

import (
	"context"
	"database/sql"
	"fmt"
	"path/filepath"
	"strings"
	"testing"
)

// TestUpdatePartsRowByRowAndJoined: on SQLite a few rows are updated with
// a statement each and more with UPDATE … FROM (VALUES …); both forms
// write the same values, append to a "+" column, match composite keys
// and leave rows they do not name alone.
func TestUpdatePartsRowByRowAndJoined(t *testing.T) {
	db, err := sql.Open("sqlite", "file:"+filepath.Join(t.TempDir(), "u.db"))
	if err != nil {
		t.Fatal(err)
	}
	s := New(Dialect{Name: "sqlite"}, db, db)
	t.Cleanup(func() { s.Close() })
	ctx := context.Background()
	if _, err := db.Exec(`CREATE TABLE u (k1 TEXT NOT NULL, k2 TEXT NOT NULL, n INTEGER, note TEXT, log TEXT NOT NULL DEFAULT '', PRIMARY KEY (k1, k2))`); err != nil {
		t.Fatal(err)
	}
	const rows = rowByRow + 9 // the joined form too
	for i := range rows + 1 {
		if _, err := db.Exec(`INSERT INTO u (k1, k2, n, note, log) VALUES (?, 'b', 0, 'old', 'x')`, fmt.Sprint("r", i)); err != nil {
			t.Fatal(err)
		}
	}
	// Matches the first key of every update's first row, not the second.
	if _, err := db.Exec(`INSERT INTO u (k1, k2, n, note, log) VALUES ('r0', 'c', 0, 'old', 'x')`); err != nil {
		t.Fatal(err)
	}
	keys, set, types := []string{"k1", "k2"}, []string{"n", "note", "+log"}, []string{cText, cText, cInt, cText, cText}
	for _, n := range []int{1, 3, rowByRow, rows} {
		var in [][]any
		for i := range n {
			note := any(fmt.Sprint("note", n))
			if i%2 == 1 {
				note = nil // NULL is written as NULL
			}
			in = append(in, []any{fmt.Sprint("r", i), "b", n, note, fmt.Sprint(",", n)})
		}
		ps := s.updateParts("u", "", keys, set, types, in)
		joined := n > rowByRow
		if got := len(ps) < n; got != joined {
			t.Fatalf("%d rows: %d statements, want one a row only up to %d", n, len(ps), rowByRow)
		}
		tx, err := db.BeginTx(ctx, nil)
		if err != nil {
			t.Fatal(err)
		}
		if err := s.exec(ctx, tx, &changeset{}, ps); err != nil {
			t.Fatalf("%d rows: %v", n, err)
		}
		if err := tx.Commit(); err != nil {
			t.Fatal(err)
		}
		for i := range n {
			var got int
			var note sql.NullString
			var log string
			if err := db.QueryRow(`SELECT n, note, log FROM u WHERE k1 = ? AND k2 = 'b'`, fmt.Sprint("r", i)).Scan(&got, &note, &log); err != nil {
				t.Fatal(err)
			}
			if got != n || note.Valid != (i%2 == 0) || (note.Valid && note.String != fmt.Sprint("note", n)) || !strings.HasSuffix(log, fmt.Sprint(",", n)) {
				t.Fatalf("%d rows: row %d is n=%d note=%v log=%q", n, i, got, note, log)
			}
		}
	}
	var log string
	if err := db.QueryRow(`SELECT log FROM u WHERE k1 = 'r0' AND k2 = 'b'`).Scan(&log); err != nil {
		t.Fatal(err)
	}
	if want := fmt.Sprintf("x,1,3,%d,%d", rowByRow, rows); log != want {
		t.Fatalf("appended column %q, want %q", log, want)
	}
	for _, k := range [][2]string{{fmt.Sprint("r", rows), "b"}, {"r0", "c"}} {
		var n int
		var log string
		if err := db.QueryRow(`SELECT n, log FROM u WHERE k1 = ? AND k2 = ?`, k[0], k[1]).Scan(&n, &log); err != nil || n != 0 || log != "x" {
			t.Fatalf("row %v, which no update named: n=%d log=%q, %v", k, n, log, err)
		}
	}
}
