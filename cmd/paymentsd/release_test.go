package main

import (
	"net/http"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/idemgo/idem"
)

// A payment refused by paymentsd's own validation (400 invalid-request,
// 415 unsupported-media-type) does not burn its key: the corrected request
// with the same key is charged (regression, issue 13 item 10: the 415 was
// recorded, and the corrected request got 422 key-reused).
func TestValidationFailureKeepsTheKey(t *testing.T) {
	t.Parallel()
	s := startServer(t, newSQLiteStore(t), nil)
	for _, tc := range []struct {
		name, key, contentType, body string
		status                       int
	}{
		{"415", "fix-1", "text/plain", paymentBody, http.StatusUnsupportedMediaType},
		{"400 invalid-params", "fix-2", "application/json", `{"amount":-5,"currency":"JPY","customer":"c"}`, http.StatusBadRequest},
		{"400 not JSON", "fix-3", "application/json", `{"amount":`, http.StatusBadRequest},
	} {
		r := s.do(http.MethodPost, "/v1/payments", tc.body, "Authorization", auth("acme"),
			"Idempotency-Key", tc.key, "Content-Type", tc.contentType)
		require.Equal(t, tc.status, r.status, "%s: %s", tc.name, r.body)
		again := s.do(http.MethodPost, "/v1/payments", tc.body, "Authorization", auth("acme"),
			"Idempotency-Key", tc.key, "Content-Type", tc.contentType)
		require.Equal(t, tc.status, again.status, "%s again: %s", tc.name, again.body)
		require.Empty(t, again.header.Get(idem.HeaderReplayed), "%s: validated again, not replayed", tc.name)

		fixed := s.postJSON("acme", tc.key, paymentBody)
		require.Equal(t, http.StatusCreated, fixed.status, "%s: the corrected request runs: %s", tc.name, fixed.body)
	}
	require.EqualValues(t, 3, s.balance("acme").Payments)
}
