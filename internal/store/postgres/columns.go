package postgres

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"math"
	"slices"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgproto3"
	"github.com/jackc/pgx/v5/pgtype"
)

// The store writes set-wise: each column of a batch's rows goes as one
// array parameter (CAST(? AS TEXT[]) and the like), an []any whose
// elements are the column's values or nil. pgx encodes an []any through
// reflection, looking up each element's type and boxing it again: a
// seventh of Ferry's CPU in the jobs benchmark. columnCodec writes
// those arrays in Postgres's binary array format directly from a type
// switch over the few element types the store passes; everything else
// (other values, scanning) is pgx's own array codec.

// columnArrays are the array types the store's columns are cast to, by
// array OID, with their element's OID.
var columnArrays = map[uint32]uint32{
	pgtype.TextArrayOID:  pgtype.TextOID,
	pgtype.Int8ArrayOID:  pgtype.Int8OID,
	pgtype.ByteaArrayOID: pgtype.ByteaOID,
	pgtype.BoolArrayOID:  pgtype.BoolOID,
}

// registerColumnCodecs gives conn's type map the column arrays' codec.
func registerColumnCodecs(_ context.Context, conn *pgx.Conn) error {
	return registerColumns(conn.TypeMap(), conn.PgConn().Frontend())
}

// registerColumns registers the column codec in m; fe, when not nil, is
// the frontend of m's connection, whose write buffer a sized column grows.
func registerColumns(m *pgtype.Map, fe *pgproto3.Frontend) error {
	bufs := new(connBuffers) // one pair for the connection's four codecs
	for oid := range columnArrays {
		t, ok := m.TypeForOID(oid)
		if !ok {
			return fmt.Errorf("postgres: type %d not registered", oid)
		}
		ac, ok := t.Codec.(*pgtype.ArrayCodec)
		if !ok {
			return fmt.Errorf("postgres: type %s has codec %T, not an array codec", t.Name, t.Codec)
		}
		m.RegisterType(&pgtype.Type{Name: t.Name, OID: t.OID, Codec: &columnCodec{ArrayCodec: ac, fe: fe, bufs: bufs}})
	}
	return nil
}

// columnCodec is pgx's array codec but for encoding an []any in binary.
type columnCodec struct {
	*pgtype.ArrayCodec
	fe   *pgproto3.Frontend // its connection's, or nil
	bufs *connBuffers       // its connection's
}

func (c *columnCodec) PlanEncode(m *pgtype.Map, oid uint32, format int16, value any) pgtype.EncodePlan {
	_, sized := value.(sizedColumn)
	if _, ok := value.([]any); (ok || sized) && format == pgtype.BinaryFormatCode {
		if elem, ok := columnArrays[oid]; ok {
			if sized {
				return sizedPlan{elem: columnPlan(elem), fe: c.fe, bufs: c.bufs}
			}
			return columnPlan(elem)
		}
	}
	if sized {
		return unsizedPlan{m: m, oid: oid, format: format}
	}
	return c.ArrayCodec.PlanEncode(m, oid, format, value)
}

// Writing a large statement, pgx copied its parameters over and over:
// it encodes them into a buffer that it shrinks back to 256 bytes after
// every statement, then copies them into its write buffer, which it
// shrinks back to 1 KB after every flush, and both grow by appending, a
// quarter at a time once large. For a batch's write statement of a few
// hundred kilobytes that was about four copies of it in each buffer, and
// over a third of the bytes Ferry allocated in the jobs benchmark. pgx
// offers no setting that keeps its buffers; what it offers is that a
// parameter's encoding appends to the statement's buffer, and that a
// message's encoding appends to the connection's write buffer. So
// sizeParams marks a statement's first column with the size of the
// parameters from it on (sizedColumn), and that column's encoding grows
// both buffers once, to what the statement needs, before it writes.
//
// Growing them once a statement still allocated both anew each time pgx
// had dropped them (a job's share of a batch's write, twice: 13 % of
// the bytes Ferry allocated in Postgres jobs, and the runtime clearing
// each large allocation was 3 % of its CPU). So the arrays grown are
// kept with the connection (connBuffers) and lent again to the next
// sized statement, once pgx no longer holds them.

// sizedColumn is a column ([]any) and, about, the bytes the statement's
// parameters take from it on.
type sizedColumn struct {
	vals []any
	size int
}

// sizeParams returns args with their first column sized (see above), or
// as they are when they are small or have no column.
func sizeParams(args []any) []any {
	first := -1
	for i, a := range args {
		if _, ok := a.([]any); ok {
			first = i
			break
		}
	}
	if first < 0 {
		return args
	}
	size := 0
	for _, a := range args[first:] {
		size += paramSize(a)
	}
	if size < minSized {
		return args
	}
	args = slices.Clone(args)
	args[first] = sizedColumn{vals: args[first].([]any), size: size}
	return args
}

// minSized is the statement size under which pgx's buffers are left to
// grow by themselves: they start at 256 bytes and 1 KB.
const minSized = 4 << 10

// paramSize is about the bytes a parameter takes in a Bind message:
// its length and format code, and its binary form (a column's header,
// and each element's length and value).
func paramSize(v any) int {
	const lenAndFormat = 6
	switch v := v.(type) {
	case []any:
		n := lenAndFormat + 20
		for _, e := range v {
			n += 4
			switch e := e.(type) {
			case string:
				n += len(e)
			case []byte:
				n += len(e)
			case int64, int, int32:
				n += 8
			case bool:
				n++
			}
		}
		return n
	case string:
		return lenAndFormat + len(v)
	case []byte:
		return lenAndFormat + len(v)
	}
	return lenAndFormat + 8
}

