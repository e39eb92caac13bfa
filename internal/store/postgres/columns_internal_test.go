package postgres

import (
	"bytes"
	"context"
	"database/sql"
	"fmt"
	"math"
	"reflect"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgproto3"
	"github.com/jackc/pgx/v5/pgtype"

	"github.com/ferryhq/ferry/internal/store/postgres/pgtest"
)

// TestColumnArraysRoundTrip: columns the store writes as []any arrays,
// encoded by columnCodec, reach Postgres as the values they hold: NULLs
// where the elements are nil, empty strings and bytes as empty (not
// NULL), the extremes of bigint, bytes that are not UTF-8; an empty
// column is an empty array and a nil one is NULL.
func TestColumnArraysRoundTrip(t *testing.T) {
	ctx := t.Context()
	conn := codecConn(t)
	tt, ok := conn.TypeMap().TypeForOID(pgtype.TextArrayOID)
	if !ok {
		t.Fatal("text[] not registered")
	}
	if _, ok := tt.Codec.(*columnCodec); !ok {
		t.Fatalf("text[] codec is %T, want the column codec", tt.Codec)
	}
	texts := []any{"a", nil, "", `quote " and \ backslash`, "ünïcødé", strings.Repeat("x", 5000)}
	ints := []any{int64(math.MinInt64), nil, 0, int64(math.MaxInt64), int32(-7), int(42)}
	bytes := []any{[]byte{0xff, 0x00, 0x80}, nil, []byte{}, "as text", []byte("b"), nil}
	bools := []any{true, nil, false, true, false, nil}
	rows, err := conn.Query(ctx, `SELECT t, i, b, o FROM unnest(CAST($1 AS TEXT[]), CAST($2 AS BIGINT[]), CAST($3 AS BYTEA[]), CAST($4 AS BOOLEAN[])) AS v(t, i, b, o)`, texts, ints, bytes, bools)
	if err != nil {
		t.Fatal(err)
	}
	var got [][4]any
	for rows.Next() {
		var tx sql.NullString
		var i sql.NullInt64
		var b []byte
		var o sql.NullBool
		if err := rows.Scan(&tx, &i, &b, &o); err != nil {
			t.Fatal(err)
		}
		got = append(got, [4]any{tx, i, b, o})
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	want := [][4]any{
		{sql.NullString{String: "a", Valid: true}, sql.NullInt64{Int64: math.MinInt64, Valid: true}, []byte{0xff, 0x00, 0x80}, sql.NullBool{Bool: true, Valid: true}},
		{sql.NullString{}, sql.NullInt64{}, []byte(nil), sql.NullBool{}},
		{sql.NullString{String: "", Valid: true}, sql.NullInt64{Int64: 0, Valid: true}, []byte{}, sql.NullBool{Bool: false, Valid: true}},
		{sql.NullString{String: `quote " and \ backslash`, Valid: true}, sql.NullInt64{Int64: math.MaxInt64, Valid: true}, []byte("as text"), sql.NullBool{Bool: true, Valid: true}},
		{sql.NullString{String: "ünïcødé", Valid: true}, sql.NullInt64{Int64: -7, Valid: true}, []byte("b"), sql.NullBool{Bool: false, Valid: true}},
		{sql.NullString{String: strings.Repeat("x", 5000), Valid: true}, sql.NullInt64{Int64: 42, Valid: true}, []byte(nil), sql.NullBool{}},
	}
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("round trip:\n got %v\nwant %v", got, want)
	}

	var n sql.NullInt64
	var isNull bool
	if err := conn.QueryRow(ctx, `SELECT cardinality(CAST($1 AS TEXT[])), CAST($2 AS BIGINT[]) IS NULL`, []any{}, []any(nil)).Scan(&n, &isNull); err != nil {
		t.Fatal(err)
	}
	if !n.Valid || n.Int64 != 0 || !isNull {
		t.Fatalf("empty column has %v elements (want 0), nil column NULL = %v (want true)", n, isNull)
	}
}

// TestColumnArraysOtherTypesFallBack: an element of a type the column
// codec does not write makes it fail, and pgx then sends the column in
// text format through its own codec, as it did before: the value still
// arrives as what it says.
func TestColumnArraysOtherTypesFallBack(t *testing.T) {
	conn := codecConn(t)
	if _, err := columnPlan(pgtype.Int8OID).Encode([]any{int64(1), "2"}, nil); err == nil || !strings.Contains(err.Error(), "string in a bigint column") {
		t.Fatalf("encode error %v, want one naming the string", err)
	}
	var got []int64
	if err := conn.QueryRow(t.Context(), `SELECT CAST($1 AS BIGINT[])`, []any{int64(1), "2"}).Scan(&got); err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(got, []int64{1, 2}) {
		t.Fatalf("got %v, want [1 2]", got)
	}
}

