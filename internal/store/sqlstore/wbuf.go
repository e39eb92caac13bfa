package sqlstore

import (
	"context"
	"database/sql"
	"errors"
	"strconv"
	"strings"
)

// errDeferred: a buffered write has not run yet, so no row count is known.
var errDeferred = errors.New("write deferred to the end of the transaction")

// wbuf holds a transaction's writes until the transaction's work is done.
// On Postgres they then go out in one round trip: several statements in one
// simple-protocol message, their parameters interpolated and quoted by pgx.
// A completion used to cost a round trip per statement, and round trips, not
// statements, were what a step cost on two cores. On SQLite, where a
// statement costs no round trip, each write runs at once.
//
// Reads see buffered writes only after flush, so a transaction flushes
// before any query and before any write whose row count it checks.
type wbuf struct {
	s    *Store
	tx   *sql.Tx
	sb   strings.Builder
	args []any
}

func (s *Store) newWbuf(tx *sql.Tx) *wbuf { return &wbuf{s: s, tx: tx} }

// ExecContext runs q now (SQLite) or appends it to the buffer (Postgres). q
// is already in the dialect's placeholder form.
func (b *wbuf) ExecContext(ctx context.Context, q string, args ...any) (sql.Result, error) {
	if b.s.d.Pipeline == nil {
		return b.tx.ExecContext(ctx, q, args...)
	}
	if b.sb.Len() > 0 {
		b.sb.WriteString(";\n")
	}
	shiftPlaceholders(&b.sb, q, len(b.args))
	b.args = append(b.args, args...)
	return deferredResult{}, nil
}

// flush sends what is buffered.
func (b *wbuf) flush(ctx context.Context) error {
	if b.sb.Len() == 0 {
		return nil
	}
	q := b.sb.String()
	args := append([]any{b.s.d.Pipeline}, b.args...)
	b.sb.Reset()
	b.args = b.args[:0]
	_, err := b.tx.ExecContext(ctx, q, args...)
	return err
}

type deferredResult struct{}

func (deferredResult) LastInsertId() (int64, error) { return 0, errDeferred }
func (deferredResult) RowsAffected() (int64, error) { return 0, errDeferred }

// shiftPlaceholders writes q with each $n renumbered to $(n+by), so that
// statements can share one parameter list. Queries never hold a literal $.
func shiftPlaceholders(sb *strings.Builder, q string, by int) {
	if by == 0 {
		sb.WriteString(q)
		return
	}
	for i := 0; i < len(q); i++ {
		if q[i] != '$' {
			sb.WriteByte(q[i])
			continue
		}
		j := i + 1
		for j < len(q) && q[j] >= '0' && q[j] <= '9' {
			j++
		}
		n, err := strconv.Atoi(q[i+1 : j])
		if err != nil {
			sb.WriteByte('$')
			continue
		}
		sb.WriteByte('$')
		sb.WriteString(strconv.Itoa(n + by))
		i = j - 1
	}
}
