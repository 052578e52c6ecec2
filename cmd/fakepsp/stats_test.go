package main

import (
	"bytes"
	"context"
	"encoding/json"
	"net/http"
	"testing"

	"github.com/stretchr/testify/require"
)

// testStatsBeyondInt64: 1024 charges of MaxAmount (2^53) for one merchant
// sum to 2^63, one past the largest int64; GET /v1/charges/stats answers
// the exact total (regression: 500 on SQLite, "integer overflow", and on
// PostgreSQL, "bigint out of range"). insert writes the charges.
func testStatsBeyondInt64(t *testing.T, store Store, insert func(ctx context.Context) error) {
	p := startPSP(t, handlerConfig{Store: store})
	require.NoError(t, insert(context.Background()))
	require.Equal(t, http.StatusCreated, p.charge("whale", "small-1", "application/json",
		`{"amount":7,"currency":"JPY","customer":"c"}`).status)

	r, err := p.do(http.DefaultClient, http.MethodGet, "/v1/charges/stats", "")
	require.NoError(t, err)
	require.Equal(t, http.StatusOK, r.status, "body: %s", r.body)
	// Decoded as json.Number: the exact digits.
	dec := json.NewDecoder(bytes.NewReader(r.body))
	dec.UseNumber()
	var st struct {
		Merchants map[string]struct {
			Charges json.Number            `json:"charges"`
			Amount  map[string]json.Number `json:"amount"`
		} `json:"merchants"`
		Charges json.Number `json:"charges"`
	}
	require.NoError(t, dec.Decode(&st), "body: %s", r.body)
	require.Equal(t, json.Number("1025"), st.Charges)
	require.Equal(t, json.Number("1025"), st.Merchants["whale"].Charges)
	require.Equal(t, map[string]json.Number{"USD": "9223372036854775808", "JPY": "7"}, st.Merchants["whale"].Amount,
		"body: %s", r.body)
}

func TestStatsBeyondInt64SQLite(t *testing.T) {
	t.Parallel()
	store := newSQLiteStore(t)
	testStatsBeyondInt64(t, store, func(ctx context.Context) error {
		_, err := store.(*sqliteStore).SQL.ExecContext(ctx, `WITH RECURSIVE n(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM n WHERE i < 1024)
			INSERT INTO charges (id, merchant, amount, currency, customer, created_at)
			SELECT 'ch_big_' || i, 'whale', ?, 'USD', 'c', 0 FROM n`, MaxAmount)
		return err
	})
}

func TestStatsBeyondInt64Postgres(t *testing.T) {
	t.Parallel()
	store := newPostgresStore(t)
	testStatsBeyondInt64(t, store, func(ctx context.Context) error {
		_, err := store.(*postgresStore).Pool.Exec(ctx, `INSERT INTO charges (id, merchant, amount, currency, customer)
			SELECT 'ch_big_' || i, 'whale', $1, 'USD', 'c' FROM generate_series(1, 1024) AS i`, int64(MaxAmount))
		return err
	})
}
