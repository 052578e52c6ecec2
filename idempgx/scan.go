package idempgx

import (
	"encoding/binary"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgtype"
)

// rowScanner scans a row into dest (the targets scanRecord lists) by
// decoding the values PostgreSQL sent in binary itself, when every one of
// them is of a type it knows in binary format (or text, the same bytes in
// either format); any other row (text results,
// as in the exec and simple_protocol exec modes behind a pooler, a column of
// another type, an infinite timestamp, a time zone set on the codec) is
// scanned by pgx. pgx builds a scan plan per column of every row a query
// reads, and the plan of a timestamptz column is an allocation of its own:
// a record has five. The values are those pgx gives (TestFastScanMatchesPgx).
type rowScanner struct {
	dest []any
	// known are strings the row likely repeats (the claim's path and
	// owner): a text value equal to one is that string, not a copy.
	known []string
}

// ScanRow implements pgx.RowScanner.
func (s *rowScanner) ScanRow(rows pgx.Rows) error {
	if !s.decode(rows) {
		return rows.Scan(s.dest...)
	}
	return nil
}

// decode decodes the row into s.dest, or reports false, leaving dest to be
// scanned again, when the row is not one it decodes exactly as pgx would.
func (s *rowScanner) decode(rows pgx.Rows) bool {
	fds, raw := rows.FieldDescriptions(), rows.RawValues()
	if len(fds) != len(s.dest) || len(raw) != len(s.dest) || !plainTimestamps(rows) {
		return false
	}
	// The bytea values of the row share one allocation.
	n := 0
	for i, fd := range fds {
		// A text value is the same bytes in either format; pgx asks for
		// text in text.
		if fd.Format != pgtype.BinaryFormatCode && fd.DataTypeOID != pgtype.TextOID {
			return false
		}
		if fd.DataTypeOID == pgtype.ByteaOID {
			n += len(raw[i])
		}
	}
	var buf []byte
	if n > 0 {
		buf = make([]byte, 0, n)
	}
	for i, fd := range fds {
		src := raw[i]
		switch d := s.dest[i].(type) {
		case *string:
			if fd.DataTypeOID != pgtype.TextOID || src == nil {
				return false
			}
			*d = s.text(src)
		case *[]byte:
			if fd.DataTypeOID != pgtype.ByteaOID {
				return false
			}
			if src == nil {
				*d = nil
				continue
			}
			start := len(buf)
			buf = append(buf, src...)
			*d = buf[start:len(buf):len(buf)]
		case *bool:
			if fd.DataTypeOID != pgtype.BoolOID || len(src) != 1 {
				return false
			}
			*d = src[0] != 0
		case *pgtype.Bool:
			if fd.DataTypeOID != pgtype.BoolOID || (src != nil && len(src) != 1) {
				return false
			}
			*d = pgtype.Bool{Bool: src != nil && src[0] != 0, Valid: src != nil}
		case *int64:
			v, ok := integer(fd.DataTypeOID, src)
			if !ok || src == nil {
				return false
			}
			*d = v
		case *int:
			v, ok := integer(fd.DataTypeOID, src)
			if !ok || src == nil {
				return false
			}
			*d = int(v)
		case *pgtype.Int8:
			v, ok := integer(fd.DataTypeOID, src)
			if !ok {
				return false
			}
			*d = pgtype.Int8{Int64: v, Valid: src != nil}
		case *time.Time:
			t, ok := timestamptz(fd.DataTypeOID, src)
			if !ok || src == nil {
				return false
			}
			*d = t
		case *pgtype.Timestamptz:
			t, ok := timestamptz(fd.DataTypeOID, src)
			if !ok {
				return false
			}
			*d = pgtype.Timestamptz{Time: t, Valid: src != nil}
		default:
			return false
		}
	}
	return true
}

// plainTimestamps reports whether the connection's timestamptz codec is
// pgx's own with no scan location (times in the local zone, as time.Unix
// gives them), the only one the fast path decodes as pgx would.
func plainTimestamps(rows pgx.Rows) bool {
	c := rows.Conn()
	if c == nil {
		return false
	}
	t, ok := c.TypeMap().TypeForOID(pgtype.TimestamptzOID)
	if !ok {
		return false
	}
	codec, ok := t.Codec.(*pgtype.TimestamptzCodec)
	return ok && codec.ScanLocation == nil
}

// integer decodes a binary int8 or int4 (NULL: 0, true).
func integer(oid uint32, src []byte) (int64, bool) {
	switch {
	case src == nil:
		return 0, oid == pgtype.Int8OID || oid == pgtype.Int4OID
	case oid == pgtype.Int8OID && len(src) == 8:
		return int64(binary.BigEndian.Uint64(src)), true
	case oid == pgtype.Int4OID && len(src) == 4:
		return int64(int32(binary.BigEndian.Uint32(src))), true
	}
	return 0, false
}

// microsecondsToY2K is 2000-01-01 00:00 UTC, PostgreSQL's epoch, in
// microseconds since the Unix epoch.
const microsecondsToY2K = 946_684_800 * 1_000_000

// timestamptz decodes a binary timestamptz (microseconds since 2000-01-01
// UTC) as pgx does: in the local zone (NULL: the zero time, true). The
// infinities, which idem never writes, are left to pgx (false).
func timestamptz(oid uint32, src []byte) (time.Time, bool) {
	if oid != pgtype.TimestamptzOID {
		return time.Time{}, false
	}
	if src == nil {
		return time.Time{}, true
	}
	if len(src) != 8 {
		return time.Time{}, false
	}
	us := int64(binary.BigEndian.Uint64(src))
	// Beyond ±200,000 years from 2000 (the infinities are the extremes of
	// int64): pgx's to decide, and to refuse.
	const bound = 200_000 * 366 * 24 * 3600 * 1_000_000
	if us > bound || us < -bound {
		return time.Time{}, false
	}
	return time.Unix(microsecondsToY2K/1_000_000+us/1_000_000, (microsecondsToY2K%1_000_000*1_000)+(us%1_000_000*1_000)), true
}

// text is src as a string: one of s.known, or internText's.
func (s *rowScanner) text(src []byte) string {
	for _, k := range s.known {
		if k == string(src) {
			return k
		}
	}
	return internText(src)
}

// internText is src as a string, without an allocation for the values a
// record repeats: its states and the common methods.
func internText(src []byte) string {
	switch string(src) {
	case "":
		return ""
	case "PROCESSING":
		return "PROCESSING"
	case "SUCCEEDED":
		return "SUCCEEDED"
	case "FAILED":
		return "FAILED"
	case "POST":
		return "POST"
	case "PUT":
		return "PUT"
	case "PATCH":
		return "PATCH"
	case "DELETE":
		return "DELETE"
	}
	return string(src)
}
