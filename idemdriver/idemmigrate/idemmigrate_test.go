package idemmigrate_test

import (
	"context"
	"database/sql"
	"fmt"
	"path/filepath"
	"testing"
	"testing/fstest"
	"time"

	"github.com/stretchr/testify/require"
	_ "modernc.org/sqlite"

	"github.com/idemgo/idem/idemdriver"
	"github.com/idemgo/idem/idemdriver/idemmigrate"
)

func sqliteDB(t *testing.T) *sql.DB {
	t.Helper()
	db, err := sql.Open("sqlite", filepath.Join(t.TempDir(), "m.db")+"?_pragma=busy_timeout(5000)&_pragma=journal_mode(WAL)")
	require.NoError(t, err)
	t.Cleanup(func() { db.Close() })
	return db
}

// Work under a lease stops when the lease is lost: Keep's renewal finds
// the row taken over (the successor moved the clock past the TTL) and
// cancels the work's context; stop reports why.
func TestKeepCancelsWorkWhenTheLeaseIsLost(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	leases := idemmigrate.NewLeases(sqliteDB(t), idemmigrate.SQLite, "")
	p := idemmigrate.LeaseParams{Name: "job", Holder: "a", TTL: 300 * time.Millisecond}
	x, err := leases.TryAcquire(ctx, p)
	require.NoError(t, err)
	work, stop := x.Keep(ctx)
	p.Holder, p.ClockOffset, p.TTL = "b", time.Hour, time.Hour
	y, err := leases.TryAcquire(ctx, p)
	require.NoError(t, err, "the clock moved past a's lease")
	require.Greater(t, y.Token(), x.Token())
	select {
	case <-work.Done():
	case <-time.After(10 * time.Second):
		t.Fatal("the work's context outlived its lease")
	}
	require.ErrorIs(t, stop(), idemdriver.ErrLockLost)
	require.ErrorIs(t, x.Refresh(ctx), idemdriver.ErrLockLost)
}

// A lease kept while its holder works is renewed (its row's locked_until
// moves forward: the renewals are observed, not timed), not lost; stop
// returns nil.
func TestKeepRenews(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := sqliteDB(t)
	leases := idemmigrate.NewLeases(db, idemmigrate.SQLite, "")
	x, err := leases.TryAcquire(ctx, idemmigrate.LeaseParams{Name: "job", Holder: "a", TTL: 3 * time.Second})
	require.NoError(t, err)
	until := func() (us int64) {
		require.NoError(t, db.QueryRowContext(ctx, `SELECT locked_until FROM idem_locks WHERE name = 'job'`).Scan(&us))
		return us
	}
	first := until()
	work, stop := x.Keep(ctx)
	require.Eventually(t, func() bool { return until() > first }, 20*time.Second, 10*time.Millisecond, "renewed")
	require.NoError(t, work.Err())
	_, err = leases.TryAcquire(ctx, idemmigrate.LeaseParams{Name: "job", Holder: "b", TTL: time.Minute})
	require.ErrorIs(t, err, idemdriver.ErrLockHeld)
	require.NoError(t, stop())
	require.NoError(t, x.Release(ctx))
	_, err = leases.TryAcquire(ctx, idemmigrate.LeaseParams{Name: "job", Holder: "b", TTL: time.Minute})
	require.NoError(t, err, "free once released")
}

