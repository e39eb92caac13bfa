package postgres

import (
	"context"
	"encoding/binary"
	"fmt"
	"math"

	"github.com/jackc/pgx/v5"
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
	return registerColumns(conn.TypeMap())
}

func registerColumns(m *pgtype.Map) error {
	for oid := range columnArrays {
		t, ok := m.TypeForOID(oid)
		if !ok {
			return fmt.Errorf("postgres: type %d not registered", oid)
		}
		ac, ok := t.Codec.(*pgtype.ArrayCodec)
		if !ok {
			return fmt.Errorf("postgres: type %s has codec %T, not an array codec", t.Name, t.Codec)
		}
		m.RegisterType(&pgtype.Type{Name: t.Name, OID: t.OID, Codec: &columnCodec{ArrayCodec: ac}})
	}
	return nil
}

// columnCodec is pgx's array codec but for encoding an []any in binary.
type columnCodec struct {
	*pgtype.ArrayCodec
}

func (c *columnCodec) PlanEncode(m *pgtype.Map, oid uint32, format int16, value any) pgtype.EncodePlan {
	if _, ok := value.([]any); ok && format == pgtype.BinaryFormatCode {
		if elem, ok := columnArrays[oid]; ok {
			return columnPlan(elem)
		}
	}
	return c.ArrayCodec.PlanEncode(m, oid, format, value)
}

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
