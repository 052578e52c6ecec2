package fingerprint

import (
	"crypto/sha256"
	"encoding/binary"
	"encoding/json"
	"fmt"
	"math"
	"math/big"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"testing"

	"github.com/gowebpki/jcs"
)

// FuzzCanonicalMatchesJCS: wherever the single-pass canonicalizer answers,
// its output is jcs.Transform's, byte for byte (Request depends on it:
// a stored fingerprint must not change); and when it finds an inexact
// number, the general path's numbersExact agrees.
func FuzzCanonicalMatchesJCS(f *testing.F) {
	for _, seed := range canonicalSeeds {
		f.Add([]byte(seed))
	}
	f.Fuzz(func(t *testing.T, body []byte) {
		canon, verdict := canonicalJSON(body)
		want, jcsErr := jcs.Transform(body)
		switch verdict {
		case canonOK:
			if jcsErr != nil {
				t.Fatalf("canonicalJSON(%q) = %q; jcs.Transform refuses it: %v", body, canon, jcsErr)
			}
			if string(canon) != string(want) {
				t.Fatalf("canonicalJSON(%q) = %q, jcs.Transform = %q", body, canon, want)
			}
		case canonRaw:
			// The general path would hash it raw too.
			if numbersExact(body) && jcsErr == nil {
				t.Fatalf("canonicalJSON(%q): raw; jcs.Transform = %q", body, want)
			}
			if _, ok := exactCanonical(body); ok && !numbersExact(body) {
				t.Fatalf("canonicalJSON(%q): raw; exactCanonical takes it", body)
			}
		case canonInexact:
			if numbersExact(body) {
				t.Fatalf("canonicalJSON(%q) found an inexact number; numbersExact finds none", body)
			}
		}
	})
}

var canonicalSeeds = []string{
	`{"amount":1000,"currency":"JPY","customer":"cus_42","description":"Order #1001"}`,
	` { "b" : [ 1 , 2.50 , -0 , 1e3, 1E-7, 123456789e20 ] , "a" : { } } `,
	`{"a":{"z":[{"y":1,"x":2}],"b":"\u00e9\n\t\"\\\/\u0001\u001f\u007f"},"\u20ac":1,"\ud83d\ude00":2,"\ufb33":3}`,
	`{"a":1,"a":2}`, `{"a":"\ud800"}`, `{"\udc00x":1}`, `[9007199254740993]`, `[0.1, 0.10000000000000000555]`,
	`{"a":1} {"b":2}`, "{\"a\":\"\xff\"}", `[]`, `[[],[[]],{}]`, `["\b\f\r"]`, `{"":0,"\u0000":1}`,
}

// TestCanonicalVerdicts: the common bodies take the single pass, and what
// it leaves is sent where the general path would end.
func TestCanonicalVerdicts(t *testing.T) {
	t.Parallel()
	for body, want := range map[string]canonVerdict{
		canonicalSeeds[0]: canonOK, canonicalSeeds[1]: canonOK, canonicalSeeds[2]: canonOK, // with a surrogate pair
		`[[],[[]],{}]`: canonOK, "{\"a\":\"\xff\"}": canonOK, `{"\ud800\u0041":1}`: canonOK,
		`{"a":1,"a":2}`: canonRaw, `{"a":"\ud800"}`: canonRaw, `{"a":1} {"b":2}`: canonUnknown, `[1] x`: canonUnknown, ``: canonUnknown, `00`: canonUnknown, `{"\ud800" `: canonUnknown,
		`[9007199254740993]`: canonInexact,
		` 12 `:               canonUnknown, `{"\udc00x":1}`: canonUnknown,
		strings.Repeat("[", 64) + strings.Repeat("]", 64):                                        canonOK,
		strings.Repeat("[", 65) + strings.Repeat("]", 65):                                        canonUnknown,
		`[{"a":"[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[\"["}]`: canonOK, // brackets in a string
	} {
		if _, got := canonicalJSON([]byte(body)); got != want {
			t.Errorf("canonicalJSON(%q) = %v, want %v", body, got, want)
		}
	}
}

// bigObject is a JSON object of first and 96,000 members "k0":0,
// "k1":0, ... (about 1 MiB, the default MaxRequestBytes).
func bigObject(first string) []byte {
	var b strings.Builder
	b.WriteString("{" + first)
	for i := range 96_000 {
		fmt.Fprintf(&b, `,"k%d":0`, i)
	}
	b.WriteString("}")
	return []byte(b.String())
}

// Regression: a 1 MiB object with a surrogate-pair escape (as Python's
// json.dumps writes an emoji) left the single pass for jcs.Transform, whose
// time grows with the square of an object's members: 18 s of CPU for one
// request. The pair is now decoded in the single pass, with jcs's result
// (the emoji as UTF-8).
func TestCanonicalLargeObjectWithSurrogatePair(t *testing.T) {
	t.Parallel()
	escaped, verdict := canonicalJSON(bigObject(`"description":"\ud83d\ude00"`))
	if verdict != canonOK {
		t.Fatalf("verdict %v, want canonOK", verdict)
	}
	plain, verdict := canonicalJSON(bigObject(`"description":"😀"`))
	if verdict != canonOK || string(escaped) != string(plain) {
		t.Fatalf("the escaped pair is not canonicalized as its UTF-8 rune (verdict %v)", verdict)
	}
}

