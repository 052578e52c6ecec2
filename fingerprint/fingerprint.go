// Package fingerprint computes the request fingerprint that tells a retry
// from a reused key (CONTRACT section 2): Request is idem's default
// (Options.Request.Fingerprint), with JSON bodies canonicalized per RFC 8785.
package fingerprint

import (
	"bytes"
	"crypto/sha256"
	"encoding/binary"
	"encoding/json"
	"io"
	"math"
	"math/big"
	"mime"
	"net/http"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"unicode/utf8"

	"github.com/gowebpki/jcs"
)

// Request is the default request fingerprint (CONTRACT section 2): the
// SHA-256 (32 bytes) of the method, the route path, the canonical query
// string (url.Values.Encode: keys sorted; the raw query when it does not
// parse), the media type (lower-cased, without parameters) and the body.
// Each part is length-prefixed, so no two different requests share an
// encoding.
//
// A JSON body (application/json or any +json type) is first canonicalized
// per RFC 8785, so key order and whitespace do not change the fingerprint.
// RFC 8785 writes numbers as IEEE 754 doubles (section 3.2.2.3), which
// would make 9007199254740993 and 9007199254740992 one number: a JSON body
// with a number whose value is not that of its double's shortest decimal
// form (0.1 is; 9007199254740993 is not) is canonicalized instead with each
// number as its exact rational value (and marked so, in a part of its own),
// so two different amounts never share a fingerprint while reordered keys
// still do.
//
// Hashed as raw bytes: every body that is not JSON; a JSON body that does
// not parse or repeats an object member name; in the exact form, one whose
// strings hold U+FFFD (invalid UTF-8 or a lone surrogate escape decode to
// it), with a number of more than 1000 characters or an exponent beyond
// ±1000, or whose numbers' exact values would take more digits than four
// times the body and 64 KiB. The work is linear in the body: RFC 8785's
// form is computed in one pass (canonicalJSON); the rare JSON bodies that
// pass leaves to github.com/gowebpki/jcs (a body that is not one object or
// array, one nested more than 64 deep, a member name with a surrogate
// escape not followed by another \u escape) are hashed raw when longer
// than 16 KiB, since that library's time grows with the square of an
// object's members.
func Request(r *http.Request, body []byte) []byte {
	mediaType := ""
	if ct := r.Header.Get("Content-Type"); ct == "application/json" {
		mediaType = ct // what mime.ParseMediaType would answer, without its allocations
	} else if ct != "" {
		if mt, _, err := mime.ParseMediaType(ct); err == nil {
			mediaType = mt
		} else {
			mediaType = strings.ToLower(strings.TrimSpace(ct))
		}
	}
	exactMode := false
	if isJSON(mediaType) {
		switch canon, verdict := canonicalJSON(body); verdict {
		case canonOK:
			body = canon
		case canonInexact:
			if canon, ok := exactCanonical(body); ok {
				body, exactMode = canon, true
			}
		case canonUnknown:
			if len(body) > maxQuirkBytes {
				break // hashed raw (maxQuirkBytes)
			}
			if numbersExact(body) {
				if canon, err := jcs.Transform(body); err == nil {
					body = canon
				}
			} else if canon, ok := exactCanonical(body); ok {
				body, exactMode = canon, true
			}
		}
	}
	path, query := r.URL.EscapedPath(), canonicalQuery(r.URL.RawQuery)
	// Each part length-prefixed (8 bytes, big-endian), hashed at once.
	// On the stack for a common request (the parts of a payment's are
	// a few hundred bytes).
	var stack [512]byte
	enc := stack[:0]
	part := func(b string) {
		enc = binary.BigEndian.AppendUint64(enc, uint64(len(b)))
		enc = append(enc, b...)
	}
	part(r.Method)
	part(path)
	part(query)
	part(mediaType)
	enc = binary.BigEndian.AppendUint64(enc, uint64(len(body)))
	enc = append(enc, body...)
	if exactMode {
		// A sixth part: no five-part encoding (RFC 8785 or raw) equals it.
		part(exactPart)
	}
	sum := sha256.Sum256(enc)
	return sum[:]
}

// maxQuirkBytes bounds the bodies left to the general path (canonUnknown):
// jcs.Transform's time grows with the square of an object's members, and
// exactCanonical's with the nesting depth times the size; a longer body is
// hashed raw.
const maxQuirkBytes = 16 << 10

