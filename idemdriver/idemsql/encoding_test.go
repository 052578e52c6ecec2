package idemsql

import (
	"database/sql"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/idemgo/idem/idemdriver"
)

// Regression: a SUCCEEDED record whose body column was NULLed (by hand, a
// partial restore) was replayed as an empty 201, and one whose headers
// column did not decode failed every claim of its key with an error the
// engine answers 503 "retry later", forever. Both are damaged records:
// DecodeResponse returns no response, which the engine answers 500
// response-missing.
func TestDecodeResponseDamaged(t *testing.T) {
	body := []byte(`{"id":"pay_1","amount":100}`)
	whole := ResponseColumns{Status: sql.NullInt64{Int64: 201, Valid: true}, Headers: []byte(`{"Location":["/p/1"]}`),
		Body: body, Stored: sql.NullBool{Bool: true, Valid: true}, Size: sql.NullInt64{Int64: int64(len(body)), Valid: true}}
	resp := DecodeResponse(idemdriver.StateSucceeded, whole)
	require.NotNil(t, resp)
	require.Equal(t, body, resp.Body)
	require.Equal(t, []string{"/p/1"}, resp.Header["Location"])

	damaged := map[string]func(*ResponseColumns){
		"NULL body":          func(c *ResponseColumns) { c.Body = nil },
		"cut body":           func(c *ResponseColumns) { c.Body = c.Body[:10] },
		"longer body":        func(c *ResponseColumns) { c.Body = append(append([]byte(nil), c.Body...), ' ') },
		"unreadable headers": func(c *ResponseColumns) { c.Headers = []byte{0x00, 0xff, 0x00, 0xff} },
		"headers not JSON":   func(c *ResponseColumns) { c.Headers = []byte(`{"Location":`) },
		"no status":          func(c *ResponseColumns) { c.Status = sql.NullInt64{} },
	}
	for name, damage := range damaged {
		c := whole
		damage(&c)
		require.Nil(t, DecodeResponse(idemdriver.StateSucceeded, c), name)
	}

	fine := map[string]func(*ResponseColumns){
		"empty body stored": func(c *ResponseColumns) {
			c.Body, c.Size = []byte{}, sql.NullInt64{Valid: true}
		},
		"NULL empty body": func(c *ResponseColumns) { // length and size agree: nothing to replay either way
			c.Body, c.Size = nil, sql.NullInt64{Valid: true}
		},
		"body not stored (over MaxResponseBytes)": func(c *ResponseColumns) {
			c.Body, c.Stored, c.Size = []byte{}, sql.NullBool{Valid: true}, sql.NullInt64{Int64: 5 << 20, Valid: true}
		},
		"no size recorded": func(c *ResponseColumns) { c.Size = sql.NullInt64{} },
		"NULL headers":     func(c *ResponseColumns) { c.Headers = nil },
		"sealed": func(c *ResponseColumns) { // the seal checks its blob, whose length is not the body's
			c.SealKey, c.Headers, c.Body = "key-1", nil, []byte("opaque sealed blob")
		},
	}
	for name, change := range fine {
		c := whole
		change(&c)
		got := DecodeResponse(idemdriver.StateSucceeded, c)
		require.NotNil(t, got, name)
		if c.SealKey == "" {
			require.NotNil(t, got.Body, "%s: a body, empty at least", name)
		}
	}
	require.Nil(t, DecodeResponse(idemdriver.StateProcessing, whole), "no response before SUCCEEDED")
}
