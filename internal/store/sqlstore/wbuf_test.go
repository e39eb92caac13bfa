package sqlstore

import (
	"strings"
	"testing"
)

func TestShiftPlaceholders(t *testing.T) {
	for _, c := range []struct {
		q    string
		by   int
		want string
	}{
		{`UPDATE t SET a = $1, b = $2 WHERE id = $3`, 0, `UPDATE t SET a = $1, b = $2 WHERE id = $3`},
		{`UPDATE t SET a = $1, b = $2 WHERE id = $3`, 7, `UPDATE t SET a = $8, b = $9 WHERE id = $10`},
		{`INSERT INTO e VALUES ($9, $10), ($11, $12)`, 91, `INSERT INTO e VALUES ($100, $101), ($102, $103)`},
		{`SELECT 1`, 3, `SELECT 1`},
	} {
		var sb strings.Builder
		shiftPlaceholders(&sb, c.q, c.by)
		if sb.String() != c.want {
			t.Errorf("shift(%q, %d) = %q, want %q", c.q, c.by, sb.String(), c.want)
		}
	}
}
