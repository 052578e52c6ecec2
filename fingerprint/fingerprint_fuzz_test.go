package fingerprint_test

import (
	"bytes"
	"encoding/json"
	"math/big"
	"strconv"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

// jsonNumber reports whether s is one JSON number and returns its exact
// value; small reports whether its exponent is within ±1000 (the bound of
// the exact canonical form, beyond which a body is hashed raw).
func jsonNumber(s string) (r *big.Rat, small, ok bool) {
	dec := json.NewDecoder(strings.NewReader(s))
	dec.UseNumber()
	var v any
	if dec.Decode(&v) != nil || dec.More() {
		return nil, false, false
	}
	n, isNum := v.(json.Number)
	if !isNum || string(n) != strings.TrimSpace(s) {
		return nil, false, false
	}
	exp := 0
	if i := strings.IndexAny(string(n), "eE"); i >= 0 {
		e, err := strconv.Atoi(strings.TrimPrefix(string(n)[i+1:], "+"))
		if err != nil {
			return nil, false, false
		}
		exp = e
	}
	if exp > 1000 || exp < -1000 || len(n) > 1000 {
		return nil, false, true
	}
	r, ok = new(big.Rat).SetString(string(n))
	return r, true, ok
}

// zeroLiteral reports whether the JSON number literal n is zero.
func zeroLiteral(n string) bool {
	mantissa, _, _ := strings.Cut(strings.ToLower(strings.TrimSpace(n)), "e")
	return strings.Trim(mantissa, "-0.") == ""
}

// FuzzFingerprint: two JSON bodies whose amounts differ as exact numbers
// never share a fingerprint, and the same body with its keys reordered
// (and other whitespace) always does (CONTRACT section 2).
func FuzzFingerprint(f *testing.F) {
	for _, seed := range [][2]string{
		{"100", "100"}, {"100", "1e2"}, {"100", "101"}, {"0.1", "0.10"}, {"19.99", "1999e-2"},
		{"9007199254740992", "9007199254740993"}, {"9007199254740993", "9007199254740993"},
		{"9007199254740993", "9007199254740993.0"}, {"0.1000000000000000055511151231257827", "0.1"},
		{"-0", "0"}, {"1e400", "1e400"}, {"1e400", "2e400"}, {"1e-999999", "2e-999999"}, {"123456789012345678901234567890", "123456789012345678901234567890e0"},
		{"0", "0e00000000000000001100"}, // found by fuzzing: zero with a huge exponent is zero
	} {
		f.Add(seed[0], seed[1])
	}
	f.Fuzz(func(t *testing.T, a, b string) {
		ra, smallA, okA := jsonNumber(a)
		rb, smallB, okB := jsonNumber(b)
		if !okA || !okB {
			t.Skip("not two JSON numbers")
		}
		first := fp("POST", "/v1/payments", "application/json", `{"amount":`+a+`,"currency":"JPY","meta":{"x":1,"y":[1,2]}}`)
		reordered := fp("POST", "/v1/payments", "application/json", "{ \"meta\": {\"y\":[1, 2], \"x\":1},\n\t\"currency\":\"JPY\", \"amount\": "+b+" }")
		if !smallA || !smallB {
			switch {
			case zeroLiteral(a) && zeroLiteral(b):
				// Zero however written is RFC 8785's 0, exponent or not.
				require.Equal(t, first, reordered, "%s and %s are both zero", a, b)
			case a != b:
				// Hashed raw: a different text is a different fingerprint.
				require.False(t, bytes.Equal(first, reordered), "%s and %s", a, b)
			}
			return
		}
		if ra.Cmp(rb) == 0 {
			require.Equal(t, first, reordered, "%s and %s are one number: a reordered body shares the fingerprint", a, b)
		} else {
			require.NotEqual(t, first, reordered, "%s and %s differ: they never share a fingerprint", a, b)
		}
	})
}
