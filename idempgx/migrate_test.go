package idempgx_test

import (
	"context"
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
// Rounds of 8 concurrent calls on fresh schemas, released together: none
// may fail.
func TestMigrateConcurrentlyOnFreshSchemas(t *testing.T) {
	t.Parallel()
	const rounds, callers = 6, 8
	for r := 0; r < rounds; r++ {
		url, schema := dbtest.PostgresURL(t)
		var ds []*idempgx.Driver
		var pools []*pgxpool.Pool
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
			t.Cleanup(pool.Close) // a failed round's; Close is idempotent
			pools = append(pools, pool)
			d, err := idempgx.NewWithOptions(pool, opts)
			require.NoError(t, err)
			ds = append(ds, d)
		}
		var next atomic.Int64
		_, err := dbtest.Race(len(ds), func() (struct{}, error) {
			return struct{}{}, ds[next.Add(1)-1].Migrate(context.Background())
		})
		require.NoError(t, err, "round %d: concurrent Migrate calls", r)
		// A round's pools end with it: kept to the test's end, six rounds
		// held about 50 of PostgreSQL's 100 connections, and a parallel
		// test that needs 66 (TestPartitionedClaimsStraddlingMidnightUnderTheLock)
		// made a round fail with too many clients.
		for _, p := range pools {
			p.Close()
		}
	}
}

// Behind a transaction pooler, exec, simple_protocol and cache_describe
// work; pgx's default cache_statement (42P05, 26000) and describe_exec
// (26000) do not, as runs of the conformance suite through pgbouncer 1.18
// in pool_mode=transaction showed. NewWithOptions with TransactionPooler
// refuses those two at once, naming the knob.
func TestTransactionPoolerExecModes(t *testing.T) {
	t.Parallel()
	for mode, works := range map[string]bool{
		"exec": true, "simple_protocol": true, "cache_describe": true,
		"cache_statement": false, "describe_exec": false, "": false, // "" is pgx's default, cache_statement
	} {
		url := "postgres://nobody@127.0.0.1:1/none" // never dialled
		if mode != "" {
			url += "?default_query_exec_mode=" + mode
		}
		pool, err := pgxpool.New(context.Background(), url)
		require.NoError(t, err)
		t.Cleanup(pool.Close)
		_, err = idempgx.NewWithOptions(pool, idempgx.Options{TransactionPooler: true})
		if works {
			require.NoError(t, err, mode)
			continue
		}
		require.ErrorIs(t, err, idempgx.ErrPoolerExecMode, mode)
		require.ErrorContains(t, err, "default_query_exec_mode=exec", mode)
		_, err = idempgx.NewWithOptions(pool, idempgx.Options{})
		require.NoError(t, err, "without a declared pooler any mode is accepted")
	}
	_, err := idempgx.NewWithOptions(nil, idempgx.Options{Schema: "Bad-Name"})
	require.ErrorContains(t, err, "not a plain lower-case identifier")
	_, err = idempgx.NewWithOptions(nil, idempgx.Options{Schema: "ok", Partitioned: &idempgx.PartitionConfig{}})
	require.ErrorContains(t, err, "not available for a partitioned store")
}
