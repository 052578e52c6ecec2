package main

import (
	"context"
	"net/http"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/idemgo/idem"
	"github.com/idemgo/idem/internal/dbtest"
)

// These tests need TEST_MYSQL_URL (for example
// mysql://root@127.0.0.1:3306/test): each runs on a fresh database, dropped
// at the end. Without it they skip, or fail under CI.

// newMySQLTestStore opens a migrated Store on a fresh database through the
// same URL path as --database-url.
func newMySQLTestStore(t *testing.T) Store {
	t.Helper()
	url, _ := dbtest.MySQLURL(t)
	s, err := openStore(context.Background(), url)
	require.NoError(t, err)
	t.Cleanup(func() { s.Close() })
	return s
}

func TestConcurrentIdenticalPostsMySQL(t *testing.T) {
	t.Parallel()
	testConcurrentIdenticalPosts(t, newMySQLTestStore(t))
}

func TestMySQLPaymentFlow(t *testing.T) {
	t.Parallel()
	s := startServer(t, newMySQLTestStore(t), nil)

	first := s.postJSON("acme", "my-1", paymentBody)
	require.Equal(t, http.StatusCreated, first.status, "body: %s", first.body)
	second := s.postJSON("acme", "my-1", paymentBody)
	require.Equal(t, "true", second.header.Get(idem.HeaderReplayed))
	require.Equal(t, first.body, second.body)
	require.Equal(t, http.StatusUnprocessableEntity, s.postJSON("acme", "my-1", `{"amount":2,"currency":"USD","customer":"x"}`).status)

	require.Equal(t, http.StatusCreated, s.postJSON("acme", "my-2", `{"amount":5,"currency":"usd","customer":"x"}`).status)
	require.Equal(t, balanceJSON{Merchant: "acme", Payments: 2, Totals: map[string]int64{"JPY": 1000, "USD": 5}}, s.balance("acme"))
	require.Equal(t, balanceJSON{Merchant: "ACME", Payments: 0, Totals: map[string]int64{}}, s.balance("ACME"), "merchants compare byte by byte")

	got := s.get("acme", first.header.Get("Location"))
	require.Equal(t, http.StatusOK, got.status)
	require.JSONEq(t, string(first.body), string(got.body))
	require.Equal(t, http.StatusNotFound, s.get("globex", first.header.Get("Location")).status)
	require.Contains(t, string(s.get("acme", "/v1/payments?limit=1").body), `"has_more":true`)

	// A failed write rolls back, and the retry charges once.
	store := &failingWrites{Store: s.store}
	store.fail.Store(true)
	provider := NewFakeProvider(0)
	s2 := startServer(t, store, provider)
	require.Equal(t, http.StatusInternalServerError, s2.postJSON("acme", "my-3", paymentBody).status)
	require.EqualValues(t, 2, s2.balance("acme").Payments)
	store.fail.Store(false)
	require.Equal(t, http.StatusCreated, s2.postJSON("acme", "my-3", paymentBody).status)
	require.EqualValues(t, 3, s2.balance("acme").Payments)
	require.Equal(t, 1, provider.Charges())
}

func TestChargeRecordedOnceMySQL(t *testing.T) {
	t.Parallel()
	for _, mode := range []WriteMode{WriteInClaim, WriteSeparate} {
		t.Run(string(mode), func(t *testing.T) {
			t.Parallel()
			testChargeRecordedOnce(t, newMySQLTestStore(t), mode)
		})
	}
}

func TestStalledOwnerIsFencedOutMySQL(t *testing.T) {
	t.Parallel()
	testStalledOwnerIsFencedOut(t, newMySQLTestStore(t), WriteInClaim)
}
