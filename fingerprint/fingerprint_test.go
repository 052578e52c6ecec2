package fingerprint_test

import (
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/idemgo/idem/fingerprint"
)

func fp(method, target, contentType, body string) []byte {
	r := httptest.NewRequest(method, target, strings.NewReader(body))
	if contentType != "" {
		r.Header.Set("Content-Type", contentType)
	}
	return fingerprint.Request(r, []byte(body))
}

func TestFingerprint(t *testing.T) {
	t.Parallel()
	base := fp("POST", "/v1/payments?a=1&b=2", "application/json", `{"amount":100,"currency":"JPY"}`)
	require.Len(t, base, 32, "SHA-256")

	same := map[string][]byte{
		"key order and whitespace (RFC 8785)": fp("POST", "/v1/payments?a=1&b=2", "application/json", "{ \"currency\": \"JPY\",\n \"amount\": 100 }"),
		"number forms (RFC 8785 3.2.2.3)":     fp("POST", "/v1/payments?a=1&b=2", "application/json", `{"amount":1.00e2,"currency":"JPY"}`),
		"query order":                         fp("POST", "/v1/payments?b=2&a=1", "application/json", `{"amount":100,"currency":"JPY"}`),
		"media type parameters and case":      fp("POST", "/v1/payments?a=1&b=2", "Application/JSON; charset=utf-8", `{"amount":100,"currency":"JPY"}`),
	}
	for name, got := range same {
		require.Equal(t, base, got, name)
	}

	differ := map[string][]byte{
		"value":                   fp("POST", "/v1/payments?a=1&b=2", "application/json", `{"amount":101,"currency":"JPY"}`),
		"method":                  fp("PATCH", "/v1/payments?a=1&b=2", "application/json", `{"amount":100,"currency":"JPY"}`),
		"path":                    fp("POST", "/v1/refunds?a=1&b=2", "application/json", `{"amount":100,"currency":"JPY"}`),
		"query value":             fp("POST", "/v1/payments?a=1&b=3", "application/json", `{"amount":100,"currency":"JPY"}`),
		"no query":                fp("POST", "/v1/payments", "application/json", `{"amount":100,"currency":"JPY"}`),
		"media type":              fp("POST", "/v1/payments?a=1&b=2", "text/plain", `{"amount":100,"currency":"JPY"}`),
		"array order is semantic": fp("POST", "/v1/payments?a=1&b=2", "application/json", `{"amount":100,"currency":"JPY","x":[1,2]}`),
	}
	for name, got := range differ {
		require.NotEqual(t, base, got, name)
	}

	// Non-JSON bodies are raw bytes: whitespace counts.
	require.NotEqual(t,
		fp("POST", "/v1/payments", "application/x-www-form-urlencoded", "amount=100&currency=JPY"),
		fp("POST", "/v1/payments", "application/x-www-form-urlencoded", "currency=JPY&amount=100"))
	// Invalid JSON falls back to raw bytes instead of failing.
	require.Len(t, fp("POST", "/v1/payments", "application/json", `{"amount":`), 32)
	// +json media types are canonicalized too.
	require.Equal(t,
		fp("POST", "/x", "application/merge-patch+json", `{"a":1,"b":2}`),
		fp("POST", "/x", "application/merge-patch+json", `{"b":2, "a":1}`))
	// Regression: RFC 8785 writes numbers as doubles, so a changed amount
	// beyond 2^53 was replayed instead of answered 422.
	big := fp("POST", "/x", "application/json", `{"amount":9007199254740992}`)
	require.NotEqual(t, big, fp("POST", "/x", "application/json", `{"amount":9007199254740993}`))
	require.NotEqual(t, big, fp("POST", "/x", "application/json", `{"amount":9007199254740992.4}`))
	require.NotEqual(t,
		fp("POST", "/x", "application/json", `{"a":0.1000000000000000055511151231257827}`),
		fp("POST", "/x", "application/json", `{"a":0.1}`), "0.1 is not a double: hashed raw")
	require.Equal(t, big, fp("POST", "/x", "application/json", `{ "amount": 9007199254740992 }`),
		"exact numbers are still canonicalized")
	require.Equal(t,
		fp("POST", "/x", "application/json", `{"a":0.1,"b":19.99,"c":-0.0}`),
		fp("POST", "/x", "application/json", `{"c":0, "b":1999e-2, "a":0.10}`), "decimals are canonicalized")
	require.Equal(t, fp("POST", "/x", "application/json", `{"a":1e400}`), fp("POST", "/x", "application/json", `{"a":1e400}`))
	require.NotEqual(t, fp("POST", "/x", "application/json", `{"a":1e400}`), fp("POST", "/x", "application/json", `{"a":2e400}`))
	// A query that does not parse is hashed raw: ParseQuery drops the pairs
	// it cannot read, so a changed amount was replayed (regression).
	require.NotEqual(t, fp("POST", "/x?amount=100;currency=EUR", "", ""), fp("POST", "/x?amount=999;currency=EUR", "", ""))
	require.NotEqual(t, fp("POST", "/x?to=%zzacct1", "", ""), fp("POST", "/x?to=%zzacct2", "", ""))
	require.NotEqual(t, fp("POST", "/x?a=1&b=%zz", "", ""), fp("POST", "/x?a=1", "", ""))
	// Zero however written is one number; a non-zero number too small for a
	// double is not zero (it is hashed raw).
	require.Equal(t, fp("POST", "/x", "application/json", `{"a":0}`), fp("POST", "/x", "application/json", `{"a":-0.0e999999}`))
	require.NotEqual(t, fp("POST", "/x", "application/json", `{"a":0}`), fp("POST", "/x", "application/json", `{"a":1e-999999}`))
	require.NotEqual(t, fp("POST", "/x", "application/json", `{"a":1e-999999}`), fp("POST", "/x", "application/json", `{"a":2e-999999}`))
	// Parts are length-prefixed: moving bytes between path and body changes the hash.
	require.NotEqual(t, fp("POST", "/ab", "", "c"), fp("POST", "/a", "", "bc"))
}

// BenchmarkFingerprintHugeExponent is the cost of a hostile number: before
// the cheap checks came first, big.Rat computed 10^999999 to find
// 1e-999999 inexact (about 25 ms a request; now microseconds).
func BenchmarkFingerprintHugeExponent(b *testing.B) {
	body := []byte(`{"amount":1e-999999,"currency":"JPY"}`)
	r := httptest.NewRequest("POST", "/v1/payments", nil)
	r.Header.Set("Content-Type", "application/json")
	for b.Loop() {
		fingerprint.Request(r, body)
	}
}
