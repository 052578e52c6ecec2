// Package idemsql holds what the SQL drivers (idempgx, idemmysql, idemsqlite)
// write alike: the stored response's columns, the claim's SQL shapes, a
// database/sql business transaction, and the short transactions of the
// database/sql drivers (InTx). Not part of the seam's contract.
package idemsql

import (
	"bytes"
	"database/sql"
	"encoding/json"
	"fmt"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/idemgo/idem/idemdriver"
)

// EncodeHeader encodes stored response headers as a JSON object of string
// arrays, the column format every driver uses.
func EncodeHeader(h map[string][]string) ([]byte, error) {
	if h == nil {
		h = map[string][]string{}
	}
	return json.Marshal(h)
}

// DecodeHeader is the inverse of EncodeHeader. The headers EncodeHeader
// writes (no spaces, names and values with no escapes, valid UTF-8) are
// read without encoding/json, the names and values as substrings of one
// string; any other input is json.Unmarshal's, errors included
// (FuzzDecodeHeaderMatchesJSON).
func DecodeHeader(b []byte) (map[string][]string, error) {
	if h, ok := decodePlainHeader(b); ok {
		return h, nil
	}
	h := map[string][]string{}
	if len(b) == 0 {
		return h, nil
	}
	if err := json.Unmarshal(b, &h); err != nil {
		return nil, fmt.Errorf("idemdriver: stored response headers: %w", err)
	}
	return h, nil
}

// decodePlainHeader reads b when it is a JSON object of arrays of strings
// with no whitespace, no escape, no duplicate name, no empty array and
// valid UTF-8 (what EncodeHeader writes of ordinary headers); ok is false
// for anything else.
func decodePlainHeader(b []byte) (h map[string][]string, ok bool) {
	if len(b) < 2 || b[0] != '{' || b[len(b)-1] != '}' || !utf8.Valid(b) {
		return nil, false
	}
	// Every name and value is a string of its own, with no quote inside:
	// the count of quotes bounds how many there are.
	for _, c := range b {
		switch c {
		case '\\', ' ', '\t', '\n', '\r':
			return nil, false
		}
	}
	stringsIn := bytes.Count(b, []byte{'"'}) / 2
	if stringsIn == 0 {
		if len(b) == 2 {
			return map[string][]string{}, true
		}
		return nil, false
	}
	s := string(b) // one copy; every name and value is a substring of it
	all := make([]string, 0, stringsIn)
	h = make(map[string][]string, bytes.Count(b, []byte(`":[`)))
	i := 1
	str := func() (string, bool) { // a string starting at s[i]
		if i >= len(s) || s[i] != '"' {
			return "", false
		}
		end := strings.IndexByte(s[i+1:], '"')
		if end < 0 {
			return "", false
		}
		v := s[i+1 : i+1+end]
		for j := 0; j < len(v); j++ {
			if v[j] < 0x20 {
				return "", false
			}
		}
		i += end + 2
		return v, true
	}
	for {
		name, ok := str()
		if !ok || i+1 >= len(s) || s[i] != ':' || s[i+1] != '[' {
			return nil, false
		}
		if _, dup := h[name]; dup {
			return nil, false
		}
		i += 2
		start := len(all)
		for {
			v, ok := str()
			if !ok || i >= len(s) {
				return nil, false
			}
			all = append(all, v)
			if s[i] == ']' {
				i++
				break
			}
			if s[i] != ',' {
				return nil, false
			}
			i++
		}
		h[name] = all[start:len(all):len(all)]
		if i >= len(s) {
			return nil, false
		}
		switch s[i] {
		case ',':
			i++
		case '}':
			return h, i == len(s)-1
		default:
			return nil, false
		}
	}
}

// EncodeResponse returns a response's header and body columns as every
// driver stores them: the headers as EncodeHeader writes them, and the body,
// empty (never NULL) when it was not stored (BodyStored false). A sealed
// response (SealKey set) has NULL headers and its Sealed blob in the body
// column (empty when a driver dropped it). The seal_key column takes
// r.SealKey, seal_tag r.SealTag and the request column r.Request (NULL
// when nil) as they are.
func EncodeResponse(r idemdriver.Response) (headers, body []byte, err error) {
	if r.SealKey != "" {
		body = r.Sealed
		if body == nil {
			body = []byte{}
		}
		return nil, body, nil
	}
	if headers, err = EncodeHeader(r.Header); err != nil {
		return nil, nil, err
	}
	body = r.Body
	if !r.BodyStored || body == nil {
		body = []byte{}
	}
	return headers, body, nil
}

// ResponseColumns are a record's response columns as a driver scans them
// (every one NULL, seal_key empty, unless the record is SUCCEEDED):
// response_status, response_headers (EncodeHeader's JSON), response_body,
// response_body_stored, response_body_size, seal_key, seal_tag and, where
// the statement reads it (Get, List), request.
type ResponseColumns struct {
	Status  sql.NullInt64
	Headers []byte
	Body    []byte
	Stored  sql.NullBool
	Size    sql.NullInt64
	SealKey string
	SealTag []byte
	Request []byte
}

// DecodeResponse is the inverse of EncodeResponse: the stored response of a
// record in state, or nil when the record is not SUCCEEDED, or is SUCCEEDED
// but its response columns are damaged (by hand, by a partial restore):
// no status, a headers column that is not EncodeHeader's JSON, or a stored
// body whose length is not its recorded size (a NULL body column among
// them). The engine answers a SUCCEEDED record without a response 500
// response-missing (CONTRACT section 3), never a replay that is not the
// stored one byte for byte, and never a 503 that invites retries forever.
// A stored empty body is an empty, non-nil slice. A sealed response
// (seal_key not empty) has the body column in Sealed and seal_tag in
// SealTag, nil Header and Body; the seal checks them (a damaged blob, or
// columns its tag does not authenticate, do not open).
func DecodeResponse(state idemdriver.State, c ResponseColumns) *idemdriver.Response {
	if state != idemdriver.StateSucceeded || !c.Status.Valid {
		return nil
	}
	stored := c.Stored.Valid && c.Stored.Bool
	if c.SealKey != "" {
		return &idemdriver.Response{Status: int(c.Status.Int64), BodyStored: stored, BodySize: c.Size.Int64,
			SealKey: c.SealKey, Sealed: c.Body, SealTag: c.SealTag, Request: c.Request}
	}
	if stored && c.Size.Valid && int64(len(c.Body)) != c.Size.Int64 {
		return nil
	}
	h, err := DecodeHeader(c.Headers)
	if err != nil {
		return nil
	}
	body := c.Body
	if body == nil {
		body = []byte{}
	}
	return &idemdriver.Response{Status: int(c.Status.Int64), Header: h, Body: body,
		BodyStored: stored, BodySize: c.Size.Int64, Request: c.Request}
}

// WithRequest is rec with request, the request column a driver read beside
// the record's (Get, List), in rec.Response; rec unchanged when it has no
// response.
func WithRequest(rec idemdriver.Record, request []byte) idemdriver.Record {
	if rec.Response != nil {
		rec.Response.Request = request
	}
	return rec
}

// LeaseLeft converts the database's "locked_until - now" to the Record's
// LeaseLeft: zero unless the record is PROCESSING under a lease.
func LeaseLeft(state idemdriver.State, left time.Duration, valid bool) time.Duration {
	if state != idemdriver.StateProcessing || !valid || left < 0 {
		return 0
	}
	return left
}
