package main

import (
	"context"
	"testing"

	"github.com/stretchr/testify/require"

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
	testPaymentFlow(t, newMySQLTestStore(t))
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