// Status follows the tables that applied migrations create and drop: a
// table dropped by a later migration is not missing; one dropped by hand is.
func TestStatusMissingTables(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := sqliteDB(t)
	fsys := fstest.MapFS{
		"00001_a.sql": {Data: []byte("-- +goose Up\nCREATE TABLE a (id INTEGER);\nCREATE TABLE IF NOT EXISTS b (id INTEGER);\n-- +goose Down\nDROP TABLE b;\nDROP TABLE a;\n")},
		"00002_c.sql": {Data: []byte("-- +goose Up\n-- +goose StatementBegin\nCREATE TRIGGER t AFTER INSERT ON a BEGIN\n  SELECT 1;\nEND;\n-- +goose StatementEnd\nCREATE TABLE c (id INTEGER);\nDROP TABLE b;\n-- +goose Down\nDROP TABLE c;\nDROP TRIGGER IF EXISTS t;\nCREATE TABLE b (id INTEGER);\n")},
	}
	m, err := idemmigrate.New(idemmigrate.Config{Prefix: "test", DB: db, Dialect: idemmigrate.SQLite, FS: fsys, VersionTable: "v"})
	require.NoError(t, err)
	require.NoError(t, m.Up(ctx))
	list, err := m.Status(ctx)
	require.NoError(t, err)
	require.Len(t, list, 2)
	require.Empty(t, list[0].Missing, "b was dropped by 00002, a exists")
	require.Empty(t, list[1].Missing)
	_, err = db.ExecContext(ctx, `DROP TABLE a`)
	require.NoError(t, err)
	list, err = m.Status(ctx)
	require.NoError(t, err)
	require.True(t, list[0].Applied)
	require.Equal(t, []string{"a"}, list[0].Missing)
	require.Empty(t, list[1].Missing)

	down, err := m.Down(ctx)
	require.NoError(t, err)
	require.EqualValues(t, 2, down.Version)
}

// A failed version is reported with its statement; on SQLite (transactional
// DDL) nothing of it stays, so the message says nothing about undoing.
func TestUpError(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	m, err := idemmigrate.New(idemmigrate.Config{Prefix: "test", DB: sqliteDB(t), Dialect: idemmigrate.SQLite, VersionTable: "v",
		FS: fstest.MapFS{"00001_bad.sql": {Data: []byte("-- +goose Up\nCREATE TABLE ok (id INTEGER);\nCREATE TABLE (;\n")}}})
	require.NoError(t, err)
	err = m.Up(ctx)
	var e *idemmigrate.Error
	require.ErrorAs(t, err, &e)
	require.EqualValues(t, 1, e.Version)
	require.Equal(t, 2, e.Statement)
	require.Zero(t, e.LastApplied)
	require.NotContains(t, err.Error(), "undo")
}

// Up records the pending versions that Config.Present finds in the schema,
// in order, up to the first it does not find; that one and the later ones
// run. Present is asked of pending versions only.
func TestUpRecordsPresentVersions(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := sqliteDB(t)
	_, err := db.ExecContext(ctx, `CREATE TABLE a (id INTEGER); CREATE TABLE b (id INTEGER)`)
	require.NoError(t, err)
	set := fstest.MapFS{}
	for i, name := range []string{"a", "b", "c", "d"} {
		set[fmt.Sprintf("%05d_%s.sql", i+1, name)] = &fstest.MapFile{Data: []byte("-- +goose Up\nCREATE TABLE " + name + " (id INTEGER);\n")}
	}
	var asked []int64
	present := func(ctx context.Context, db idemmigrate.Queryer, version int64) (bool, error) {
		asked = append(asked, version)
		return idemmigrate.TableExists(ctx, db, idemmigrate.SQLite, string(rune('a'+version-1)))
	}
	m, err := idemmigrate.New(idemmigrate.Config{Prefix: "test", DB: db, Dialect: idemmigrate.SQLite, FS: set,
		VersionTable: "v", Present: present})
	require.NoError(t, err)
	require.NoError(t, m.Up(ctx), "a and b are recorded, not created again")
	require.Equal(t, []int64{1, 2, 3}, asked, "c is not present: it and d run")
	list, err := m.Status(ctx)
	require.NoError(t, err)
	require.Len(t, list, 4)
	for _, mig := range list {
		require.True(t, mig.Applied, "%+v", mig)
	}
	asked = nil
	require.NoError(t, m.Up(ctx))
	require.Empty(t, asked, "nothing pending, nothing asked")
}
