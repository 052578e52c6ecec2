package main

import (
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/idemgo/idem/internal/dbtest"
)

// EnvRedis names the variable holding the Redis server's URL for the naive
// comparison (scripts/test sets it when redis-server is installed).
const EnvRedis = "TEST_REDIS_URL"

// TestNaiveStormDoubleCharges proves that the storm detects double
// charges: the same storm against paymentsd --naive (the Redis response
// cache) must find some. Each logical payment's four copies arrive within
// 20 ms of each other while its charge takes 200 ms, so they all miss the
// cache, and each one charges: a double is all but certain for every
// payment, and the test asks for one.
func TestNaiveStormDoubleCharges(t *testing.T) {
	t.Parallel()
	redisURL := dbtest.RequireURL(t, EnvRedis)
	code, rep, _ := runStorm(t, []string{
		"--paymentsd-bin", paymentsdBin(t), "--database-url", "sqlite:" + filepath.Join(t.TempDir(), "naive.db"),
		"--naive", "--redis-url", redisURL,
		"--payments", "40", "--duplicates", "4", "--merchants", "4",
		"--timeout-rate", "0", "--cancel-rate", "0", "--deadline", "60s",
	}, "--psp-latency", "200ms", "--naive-ttl", "10m")
	require.NotNil(t, rep)
	require.Equal(t, exitFailed, code)
	require.False(t, rep.Verdict.OK)
	require.Equal(t, "naive", rep.Mode)
	rec := rep.Reconciliation
	require.True(t, rec.Exact, "at most 4 x 10 payments per merchant: listed whole")
	require.Positive(t, rec.DoublePayments, "the naive cache lets concurrent duplicates charge again")
	require.Positive(t, rec.DivergentAnswers, "copies of one payment were answered different payments")
	require.Zero(t, rec.Lost)
	require.Zero(t, rec.Unfinished)
	require.Equal(t, 40, rec.Found)
	require.EqualValues(t, 40+rec.DoublePayments, rec.LedgerPayments)
	require.Equal(t, "naive mode keeps no idem records", rep.Records.Skipped)
	require.Contains(t, rep.Verdict.Failures[0], "double payments in the ledger")
}