// codecConn is a connection with the column codecs registered, as the
// store's connections have them.
func codecConn(t *testing.T) *pgx.Conn {
	t.Helper()
	cfg, err := pgx.ParseConfig(pgtest.DSN(t))
	if err != nil {
		t.Fatal(err)
	}
	conn, err := pgx.ConnectConfig(t.Context(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close(context.Background()) })
	if err := registerColumnCodecs(t.Context(), conn); err != nil {
		t.Fatal(err)
	}
	return conn
}

// BenchmarkColumnEncode: a report batch's task columns (8 rows) as pgx
// encodes an []any array by itself and as the column codec does.
func BenchmarkColumnEncode(b *testing.B) {
	var cols [][]any
	var oids []uint32
	for j := 0; j < 24; j++ {
		col := make([]any, 8)
		oid := uint32(pgtype.TextArrayOID)
		for i := range col {
			switch j % 4 {
			case 0:
				col[i] = "01a21066-a3dd-745d-a9b5-753df258bd65"
			case 1:
				col[i], oid = int64(1795571491805086), pgtype.Int8ArrayOID
			case 2:
				col[i] = nil
			case 3:
				col[i], oid = i%2 == 0, pgtype.BoolArrayOID
			}
		}
		cols, oids = append(cols, col), append(oids, oid)
	}
	for _, c := range []struct {
		name  string
		setup func(*pgtype.Map) error
	}{
		{"pgx", func(*pgtype.Map) error { return nil }},
		{"column", func(m *pgtype.Map) error { return registerColumns(m, nil) }},
	} {
		b.Run(c.name, func(b *testing.B) {
			m := pgtype.NewMap()
			if err := c.setup(m); err != nil {
				b.Fatal(err)
			}
			var buf []byte
			b.ReportAllocs()
			for b.Loop() {
				buf = buf[:0]
				for j, col := range cols {
					var err error
					if buf, err = m.Encode(oids[j], pgtype.BinaryFormatCode, col, buf); err != nil {
						b.Fatal(err)
					}
				}
			}
		})
	}
}

// TestSizedColumnsRoundTrip: a statement whose first column sizeParams
// marked reaches Postgres as the same values, and a sized column the
// column codec cannot write in binary (a string in a bigint column) falls
// back to pgx's text encoding as an unsized one does.
func TestSizedColumnsRoundTrip(t *testing.T) {
	conn := codecConn(t)
	ids, ns := make([]any, 300), make([]any, 300)
	for i := range ids {
		ids[i], ns[i] = strings.Repeat("i", i%40), int64(i)
	}
	ns[7] = nil
	args := sizeParams([]any{ids, ns})
	if _, ok := args[0].(sizedColumn); !ok {
		t.Fatalf("first argument is %T, want a sized column", args[0])
	}
	rows, err := conn.Query(t.Context(), `SELECT t, n FROM unnest(CAST($1 AS TEXT[]), CAST($2 AS BIGINT[])) AS v(t, n)`, args...)
	if err != nil {
		t.Fatal(err)
	}
	i := 0
	for rows.Next() {
		var s string
		var n sql.NullInt64
		if err := rows.Scan(&s, &n); err != nil {
			t.Fatal(err)
		}
		want := sql.NullInt64{Int64: int64(i), Valid: true}
		if i == 7 {
			want = sql.NullInt64{}
		}
		if s != ids[i] || n != want {
			t.Fatalf("row %d: %q %v, want %q %v", i, s, n, ids[i], want)
		}
		i++
	}
	if err := rows.Err(); err != nil || i != len(ids) {
		t.Fatalf("%d rows, err %v; want %d", i, err, len(ids))
	}

	mixed := make([]any, 2000)
	for i := range mixed {
		mixed[i] = int64(i)
	}
	mixed[1] = "1"
	args = sizeParams([]any{mixed})
	if _, ok := args[0].(sizedColumn); !ok {
		t.Fatalf("argument is %T, want a sized column", args[0])
	}
	var sum int64
	if err := conn.QueryRow(t.Context(), `SELECT sum(x) FROM unnest(CAST($1 AS BIGINT[])) AS v(x)`, args...).Scan(&sum); err != nil {
		t.Fatal(err)
	}
	if sum != 1999*2000/2 {
		t.Fatalf("sum %d, want %d", sum, 1999*2000/2)
	}
}

