package main

import (
	"net/http"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/idemgo/idem"
)

// These tests need TEST_DATABASE_URL (for example
// postgres://postgres@127.0.0.1:5432/test?sslmode=disable): each runs on a
// fresh schema, dropped at the end. Without it they skip, or fail under CI.

func TestConcurrentIdenticalPostsPostgres(t *testing.T) {
	t.Parallel()
	testConcurrentIdenticalPosts(t, newPGTestStore(t))
}

func TestPostgresPaymentFlow(t *testing.T) {
	t.Parallel()
	s := startServer(t, newPGTestStore(t), nil)

	first := s.postJSON("acme", "pg-1", paymentBody)
	require.Equal(t, http.StatusCreated, first.status, "body: %s", first.body)
	second := s.postJSON("acme", "pg-1", paymentBody)
	require.Equal(t, "true", second.header.Get(idem.HeaderReplayed))
	require.Equal(t, first.body, second.body)

	r := s.postJSON("acme", "pg-1", `{"amount":2,"currency":"USD","customer":"x"}`)
	require.Equal(t, http.StatusUnprocessableEntity, r.status)

	require.Equal(t, http.StatusCreated, s.postJSON("acme", "pg-2", `{"amount":5,"currency":"usd","customer":"x"}`).status)
	require.Equal(t, balanceJSON{Merchant: "acme", Payments: 2, Totals: map[string]int64{"JPY": 1000, "USD": 5}}, s.balance("acme"))

	got := s.get("acme", first.header.Get("Location"))
	require.Equal(t, http.StatusOK, got.status)
	require.JSONEq(t, string(first.body), string(got.body))
	require.Equal(t, http.StatusNotFound, s.get("globex", first.header.Get("Location")).status)
	require.Contains(t, string(s.get("acme", "/v1/payments?limit=1").body), `"has_more":true`)

	// A failed write rolls back on PostgreSQL too, and the retry charges once.
	store := &failingWrites{Store: s.store}
	store.fail.Store(true)
	provider := NewFakeProvider(0)
	s2 := startServer(t, store, provider)
	require.Equal(t, http.StatusInternalServerError, s2.postJSON("acme", "pg-3", paymentBody).status)
	require.EqualValues(t, 2, s2.balance("acme").Payments)
	store.fail.Store(false)
	require.Equal(t, http.StatusCreated, s2.postJSON("acme", "pg-3", paymentBody).status)
	require.EqualValues(t, 3, s2.balance("acme").Payments)
	require.Equal(t, 1, provider.Charges())
}

func TestChargeRecordedOncePostgres(t *testing.T) {
	t.Parallel()
	for _, mode := range []WriteMode{WriteInClaim, WriteSeparate} {
		t.Run(string(mode), func(t *testing.T) {
			t.Parallel()
			testChargeRecordedOnce(t, newPGTestStore(t), mode)
		})
	}
}

func TestStalledOwnerIsFencedOutPostgres(t *testing.T) {
	t.Parallel()
	testStalledOwnerIsFencedOut(t, newPGTestStore(t), WriteInClaim)
}
