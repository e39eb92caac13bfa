package postgres

import (
	"strings"
	"testing"

	"github.com/ferryhq/ferry/internal/store/sqlstore"
)

// TestAnalyzeStatementNamesEveryTable: each table the store may refresh
// has its columns here, so a table added to sqlstore.AnalyzeTables
// cannot make the refresh a statement Postgres rejects (it would only
// log a warning, the table's count already moved on).
func TestAnalyzeStatementNamesEveryTable(t *testing.T) {
	for _, table := range sqlstore.AnalyzeTables {
		spec, ok := analyzeColumns[table]
		if !ok || !strings.HasPrefix(spec, table+" (") {
			t.Errorf("table %s: no ANALYZE spec of its columns (have %q)", table, spec)
		}
	}
	q := analyzeStatement(sqlstore.AnalyzeTables[:])
	for _, table := range sqlstore.AnalyzeTables {
		if !strings.Contains(q, analyzeColumns[table]) {
			t.Errorf("%q does not refresh %s", q, table)
		}
	}
}