// TestSizeParamsLeavesSmallStatements: statements under minSized, or
// without a column, go as they are, and the caller's slice is not
// changed when one is sized.
func TestSizeParamsLeavesSmallStatements(t *testing.T) {
	small := []any{[]any{"a", int64(1)}, "x"}
	if got := sizeParams(small); !reflect.DeepEqual(got, small) {
		t.Fatalf("small statement changed: %v", got)
	}
	scalars := []any{strings.Repeat("x", 10000), int64(1)}
	if got := sizeParams(scalars); !reflect.DeepEqual(got, scalars) {
		t.Fatalf("statement without a column changed: %v", got)
	}
	col := []any{strings.Repeat("y", 5000)}
	big := []any{int64(3), col, []any{true}}
	got := sizeParams(big)
	if _, ok := big[1].([]any); !ok {
		t.Fatalf("caller's arguments changed: %T", big[1])
	}
	sc, ok := got[1].(sizedColumn)
	if !ok || got[0] != int64(3) {
		t.Fatalf("got %v, want the first column sized", got)
	}
	if sc.size < 5000+4+1+4 {
		t.Fatalf("size %d is less than the columns' bytes", sc.size)
	}
}

// TestSizedColumnGrowsOnce: encoding a sized statement's parameters into
// pgx's shrunk buffer grows it once, at its first column, to room for the
// whole statement: the later columns are written into the same array.
// The same columns unsized regrow it as they go.
func TestSizedColumnGrowsOnce(t *testing.T) {
	m := pgtype.NewMap()
	if err := registerColumns(m, nil); err != nil {
		t.Fatal(err)
	}
	var args []any
	for j := 0; j < 6; j++ {
		col := make([]any, 400)
		for i := range col {
			col[i] = "01a21066-a3dd-745d-a9b5-753df258bd65"
		}
		args = append(args, col)
	}
	// arrays reports how many backing arrays buf went through.
	arrays := func(args []any) int {
		buf := make([]byte, 0, 256) // as pgx leaves it after a statement
		n, last := 1, &buf[:1][0]
		for _, a := range args {
			var err error
			if buf, err = m.Encode(pgtype.TextArrayOID, pgtype.BinaryFormatCode, a, buf); err != nil {
				t.Fatal(err)
			}
			if p := &buf[:1][0]; p != last {
				n, last = n+1, p
			}
		}
		return n
	}
	if n := arrays(sizeParams(args)); n != 2 { // the 256 bytes, then the statement's
		t.Fatalf("sized: %d arrays, want 2", n)
	}
	if n := arrays(args); n < 6 {
		t.Fatalf("unsized: %d arrays; the test no longer shows the regrowth", n)
	}
}

// TestGrowWriteSendsNothing: the message that grows a connection's write
// buffer adds no bytes to what the frontend sends.
func TestGrowWriteSendsNothing(t *testing.T) {
	var sent bytes.Buffer
	fe := pgproto3.NewFrontend(strings.NewReader(""), &sent)
	fe.Send(&pgproto3.Sync{})
	fe.Send(growWrite{n: 1 << 20, kept: new([]byte)})
	fe.Send(&pgproto3.Sync{})
	if err := fe.Flush(); err != nil {
		t.Fatal(err)
	}
	want, _ := (&pgproto3.Sync{}).Encode(nil)
	want = append(want, want...)
	if !bytes.Equal(sent.Bytes(), want) {
		t.Fatalf("sent % x, want % x", sent.Bytes(), want)
	}
}

// TestSizedStatementsLendKeptArrays: the arrays a sized statement grew
// are lent to the next one on the connection once pgx has replaced them,
// never while pgx still holds them, and what each statement sends is
// its own bytes.
func TestSizedStatementsLendKeptArrays(t *testing.T) {
	sameArray := func(a, b []byte) bool { return cap(a) > 0 && cap(b) > 0 && &a[:cap(a)][0] == &b[:cap(b)][0] }
	var kept []byte
	first := grow(&kept, make([]byte, 3, 256), 10000)
	if cap(first)-len(first) < 10000 || !sameArray(kept, first) {
		t.Fatalf("first grow: cap %d, kept %v", cap(first), sameArray(kept, first))
	}
	// pgx goes on appending to the array it holds: it grows as before.
	held := grow(&kept, first, 1<<16)
	if sameArray(held, first) || !sameArray(kept, held) {
		t.Fatal("a held array was lent again instead of grown")
	}
	// pgx replaced it (a fresh buffer with a few bytes): the kept array
	// is lent, the bytes copied in.
	fresh := append(make([]byte, 0, 256), "abc"...)
	lent := grow(&kept, fresh, 20000)
	if !sameArray(lent, held) || string(lent) != "abc" {
		t.Fatalf("lent %q (same array %v), want the kept array holding abc", lent, sameArray(lent, held))
	}
	// Room enough already: nothing changes hands.
	if got := grow(&kept, fresh, 10); !sameArray(got, fresh) {
		t.Fatal("a buffer with room was replaced")
	}
	// Too large to keep: allocated, the kept array left as it was.
	huge := grow(&kept, fresh, maxKept+1)
	if sameArray(huge, held) || !sameArray(kept, held) {
		t.Fatal("an array over maxKept was kept, or the kept one lent short")
	}
}