// sizedPlan grows the statement's parameter buffer and the connection's
// write buffer for the statement, then encodes the column.
type sizedPlan struct {
	elem columnPlan
	fe   *pgproto3.Frontend
	bufs *connBuffers
}

func (p sizedPlan) Encode(value any, buf []byte) ([]byte, error) {
	v := value.(sizedColumn)
	if p.fe != nil {
		// The Bind message holds the parameters; its other fields, and
		// the Describe, Execute and Sync after it, are a few bytes.
		p.fe.Send(growWrite{n: v.size + 256, kept: &p.bufs.write})
	}
	return p.elem.Encode(v.vals, grow(&p.bufs.params, buf, v.size))
}

// connBuffers are the arrays a connection's sized statements grew, its
// parameters' and its write buffer's, kept for the next one.
//
// Lending one again is safe once pgx has let go of it, and pgx holds
// one array of each at a time: the statement's parameter buffer, which
// it replaces when the next statement's parameters are built (any
// larger than 256 bytes), after this one's Bind message has been copied
// into the write buffer; and the write buffer, which it replaces after
// writing it to the socket (any larger than 1 KB), or keeps and goes on
// appending to. A kept array is lent only to replace a different array,
// so never while pgx still appends to it or has yet to send it. The
// connection is used by one goroutine at a time, as is this.
type connBuffers struct {
	params, write []byte
}

// maxKept is the largest array a connection keeps: a bigger statement
// (a batch of thousands of rows) allocates its own, as before.
const maxKept = 1 << 20

// grow returns dst with room for n more bytes: dst when it has room,
// else *kept with dst's bytes copied in when that has room, else a new
// array, which is then kept. When dst is the kept array (pgx still holds
// it) both have the same room, too little, so it is grown, not lent.
func grow(kept *[]byte, dst []byte, n int) []byte {
	if cap(dst)-len(dst) >= n {
		return dst
	}
	if k := *kept; cap(k) >= len(dst)+n {
		return append(k[:0], dst...)
	}
	out := slices.Grow(dst, n)
	if cap(out) <= maxKept {
		*kept = out
	}
	return out
}

// unsizedPlan encodes a sized column as pgx does the column itself (a
// format or element type the column codec does not write).
type unsizedPlan struct {
	m      *pgtype.Map
	oid    uint32
	format int16
}

func (p unsizedPlan) Encode(value any, buf []byte) ([]byte, error) {
	return p.m.Encode(p.oid, p.format, value.(sizedColumn).vals, buf)
}

// growWrite is a message of no bytes: sending it makes room for n more
// bytes in the frontend's write buffer, lending it the kept array (see
// connBuffers) when that has room.
type growWrite struct {
	n    int
	kept *[]byte
}

func (growWrite) Frontend() {}

func (growWrite) Decode([]byte) error { return errors.New("growWrite is not a message") }

func (g growWrite) Encode(dst []byte) ([]byte, error) { return grow(g.kept, dst, g.n), nil }

// columnPlan encodes an []any as a one-dimensional array of elem.
type columnPlan uint32

func (p columnPlan) Encode(value any, buf []byte) ([]byte, error) {
	vals := value.([]any)
	if vals == nil {
		return nil, nil // a nil slice is NULL, as pgx has it
	}
	elem := uint32(p)
	if len(vals) == 0 {
		buf = binary.BigEndian.AppendUint32(buf, 0) // no dimensions
		buf = binary.BigEndian.AppendUint32(buf, 0) // no NULLs
		return binary.BigEndian.AppendUint32(buf, elem), nil
	}
	if len(vals) > math.MaxInt32 {
		return nil, fmt.Errorf("column of %d values", len(vals))
	}
	buf = binary.BigEndian.AppendUint32(buf, 1)
	nulls := len(buf)
	buf = binary.BigEndian.AppendUint32(buf, 0)
	buf = binary.BigEndian.AppendUint32(buf, elem)
	buf = binary.BigEndian.AppendUint32(buf, uint32(len(vals)))
	buf = binary.BigEndian.AppendUint32(buf, 1) // lower bound
	for i, v := range vals {
		if v == nil {
			binary.BigEndian.PutUint32(buf[nulls:], 1)
			buf = binary.BigEndian.AppendUint32(buf, math.MaxUint32) // -1: NULL
			continue
		}
		var err error
		if buf, err = appendElement(buf, elem, v); err != nil {
			return nil, fmt.Errorf("element %d: %w", i, err)
		}
	}
	return buf, nil
}

// appendElement appends v, length first, in elem's binary form.
func appendElement(buf []byte, elem uint32, v any) ([]byte, error) {
	switch elem {
	case pgtype.TextOID, pgtype.ByteaOID:
		switch v := v.(type) {
		case string:
			buf = binary.BigEndian.AppendUint32(buf, uint32(len(v)))
			return append(buf, v...), nil
		case []byte:
			buf = binary.BigEndian.AppendUint32(buf, uint32(len(v)))
			return append(buf, v...), nil
		}
		return nil, fmt.Errorf("%T in a text or bytea column", v)
	case pgtype.Int8OID:
		var n int64
		switch v := v.(type) {
		case int64:
			n = v
		case int:
			n = int64(v)
		case int32:
			n = int64(v)
		default:
			return nil, fmt.Errorf("%T in a bigint column", v)
		}
		buf = binary.BigEndian.AppendUint32(buf, 8)
		return binary.BigEndian.AppendUint64(buf, uint64(n)), nil
	case pgtype.BoolOID:
		b, ok := v.(bool)
		if !ok {
			return nil, fmt.Errorf("%T in a boolean column", v)
		}
		buf = binary.BigEndian.AppendUint32(buf, 1)
		if b {
			return append(buf, 1), nil
		}
		return append(buf, 0), nil
	}
	return nil, fmt.Errorf("element type %d", elem)
}
