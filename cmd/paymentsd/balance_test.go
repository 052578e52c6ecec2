package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/idemgo/idem/cmd/internal/service"
)

// testBalanceBeyondInt64: 1024 payments of MaxAmount (2^53) for one
// merchant sum to 2^63, one past the largest int64. GET /v1/balance
// answers the exact total (regression: 503 for ever on SQLite, "integer
// overflow", and on PostgreSQL, "bigint out of range"; a wrapped, wrong
// total on MariaDB).
func testBalanceBeyondInt64(t *testing.T, store Store) {
	s := startServer(t, store, nil)
	ctx := context.Background()
	const n = 1024
	for i := range n {
		_, err := store.CreatePayment(ctx, NewPayment{Payment: service.Payment{ID: fmt.Sprintf("pay_big_%04d", i), Merchant: "whale", Amount: MaxAmount,
			Currency: "USD", Customer: "c"}, Status: "succeeded", ProviderChargeID: fmt.Sprintf("ch_big_%04d", i)}, WriteSeparate)
		require.NoError(t, err)
	}
	_, err := store.CreatePayment(ctx, NewPayment{Payment: service.Payment{ID: "pay_small", Merchant: "whale", Amount: 7,
		Currency: "JPY", Customer: "c"}, Status: "succeeded", ProviderChargeID: "ch_small"}, WriteSeparate)
	require.NoError(t, err)

	r := s.get("whale", "/v1/balance")
	require.Equal(t, http.StatusOK, r.status, "body: %s", r.body)
	// Decoded as json.Number: the exact digits (require.JSONEq compares
	// float64s, which cannot tell 2^63 from 2^63 - 1).
	dec := json.NewDecoder(bytes.NewReader(r.body))
	dec.UseNumber()
	var b struct {
		Merchant string                 `json:"merchant"`
		Payments json.Number            `json:"payments"`
		Totals   map[string]json.Number `json:"totals"`
	}
	require.NoError(t, dec.Decode(&b), "body: %s", r.body)
	require.Equal(t, "whale", b.Merchant)
	require.Equal(t, json.Number("1025"), b.Payments)
	require.Equal(t, map[string]json.Number{"USD": "9223372036854775808", "JPY": "7"}, b.Totals, "body: %s", r.body)
}

func TestBalanceBeyondInt64(t *testing.T) {
	t.Parallel()
	onEachDatabase(t, testBalanceBeyondInt64)
}
