package postgres

import (
	"context"
	"database/sql"
	"fmt"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/stdlib"

	"github.com/ferryhq/ferry/internal/store/sqlstore"
)

// pipeline sends qs on conn as one pgx batch: one network write, one round
// trip, the statements run in order; their results are read in order. The
// first error is returned. After a statement the server fails, the rest
// are not run (a transaction the batch began is left aborted, for the
// caller to roll back); a reader's error (client side) stops nothing, the
// batch having been sent. A COMMIT the server answers with ROLLBACK (its
// transaction was aborted before) is an error.
func pipeline(ctx context.Context, conn *sql.Conn, qs []sqlstore.PipeQuery) error {
	if spy, ok := ctx.Value(spyKey{}).(func([]sqlstore.PipeQuery)); ok {
		spy(qs)
	}
	return conn.Raw(func(dc any) error {
		sc, ok := dc.(*stdlib.Conn)
		if !ok {
			return fmt.Errorf("pipeline: connection is a %T, not pgx", dc)
		}
		b := &pgx.Batch{}
		for _, q := range qs {
			b.Queue(q.SQL, q.Args...)
		}
		br := sc.Conn().SendBatch(ctx, b)
		var first error
		for i, q := range qs {
			rows, err := br.Query()
			if err == nil && q.Rows != nil {
				err = q.Rows(rows)
			}
			rows.Close()
			if err == nil {
				err = rows.Err()
			}
			if err == nil && q.Commit && rows.CommandTag().String() == "ROLLBACK" {
				err = pgx.ErrTxCommitRollback
			}
			if err != nil && first == nil {
				first = fmt.Errorf("statement %d of %d: %w", i+1, len(qs), err)
			}
		}
		if err := br.Close(); err != nil && first == nil {
			first = err
		}
		return first
	})
}

// spyKey is the context key under which this package's tests pass a
// function that sees each pipeline before it is sent.
type spyKey struct{}