// exactPart is the sixth part of a fingerprint taken in exact mode.
const exactPart = "exact-numbers"

// numbersExact reports whether body is JSON whose every number equals the
// shortest decimal form of its float64, so RFC 8785 canonicalization maps
// no two different numbers to one.
func numbersExact(body []byte) bool {
	dec := json.NewDecoder(bytes.NewReader(body))
	dec.UseNumber()
	for {
		tok, err := dec.Token()
		if err == io.EOF {
			return true
		}
		if err != nil {
			return false
		}
		n, ok := tok.(json.Number)
		if !ok {
			continue
		}
		if _, ok := numberExact(string(n)); !ok {
			return false
		}
	}
}

// numberExact reports whether the JSON number literal n is the value of
// its double's shortest decimal form (what RFC 8785 writes), and returns
// the double.
func numberExact(n string) (float64, bool) {
	// The double first: an infinite one (1e400) is never exact, a zero one
	// only when the literal is zero.
	f, err := strconv.ParseFloat(n, 64)
	if err != nil || math.IsInf(f, 0) {
		return 0, false
	}
	if f == 0 {
		mantissa, _, _ := strings.Cut(n, "e")
		mantissa, _, _ = strings.Cut(mantissa, "E")
		// A non-zero number too small for a double is inexact; zero,
		// however written, is exact (RFC 8785 writes 0).
		return 0, strings.Trim(mantissa, "-0.") == ""
	}
	// The literal is its double's shortest form (1000, 0.1: most
	// amounts): exact, at once.
	var short [32]byte
	shortest := strconv.AppendFloat(short[:0], f, 'g', -1, 64)
	if string(shortest) == n {
		return f, true
	}
	// Else the two decimals are compared digit for digit, in time linear
	// in the literal (big.Rat took seconds for a literal of 500,000 digits).
	return f, sameDecimal(n, string(shortest))
}

// sameDecimal reports whether two decimal number literals (JSON's grammar,
// or strconv's 'g' form) have the same value: the same sign, the same
// significant digits and the same magnitude. Neither may be zero.
func sameDecimal(a, b string) bool {
	na, da, ea, oka := decimalParts(a)
	nb, db, eb, okb := decimalParts(b)
	return oka && okb && na == nb && ea == eb && da == db
}

// decimalParts splits a non-zero decimal literal into its sign, its
// significant digits d (no leading or trailing zero) and the exponent e of
// its value 0.d × 10^e. ok is false when the exponent does not fit an int.
func decimalParts(n string) (neg bool, digits string, exp int, ok bool) {
	if n != "" && n[0] == '-' {
		neg, n = true, n[1:]
	}
	mantissa, expPart, hasExp := strings.Cut(n, "e")
	if !hasExp {
		mantissa, expPart, hasExp = strings.Cut(n, "E")
	}
	if hasExp {
		e, err := strconv.Atoi(expPart)
		if err != nil {
			return false, "", 0, false
		}
		exp = e
	}
	intPart, frac, _ := strings.Cut(mantissa, ".")
	all := intPart + frac
	lead := len(all) - len(strings.TrimLeft(all, "0"))
	trimmed := strings.TrimRight(all[lead:], "0")
	// all = digits followed by its trailing zeros; its value is all × 10^(exp-len(frac)).
	trailing := len(all) - lead - len(trimmed)
	return neg, trimmed, len(trimmed) + trailing + exp - len(frac), true
}

// Bounds of the exact canonical form: a longer number literal, or one with
// a larger exponent, makes the body hashed raw (big.Rat's work grows with
// both).
const (
	maxExactNumberLen = 1000
	maxExactExponent  = 1000
)

// exactCanonical writes a JSON body in a canonical form that keeps numbers
// exact: object members sorted by key, no whitespace, strings as
// encoding/json writes them, and every number as '#' and its exact
// rational value (big.Rat.RatString). It reports false, for a raw hash,
// when the body is not one JSON value, repeats a key, holds U+FFFD in a
// string, or has a number beyond the bounds.
func exactCanonical(body []byte) ([]byte, bool) {
	if !utf8.Valid(body) {
		return nil, false
	}
	dec := json.NewDecoder(bytes.NewReader(body))
	dec.UseNumber()
	var buf bytes.Buffer
	budget := exactBudget(len(body))
	if !writeExact(dec, &buf, &budget) {
		return nil, false
	}
	if _, err := dec.Token(); err != io.EOF {
		return nil, false // trailing data
	}
	return buf.Bytes(), true
}

