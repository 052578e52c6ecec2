package idemsqlite_test

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/idemgo/idem/idemdriver"
	"github.com/idemgo/idem/idemdriver/idemdrivertest"
	"github.com/idemgo/idem/idemsqlite"
	"github.com/idemgo/idem/internal/dbtest"
)

func newDriver(t testing.TB) idemdriver.Driver {
	t.Helper()
	return dbtest.SQLite(t)
}

func TestConformance(t *testing.T) {
	idemdrivertest.Run(t, idemdrivertest.Harness{
		NewDriver: func(t *testing.T) idemdriver.Driver { return newDriver(t) },
		Unreachable: func(t *testing.T) idemdriver.Driver {
			d := newDriver(t).(*idemsqlite.Driver)
			require.NoError(t, d.Close())
			return d
		},
		Business: func(t *testing.T, d idemdriver.Driver) idemdrivertest.Business {
			db := d.(*idemsqlite.Driver).DB()
			_, err := db.Exec(`CREATE TABLE business_rows (id TEXT PRIMARY KEY)`)
			require.NoError(t, err)
			return dbtest.SQLBusiness{DB: db}
		},
		NewCountingDriver: func(t *testing.T) (idemdriver.Driver, func() int64) {
			db, n := openCounting(idemsqlite.DSN(dbtest.SQLitePath(t)))
			t.Cleanup(func() { db.Close() })
			d := idemsqlite.New(db)
			require.NoError(t, d.Migrate(context.Background()))
			return d, n.Load
		},
		// A claim reads first (a duplicate never waits for the writer), then
		// upserts; a completion in the claim's transaction adds BEGIN and
		// COMMIT.
		Budget:       map[string]int{"first": 3, "first-claim-tx": 5, "first-one-commit": 5, "replay-one-commit": 1, "replay": 1, "in-flight": 1, "key-reused": 1},
		SingleWriter: true,
		Maintenance:  true,
		Dump: func(t *testing.T, d idemdriver.Driver) [][]byte {
			return dbtest.DumpSQL(t, d.(*idemsqlite.Driver).DB(), "idem_keys")
		},
		Tamper: func(t *testing.T, d idemdriver.Driver, scope, key string, set map[string]any) {
			dbtest.TamperSQL(t, d.(*idemsqlite.Driver).DB(), scope, key, set)
		},
		SecondDriver: func(t *testing.T, d idemdriver.Driver) idemdriver.Driver {
			var file string
			err := d.(*idemsqlite.Driver).DB().QueryRow(`SELECT file FROM pragma_database_list WHERE name = 'main'`).Scan(&file)
			require.NoError(t, err)
			other, err := idemsqlite.Open(context.Background(), file)
			require.NoError(t, err)
			t.Cleanup(func() { other.Close() })
			return other
		},
	})
}

func BenchmarkDriver(b *testing.B) { idemdrivertest.Benchmark(b, newDriver) }

// Regression: a path with URI characters ('?', '#', '%') opened another file
// and lost the pragmas after the '?'.
func TestOpenPathWithURICharacters(t *testing.T) {
	for _, name := range []string{"a?b.db", "c#d.db", "e%41.db", "plain.db"} {
		path := filepath.Join(t.TempDir(), name)
		d, err := idemsqlite.Open(context.Background(), path)
		require.NoError(t, err)
		require.NoError(t, d.Migrate(context.Background()))
		var mode string
		require.NoError(t, d.DB().QueryRow(`PRAGMA journal_mode`).Scan(&mode))
		require.Equal(t, "wal", mode, name)
		require.NoError(t, d.Close())
		_, err = os.Stat(path)
		require.NoError(t, err, "the file is created under its own name %q", name)
	}
}

// Processes opening one new file at the same time both migrate it; the
// one that loses the race runs again and finds the versions applied.
// Regression: it failed with "table idem_keys already exists" (about every
// other run of cmd/internal/service's TestOpenSQLite under -count=10), and,
// under load, Open itself with SQLITE_BUSY while the file turned to WAL.
func TestMigrateConcurrently(t *testing.T) {
	t.Parallel()
	for round := range 3 {
		path := filepath.Join(t.TempDir(), fmt.Sprintf("m%d.db", round))
		errs := make(chan error, 3)
		for range 3 {
			go func() {
				d, err := idemsqlite.Open(context.Background(), path)
				if err == nil {
					err = d.Migrate(context.Background())
					d.Close()
				}
				errs <- err
			}()
		}
		for range 3 {
			require.NoError(t, <-errs, "round %d", round)
		}
	}
}

// The maintenance lock's table is migration 00002's: asking for the lock
// before Migrate fails and creates nothing, so Migrate still applies 00002.
func TestMaintenanceLockBeforeMigrate(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	d, err := idemsqlite.Open(ctx, dbtest.SQLitePath(t))
	require.NoError(t, err)
	t.Cleanup(func() { d.Close() })
	_, err = d.TryLockMaintenance(ctx, idemdriver.LockParams{TTL: time.Minute})
	require.ErrorContains(t, err, "run Migrate first")
	require.NoError(t, d.Migrate(ctx))
	l, err := d.TryLockMaintenance(ctx, idemdriver.LockParams{TTL: time.Minute})
	require.NoError(t, err)
	require.NoError(t, l.Release(ctx))
}