// A body the single pass leaves to the general path is hashed raw beyond
// maxQuirkBytes, never handed to jcs.Transform.
func TestFingerprintLeavesNoLargeBodyToJCS(t *testing.T) {
	t.Parallel()
	body := bigObject(`"\ud800x":0`)
	if _, v := canonicalJSON(body); v != canonUnknown {
		t.Fatalf("verdict %v, want canonUnknown", v)
	}
	r := httptest.NewRequest(http.MethodPost, "/v1/payments", nil)
	r.Header.Set("Content-Type", "application/json")
	if got, want := Request(r, body), fingerprintParts("POST", "/v1/payments", "", "application/json", body); string(got) != string(want) {
		t.Fatal("a 1 MiB body left to the general path was not hashed raw")
	}
}

// fingerprintParts hashes the five parts as Request does (the encoding
// of TestFingerprintGolden's digests).
func fingerprintParts(parts ...any) []byte {
	h := sha256.New()
	for _, p := range parts {
		var b []byte
		switch v := p.(type) {
		case string:
			b = []byte(v)
		case []byte:
			b = v
		}
		var n [8]byte
		binary.BigEndian.PutUint64(n[:], uint64(len(b)))
		h.Write(n[:])
		h.Write(b)
	}
	return h.Sum(nil)
}

// BenchmarkFingerprint: a payment's JSON body, the common case.
func BenchmarkFingerprint(b *testing.B) {
	body := []byte(canonicalSeeds[0])
	r := httptest.NewRequest(http.MethodPost, "/v1/payments", nil)
	r.Header.Set("Content-Type", "application/json")
	b.ReportAllocs()
	for b.Loop() {
		Request(r, body)
	}
}

// FuzzNumberExact: the digit-for-digit comparison of numberExact agrees
// with big.Rat's exact one (what it replaced: seconds for a literal of
// 500,000 digits) on every JSON number literal.
func FuzzNumberExact(f *testing.F) {
	for _, seed := range []string{"1000", "0.1", "0.10", "1e2", "100e-2", "9007199254740993", "-12.50e-3", "1E+21",
		"0.1000000000000000055511151231257827", "1.00000000000000000000000000000000000001", "123456789012345678901234567890",
		"5e-324", "4.9406564584124654e-324", "1.7976931348623157e308", "-0.0", "0e5"} {
		f.Add(seed)
	}
	f.Fuzz(func(t *testing.T, n string) {
		if len(n) > 400 || !json.Valid([]byte(n)) || n == "" || !isNumberByte(n[0]) || strings.ContainsAny(n, " \t\r\n") {
			return
		}
		f64, err := strconv.ParseFloat(n, 64)
		want := err == nil && !math.IsInf(f64, 0)
		if want && f64 != 0 {
			exact, _ := new(big.Rat).SetString(n)
			shortest, _ := new(big.Rat).SetString(strconv.FormatFloat(f64, 'g', -1, 64))
			want = exact.Cmp(shortest) == 0
		} else if want {
			mantissa, _, _ := strings.Cut(strings.ToLower(n), "e")
			want = strings.Trim(mantissa, "-0.") == ""
		}
		if _, got := numberExact(n); got != want {
			t.Fatalf("numberExact(%q) = %v, big.Rat says %v", n, got, want)
		}
	})
}

// BenchmarkFingerprintLongNumber: a body of one 500,000-digit number.
func BenchmarkFingerprintLongNumber(b *testing.B) {
	body := []byte("[0." + strings.Repeat("7", 500_000) + "]")
	r := httptest.NewRequest(http.MethodPost, "/v1/payments", nil)
	r.Header.Set("Content-Type", "application/json")
	for b.Loop() {
		Request(r, body)
	}
}

// Regression: the exact canonical form wrote each 1e999 as its 1000 digits,
// so 1 MiB of them took a second and 1.7 GB; past its digit budget the body
// is hashed raw.
func TestExactFormBudget(t *testing.T) {
	t.Parallel()
	body := []byte("[" + strings.Repeat("1e999,", 170_000) + "9007199254740993]")
	r := httptest.NewRequest(http.MethodPost, "/v1/payments", nil)
	r.Header.Set("Content-Type", "application/json")
	if got, want := Request(r, body), fingerprintParts("POST", "/v1/payments", "", "application/json", body); string(got) != string(want) {
		t.Fatal("a body over the exact form's digit budget was not hashed raw")
	}
	small := []byte(`{"b":[1e999,1e999,1e999,1e999,1e999],"a":9007199254740993}`)
	reordered := []byte(`{"a":9007199254740993,"b":[1e999,1e999,1e999,1e999,1e999]}`)
	if string(Request(r, small)) != string(Request(r, reordered)) {
		t.Fatal("a small body within the budget is no longer canonicalized")
	}
}

// plainInteger's literals are those RFC 8785 writes as they are: for each
// literal it takes, jcs writes the literal's double as the literal; it
// refuses -0, leading zeros, fractions, exponents and integers of more than
// 15 digits, which the double's round trip handles.
func TestPlainIntegerIsCanonical(t *testing.T) {
	for lit, want := range map[string]bool{
		"0": true, "7": true, "1000": true, "-12": true, "999999999999999": true, "-999999999999999": true,
		"-0": false, "00": false, "01": false, "-": false, "": false, "1.0": false, "1e3": false, "1E3": false,
		"1000000000000000": false, "9007199254740993": false, "+1": false, "-01": false,
	} {
		if got := plainInteger([]byte(lit)); got != want {
			t.Fatalf("plainInteger(%q) = %v, want %v", lit, got, want)
		}
		if !want {
			continue
		}
		f, err := strconv.ParseFloat(lit, 64)
		if err != nil {
			t.Fatal(err)
		}
		if s, err := jcs.NumberToJSON(f); err != nil || s != lit {
			t.Fatalf("jcs writes %s as %q (%v), not as itself", lit, s, err)
		}
	}
}