// exactBudget bounds the digits the exact canonical form of an n-byte body
// may write for its numbers: four times the body and 64 KiB. An amount's
// exact value is about as long as its literal (9007199254740993,
// 19.99 = 1999/100), but 1e999 is 1000 digits: a body of those by the
// thousand is hashed raw rather than expanded (1.7 GB for 1 MiB of them).
func exactBudget(n int) int { return 4*n + 64<<10 }

// writeExact writes the next JSON value of dec to buf (see exactCanonical),
// its numbers' digits counted against budget.
func writeExact(dec *json.Decoder, buf *bytes.Buffer, budget *int) bool {
	tok, err := dec.Token()
	if err != nil {
		return false
	}
	switch v := tok.(type) {
	case json.Delim:
		switch v {
		case '[':
			buf.WriteByte('[')
			for i := 0; dec.More(); i++ {
				if i > 0 {
					buf.WriteByte(',')
				}
				if !writeExact(dec, buf, budget) {
					return false
				}
			}
			if end, err := dec.Token(); err != nil || end != json.Delim(']') {
				return false
			}
			buf.WriteByte(']')
			return true
		case '{':
			type member struct{ key, value []byte }
			var members []member
			seen := map[string]bool{}
			for dec.More() {
				kt, err := dec.Token()
				key, ok := kt.(string)
				if err != nil || !ok || seen[key] || strings.ContainsRune(key, utf8.RuneError) {
					return false
				}
				seen[key] = true
				var value bytes.Buffer
				if !writeExact(dec, &value, budget) {
					return false
				}
				k, _ := json.Marshal(key)
				members = append(members, member{k, value.Bytes()})
			}
			if end, err := dec.Token(); err != nil || end != json.Delim('}') {
				return false
			}
			slices.SortFunc(members, func(a, b member) int { return bytes.Compare(a.key, b.key) })
			buf.WriteByte('{')
			for i, m := range members {
				if i > 0 {
					buf.WriteByte(',')
				}
				buf.Write(m.key)
				buf.WriteByte(':')
				buf.Write(m.value)
			}
			buf.WriteByte('}')
			return true
		}
		return false
	case string:
		if strings.ContainsRune(v, utf8.RuneError) {
			return false
		}
		b, _ := json.Marshal(v)
		buf.Write(b)
	case json.Number:
		r, ok := exactNumber(string(v), budget)
		if !ok {
			return false
		}
		buf.WriteByte('#')
		buf.WriteString(r.RatString())
	case bool:
		buf.WriteString(strconv.FormatBool(v))
	case nil:
		buf.WriteString("null")
	default:
		return false
	}
	return true
}

// exactNumber is the exact value of a JSON number literal within the bounds
// of the exact canonical form; the digits its value may take (the literal's
// length and its exponent's size) are taken from budget, and false is
// returned once budget is spent.
func exactNumber(n string, budget *int) (*big.Rat, bool) {
	if len(n) > maxExactNumberLen {
		return nil, false
	}
	exp := 0
	if i := strings.IndexAny(n, "eE"); i >= 0 {
		e, err := strconv.Atoi(strings.TrimPrefix(n[i+1:], "+"))
		if err != nil || e > maxExactExponent || e < -maxExactExponent {
			return nil, false
		}
		exp = e
	}
	if *budget -= len(n) + max(exp, -exp); *budget < 0 {
		return nil, false
	}
	return new(big.Rat).SetString(n)
}

// canonicalQuery is the query string with its pairs sorted by key
// (url.Values.Encode), or the raw query when it does not parse: ParseQuery
// drops the pairs it cannot read ("a=1;b", "%zz"), and two requests that
// differ only there must not share a fingerprint.
func canonicalQuery(raw string) string {
	if raw == "" {
		return "" // what ParseQuery and Encode make of it
	}
	values, err := url.ParseQuery(raw)
	if err != nil {
		return "\x00raw:" + raw // cannot collide with an encoded query, which holds no NUL
	}
	return values.Encode()
}

func isJSON(mediaType string) bool {
	return mediaType == "application/json" || strings.HasSuffix(mediaType, "+json")
}
