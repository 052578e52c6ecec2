package idem

import (
	"net/http"
	"net/http/httptest"
	"testing"

	"github.com/gowebpki/jcs"
)

// FuzzCanonicalMatchesJCS: wherever the single-pass canonicalizer answers,
// its output is jcs.Transform's, byte for byte (Fingerprint depends on it:
// a stored fingerprint must not change); and when it finds an inexact
// number, the general path's numbersExact agrees.
func FuzzCanonicalMatchesJCS(f *testing.F) {
	for _, seed := range canonicalSeeds {
		f.Add([]byte(seed))
	}
	f.Fuzz(func(t *testing.T, body []byte) {
		canon, ok, exact := canonicalJSON(body)
		if ok {
			want, err := jcs.Transform(body)
			if err != nil {
				t.Fatalf("canonicalJSON(%q) = %q; jcs.Transform refuses it: %v", body, canon, err)
			}
			if string(canon) != string(want) {
				t.Fatalf("canonicalJSON(%q) = %q, jcs.Transform = %q", body, canon, want)
			}
		}
		if !exact && numbersExact(body) {
			t.Fatalf("canonicalJSON(%q) found an inexact number; numbersExact finds none", body)
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

// TestCanonicalFastPath: the common bodies take the single pass, the others
// are left to the general path.
func TestCanonicalFastPath(t *testing.T) {
	t.Parallel()
	for body, want := range map[string]bool{
		canonicalSeeds[0]: true, canonicalSeeds[1]: true, canonicalSeeds[2]: false, // the surrogate pair
		`{"a":1,"a":2}`: false, `[9007199254740993]`: false, `{"a":1} {"b":2}`: false, ` 12 `: false,
		"{\"a\":\"\xff\"}": false, `[[],[[]],{}]`: true,
	} {
		if _, ok, _ := canonicalJSON([]byte(body)); ok != want {
			t.Errorf("canonicalJSON(%q) ok = %v, want %v", body, ok, want)
		}
	}
}

// BenchmarkFingerprint: a payment's JSON body, the common case.
func BenchmarkFingerprint(b *testing.B) {
	body := []byte(canonicalSeeds[0])
	r := httptest.NewRequest(http.MethodPost, "/v1/payments", nil)
	r.Header.Set("Content-Type", "application/json")
	b.ReportAllocs()
	for b.Loop() {
		Fingerprint(r, body)
	}
}
