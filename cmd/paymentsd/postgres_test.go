package main

import "testing"

// These tests need TEST_DATABASE_URL (for example
// postgres://postgres@127.0.0.1:5432/test?sslmode=disable): each runs on a
// fresh schema, dropped at the end. Without it they skip, or fail under CI.

func TestConcurrentIdenticalPostsPostgres(t *testing.T) {
	t.Parallel()
	testConcurrentIdenticalPosts(t, newPGTestStore(t))
}

func TestPostgresPaymentFlow(t *testing.T) {
	t.Parallel()
	testPaymentFlow(t, newPGTestStore(t))
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
