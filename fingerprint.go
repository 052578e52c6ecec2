package idem

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
	"strconv"
	"strings"

	"github.com/gowebpki/jcs"
)

// Fingerprint is the default request fingerprint (CONTRACT section 2): the
// SHA-256 (32 bytes) of the method, the route path, the canonical query
// string (url.Values.Encode: keys sorted; the raw query when it does not
// parse), the media type (lower-cased, without parameters) and the body. A JSON body (application/json or any
// +json type) is first canonicalized per RFC 8785, so key order and
// whitespace do not change the fingerprint. RFC 8785 writes numbers as
// IEEE 754 doubles (section 3.2.2.3), which would make 9007199254740993 and
// 9007199254740992 one number: a JSON body with a number whose value is not
// that of its double's shortest decimal form (0.1 is; 9007199254740993 is
// not) is hashed as raw bytes instead, so two different amounts never share
// a fingerprint. A JSON body that does not parse, and every other
// body, is hashed as raw bytes. Each part is length-prefixed,
// so no two different requests share an encoding.
func Fingerprint(r *http.Request, body []byte) []byte {
	h := sha256.New()
	part := func(b []byte) {
		var n [8]byte
		binary.BigEndian.PutUint64(n[:], uint64(len(b)))
		h.Write(n[:])
		h.Write(b)
	}
	mediaType := ""
	if ct := r.Header.Get("Content-Type"); ct != "" {
		if mt, _, err := mime.ParseMediaType(ct); err == nil {
			mediaType = mt
		} else {
			mediaType = strings.ToLower(strings.TrimSpace(ct))
		}
	}
	if isJSON(mediaType) && numbersExact(body) {
		if canon, err := jcs.Transform(body); err == nil {
			body = canon
		}
	}
	part([]byte(r.Method))
	part([]byte(r.URL.EscapedPath()))
	part([]byte(canonicalQuery(r.URL.RawQuery)))
	part([]byte(mediaType))
	part(body)
	return h.Sum(nil)
}

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
		// The cheap checks first: big.Rat would compute 10^999999 for
		// 1e-999999 (tens of milliseconds) before finding it inexact.
		f, err := strconv.ParseFloat(string(n), 64)
		if err != nil || math.IsInf(f, 0) {
			return false
		}
		if f == 0 {
			mantissa, _, _ := strings.Cut(strings.ToLower(string(n)), "e")
			if strings.Trim(mantissa, "-0.") != "" {
				return false // a non-zero number too small for a double
			}
			continue // zero, however written: RFC 8785 writes 0
		}
		// A finite non-zero double: the literal's exponent is bounded by
		// its own length plus 324, so big.Rat's work is too.
		exact, ok := new(big.Rat).SetString(string(n))
		if !ok {
			return false
		}
		// The number must be the value of its double's shortest decimal
		// form (what RFC 8785 writes): then no other number shares it.
		shortest, _ := new(big.Rat).SetString(strconv.FormatFloat(f, 'g', -1, 64))
		if shortest.Cmp(exact) != 0 {
			return false
		}
	}
}

// canonicalQuery is the query string with its pairs sorted by key
// (url.Values.Encode), or the raw query when it does not parse: ParseQuery
// drops the pairs it cannot read ("a=1;b", "%zz"), and two requests that
// differ only there must not share a fingerprint.
func canonicalQuery(raw string) string {
	values, err := url.ParseQuery(raw)
	if err != nil {
		return "\x00raw:" + raw // cannot collide with an encoded query, which holds no NUL
	}
	return values.Encode()
}

func isJSON(mediaType string) bool {
	return mediaType == "application/json" || strings.HasSuffix(mediaType, "+json")
}
