package idempgx_test

import (
	"context"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/idemgo/idem/idempgx"
	"github.com/idemgo/idem/internal/dbtest"
)

// Processes starting together on a fresh schema migrate one at a time.
// Regression: goose creates its version table before taking its session
// lock, so concurrent first Migrate calls raced on CREATE TABLE and some
// failed with 23505 on pg_type_typname_nsp_index (1 in 8 behind pgbouncer).
// Rounds of 8 concurrent calls on fresh schemas: failures are counted, and
// must be none.
func TestMigrateConcurrentlyOnFreshSchemas(t *testing.T) {
	t.Parallel()
	const rounds, callers = 6, 8
	var failures atomic.Int64
	var firstErr error
	var once sync.Once
	for r := 0; r < rounds; r++ {
		url, schema := dbtest.PostgresURL(t)
		var wg sync.WaitGroup
		for i := 0; i < callers; i++ {
			cfg, err := pgxpool.ParseConfig(url)
			require.NoError(t, err)
			cfg.MaxConns = 2
			opts := idempgx.Options{}
			if testPooler != "" { // behind a pooler: no search_path, the schema named
				delete(cfg.ConnConfig.RuntimeParams, "search_path")
				opts.Schema = schema
			}
			pool, err := pgxpool.NewWithConfig(context.Background(), cfg)
			require.NoError(t, err)
			t.Cleanup(pool.Close)
			d, err := idempgx.NewWithOptions(pool, opts)
			require.NoError(t, err)
			wg.Add(1)
			go func() {
				defer wg.Done()
				if err := d.Migrate(context.Background()); err != nil {
					failures.Add(1)
					once.Do(func() { firstErr = err })
				}
			}()
		}
		wg.Wait()
	}
	require.Zero(t, failures.Load(), "%d of %d concurrent Migrate calls failed; the first: %v", failures.Load(), rounds*callers, firstErr)
}