// TestSizedStatementsInSequence: sized statements one after another on a
// connection, alone and in a batch, larger and smaller than the one
// before, each reach Postgres as their own values (the kept arrays carry
// nothing of one statement into the next).
func TestSizedStatementsInSequence(t *testing.T) {
	conn := codecConn(t)
	column := func(n int, tag string) []any {
		c := make([]any, n)
		for i := range c {
			c[i] = fmt.Sprintf("%s-%d-%s", tag, i, strings.Repeat("x", i%50))
		}
		return c
	}
	check := func(rows pgx.Rows, want []any) {
		t.Helper()
		got, err := pgx.CollectRows(rows, pgx.RowTo[string])
		if err != nil {
			t.Fatal(err)
		}
		if len(got) != len(want) {
			t.Fatalf("%d rows, want %d", len(got), len(want))
		}
		for i := range got {
			if got[i] != want[i] {
				t.Fatalf("row %d: %q, want %q", i, got[i], want[i])
			}
		}
	}
	const q = `SELECT t FROM unnest(CAST($1 AS TEXT[])) WITH ORDINALITY AS v(t, i) ORDER BY i`
	for round, n := range []int{300, 2000, 500, 4000, 300} {
		want := column(n, fmt.Sprint("alone", round))
		rows, err := conn.Query(t.Context(), q, sizeParams([]any{want})...)
		if err != nil {
			t.Fatal(err)
		}
		check(rows, want)

		// A parameter ahead of the column, and a small statement ahead of
		// the sized ones in the batch: the bytes pgx wrote before a sized
		// column go along into a lent array.
		prefixed := column(n, fmt.Sprint("p", round))
		rows, err = conn.Query(t.Context(), `SELECT $1 || t FROM unnest(CAST($2 AS TEXT[])) WITH ORDINALITY AS v(t, i) ORDER BY i`, sizeParams([]any{"pre-", prefixed})...)
		if err != nil {
			t.Fatal(err)
		}
		for i := range prefixed {
			prefixed[i] = "pre-" + prefixed[i].(string)
		}
		check(rows, prefixed)

		var b pgx.Batch
		small := []any{"s1", "s2"}
		b.Queue(q, small)
		wants := [][]any{small, column(n, fmt.Sprint("a", round)), column(n/2+200, fmt.Sprint("b", round)), column(n*2, fmt.Sprint("c", round))}
		for _, w := range wants[1:] {
			b.Queue(q, sizeParams([]any{w})...)
		}
		br := conn.SendBatch(t.Context(), &b)
		for _, w := range wants {
			rows, err := br.Query()
			if err != nil {
				t.Fatal(err)
			}
			check(rows, w)
		}
		if err := br.Close(); err != nil {
			t.Fatal(err)
		}
	}
}

// TestSizedStatementsReuseTheConnectionsArrays: a connection's four
// column codecs share one pair of kept arrays, its sized statements grow
// them, and the next sized statement is written through the same arrays
// rather than new ones.
func TestSizedStatementsReuseTheConnectionsArrays(t *testing.T) {
	conn := codecConn(t)
	var bufs *connBuffers
	for oid := range columnArrays {
		typ, ok := conn.TypeMap().TypeForOID(oid)
		if !ok {
			t.Fatalf("type %d not registered", oid)
		}
		c, ok := typ.Codec.(*columnCodec)
		if !ok {
			t.Fatalf("type %d has codec %T", oid, typ.Codec)
		}
		if bufs == nil {
			bufs = c.bufs
		}
		if c.bufs == nil || c.bufs != bufs {
			t.Fatal("the connection's codecs do not share one pair of kept arrays")
		}
	}
	run := func(n int) {
		t.Helper()
		col := make([]any, n)
		for i := range col {
			col[i] = strings.Repeat("z", 40)
		}
		var got int
		if err := conn.QueryRow(t.Context(), `SELECT count(*) FROM unnest(CAST($1 AS TEXT[]))`, sizeParams([]any{col})...).Scan(&got); err != nil || got != n {
			t.Fatalf("count %d, err %v; want %d", got, err, n)
		}
	}
	run(2000)
	if cap(bufs.params) < 2000*44 || cap(bufs.write) < 2000*44 {
		t.Fatalf("kept arrays of %d and %d bytes after a statement of ≈%d", cap(bufs.params), cap(bufs.write), 2000*44)
	}
	params, write := &bufs.params[:1][0], &bufs.write[:1][0]
	run(1500)
	if &bufs.params[:1][0] != params || &bufs.write[:1][0] != write {
		t.Fatal("the second statement allocated new arrays instead of the kept ones")
	}
}
