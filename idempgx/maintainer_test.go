package idempgx_test

import (
	"context"
	"testing"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/idemgo/idem/idempgx"
	"github.com/idemgo/idem/retention"
)

// A maintainer that ensures fewer days of partitions than the store's own
// is refused. Regression: with DaysAhead 2 on a store allowing 6 days of
// retention, every claim with that retention failed ErrNoPartition (503)
// once the partitions ahead ran out; a negative DaysAhead was accepted.
func TestMaintainerDaysAheadCoversTheStore(t *testing.T) {
	pool, err := pgxpool.New(context.Background(), "postgres://nobody@127.0.0.1:1/none") // never dialled
	require.NoError(t, err)
	t.Cleanup(pool.Close)
	store := idempgx.NewPartitioned(pool, idempgx.PartitionConfig{DaysAhead: 7}) // MaxRetention 6 days

	_, err = retention.NewMaintainer(store, retention.Config{DaysAhead: 2})
	require.ErrorContains(t, err, "DaysAhead 2 is less than the store's 7 days ahead")
	_, err = retention.NewMaintainer(store, retention.Config{DaysAhead: -3})
	require.ErrorContains(t, err, "DaysAhead not negative")
	for _, ok := range []int{0, 7, 10} {
		_, err = retention.NewMaintainer(store, retention.Config{DaysAhead: ok})
		require.NoError(t, err, "DaysAhead %d", ok)
	}
}
