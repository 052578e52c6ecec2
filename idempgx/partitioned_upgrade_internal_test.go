package idempgx

import (
	"context"
	"io/fs"
	"strings"
	"testing"
	"testing/fstest"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/idemgo/idem/idemdriver"
	"github.com/idemgo/idem/internal/dbtest"
)

// A partitioned store migrated before steps (version 5, its partitions
// made) and then to today's schema: the completer's index of FAILED
// records, created ON ONLY the partitioned table by 00007, is built on
// every partition that predates it and attached, so PostgreSQL marks it
// valid. A FAILED record made before the upgrade is in one of them.
func TestPartitionedUpgradeIndexesEveryPartition(t *testing.T) {
	t.Parallel()
	url, _ := dbtest.PostgresURL(t)
	pool, err := pgxpool.New(context.Background(), url)
	require.NoError(t, err)
	t.Cleanup(pool.Close)
	ctx := context.Background()
	d := NewPartitioned(pool, PartitionConfig{})

	all, err := fs.Sub(migrations, "migrations_partitioned")
	require.NoError(t, err)
	old := fstest.MapFS{}
	require.NoError(t, fs.WalkDir(all, ".", func(name string, e fs.DirEntry, err error) error {
		if err != nil || e.IsDir() || strings.Compare(name, "00006") >= 0 {
			return err
		}
		b, err := fs.ReadFile(all, name)
		old[name] = &fstest.MapFile{Data: b}
		return err
	}))
	require.Len(t, old, 5)
	require.NoError(t, d.MigrateFS(ctx, old, PartitionedSchemaVersionTable))
	before, err := d.Partitions(ctx)
	require.NoError(t, err)
	require.NotEmpty(t, before)

	res, err := d.Claim(ctx, idemdriver.ClaimParams{Scope: "acct", Key: "k", Method: "POST", Path: "/p",
		Fingerprint: []byte("f"), LeaseDuration: time.Minute, Retention: time.Hour, Owner: "o"})
	require.NoError(t, err)
	ok, err := d.Fail(ctx, idemdriver.FenceParams{Scope: "acct", Key: "k", FencingToken: res.Record.FencingToken,
		CreatedAt: res.Record.CreatedAt})
	require.NoError(t, err)
	require.True(t, ok)

	require.NoError(t, d.Migrate(ctx))
	var valid bool
	var indexed, parts int
	require.NoError(t, pool.QueryRow(ctx, `SELECT x.indisvalid,
			(SELECT count(*) FROM pg_inherits WHERE inhparent = x.indexrelid),
			(SELECT count(*) FROM pg_inherits WHERE inhparent = to_regclass('idem_keys'))
		FROM pg_index x WHERE x.indexrelid = to_regclass('idem_keys_failed')`).Scan(&valid, &indexed, &parts))
	require.True(t, valid, "idem_keys_failed is valid once every partition's index is attached")
	require.Equal(t, parts, indexed)
	require.Equal(t, len(before)+1, parts, "the daily partitions and idem_keys_unknown")
	left, err := d.unindexed(ctx)
	require.NoError(t, err)
	require.Empty(t, left)
}
