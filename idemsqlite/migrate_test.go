package idemsqlite_test

import (
	"context"
	"database/sql"
	"io/fs"
	"os"
	"strconv"
	"strings"
	"testing"
	"testing/fstest"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/idemgo/idem/idemdriver"
	"github.com/idemgo/idem/idemsqlite"
	"github.com/idemgo/idem/internal/dbtest"
)

// migratedTo opens a new file with idem's migrations applied up to version
// (their files from migrations/, recorded in the version table Migrate
// uses, so that a later Migrate applies the rest).
func migratedTo(t *testing.T, version int) *idemsqlite.Driver {
	t.Helper()
	d, err := idemsqlite.Open(context.Background(), dbtest.SQLitePath(t))
	require.NoError(t, err)
	t.Cleanup(func() { d.Close() })
	migrateTo(t, d, version)
	return d
}

// migrateTo applies idem's migrations up to version to d's file, as
// migratedTo does.
func migrateTo(t *testing.T, d *idemsqlite.Driver, version int) {
	t.Helper()
	ctx := context.Background()
	src := os.DirFS("migrations")
	files, err := fs.Glob(src, "*.sql")
	require.NoError(t, err)
	upTo := fstest.MapFS{}
	for _, f := range files {
		v, err := strconv.Atoi(f[:5])
		require.NoError(t, err, f)
		if v <= version {
			b, err := fs.ReadFile(src, f)
			require.NoError(t, err)
			upTo[f] = &fstest.MapFile{Data: b}
		}
	}
	require.Len(t, upTo, version)
	require.NoError(t, d.MigrateFS(ctx, upTo, idemsqlite.SchemaVersionTable))
}

// schemaRows is sqlite_schema's (type, name, table, sql) of the objects
// whose name has one of the prefixes, in name order.
func schemaRows(t *testing.T, db *sql.DB, prefixes ...string) []string {
	t.Helper()
	rows, err := db.Query(`SELECT type, name, tbl_name, coalesce(sql, '') FROM sqlite_schema ORDER BY name`)
	require.NoError(t, err)
	defer rows.Close()
	var out []string
	for rows.Next() {
		var typ, name, table, text string
		require.NoError(t, rows.Scan(&typ, &name, &table, &text))
		for _, p := range prefixes {
			if strings.HasPrefix(name, p) {
				out = append(out, strings.Join([]string{typ, name, table, text}, " | "))
				break
			}
		}
	}
	require.NoError(t, rows.Err())
	return out
}

func indexes(t *testing.T, db *sql.DB) []string {
	t.Helper()
	var out []string
	for _, r := range schemaRows(t, db, "") {
		if strings.HasPrefix(r, "index | ") {
			out = append(out, r)
		}
	}
	return out
}

func schemaVersion(t *testing.T, d *idemsqlite.Driver) int64 {
	t.Helper()
	st, err := d.MigrationStatus(context.Background())
	require.NoError(t, err)
	var v int64
	for _, m := range st {
		require.Empty(t, m.Missing, "migration %s", m.Name)
		if m.Applied {
			v = m.Version
		}
	}
	return v
}

func foreignKeyCheck(t *testing.T, db *sql.DB) {
	t.Helper()
	rows, err := db.Query(`PRAGMA foreign_key_check`)
	require.NoError(t, err)
	defer rows.Close()
	require.False(t, rows.Next(), "PRAGMA foreign_key_check finds a violation")
	require.NoError(t, rows.Err())
	var ok string
	require.NoError(t, db.QueryRow(`PRAGMA integrity_check`).Scan(&ok))
	require.Equal(t, "ok", ok)
}

func claimKey(t *testing.T, d idemdriver.Driver, key string) idemdriver.Record {
	t.Helper()
	res, err := d.Claim(context.Background(), idemdriver.ClaimParams{Scope: "acct", Key: key, Method: "POST", Path: "/v1/payments",
		Fingerprint: []byte("fp-" + key), LeaseDuration: time.Minute, Retention: time.Hour, Owner: "test"})
	require.NoError(t, err)
	require.True(t, res.Claimed)
	return res.Record
}

// insertV6Steps writes, as version 6 code does, a finished step and an
// unfinished one of rec.
func insertV6Steps(t *testing.T, db *sql.DB, rec idemdriver.Record) {
	t.Helper()
	_, err := db.Exec(`INSERT INTO idem_steps (scope, key, created_at, name, started_token, started_at, relay, done, result, finished_at, seal_key)
		VALUES (?1, ?2, ?3, 'charge', ?4, ?3, x'01', 1, x'7b7d', ?3 + 5, 'k1'),
		       (?1, ?2, ?3, 'notify', ?4, ?3, x'02', 0, NULL, NULL, '')`,
		rec.Scope, rec.Key, rec.CreatedAt.UnixMicro(), rec.FencingToken)
	require.NoError(t, err)
}

func countSteps(t *testing.T, db *sql.DB, key string) int {
	t.Helper()
	var n int
	require.NoError(t, db.QueryRow(`SELECT count(*) FROM idem_steps WHERE key = ?`, key).Scan(&n))
	return n
}

// Migration 00007 rebuilds idem_keys and idem_steps (SQLite cannot alter a
// CHECK): a version 6 file keeps every record and step, idem_keys's
// indexes, the foreign key's cascade and every other table, and accepts
// UNKNOWN; its Down refuses while a record is UNKNOWN, then goes back.
func TestMigrateUnknownKeepsRowsAndIndexes(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	d := migratedTo(t, 6)
	db := d.DB()
	require.EqualValues(t, 6, schemaVersion(t, d))

	a, b := claimKey(t, d, "a"), claimKey(t, d, "b")
	insertV6Steps(t, db, a)
	insertV6Steps(t, db, b)
	done := claimKey(t, d, "done")
	ok, err := d.Complete(ctx, idemdriver.CompleteParams{FenceParams: idemdriver.FenceParams{Scope: done.Scope, Key: done.Key,
		FencingToken: done.FencingToken, CreatedAt: done.CreatedAt},
		Response: idemdriver.Response{Status: 201, Body: []byte(`{"id":1}`), BodyStored: true, BodySize: 8}})
	require.NoError(t, err)
	require.True(t, ok)
	l, err := d.TryLockMaintenance(ctx, idemdriver.LockParams{TTL: time.Hour})
	require.NoError(t, err)
	t.Cleanup(func() { _ = l.Release(context.Background()) })

	v6Indexes := indexes(t, db)
	others := []string{"idem_maintenance_lock", "idem_locks", idemsqlite.SchemaVersionTable, "sqlite_sequence"}
	v6Others := schemaRows(t, db, others...)
	keysBefore := dbtest.DumpSQL(t, db, "(SELECT rowid, * FROM idem_keys ORDER BY rowid)")
	stepsBefore := dbtest.DumpSQL(t, db, "(SELECT rowid, * FROM idem_steps ORDER BY rowid)")
	lockBefore := dbtest.DumpSQL(t, db, "idem_maintenance_lock")

	migrateTo(t, d, 7)
	require.EqualValues(t, 7, schemaVersion(t, d), "applied, no table missing")

	require.Equal(t, v6Indexes, indexes(t, db), "idem_keys's and idem_steps's indexes as before")
	require.Len(t, v6Indexes, 6)
	require.Equal(t, v6Others, schemaRows(t, db, others...), "the other tables untouched")
	require.Equal(t, keysBefore, dbtest.DumpSQL(t, db, "(SELECT rowid, * FROM idem_keys ORDER BY rowid)"), "every record, as it was")
	require.Equal(t, stepsBefore, dbtest.DumpSQL(t, db, `(SELECT rowid, scope, key, created_at, name, started_token, started_at,
		relay, done, result, finished_at, seal_key FROM idem_steps ORDER BY rowid)`), "every step, as it was")
	require.Equal(t, lockBefore, dbtest.DumpSQL(t, db, "idem_maintenance_lock"))
	foreignKeyCheck(t, db)
	fresh7 := migratedTo(t, 7)
	require.Equal(t, schemaRows(t, fresh7.DB(), "idem_"), schemaRows(t, db, "idem_"), "the schema of a new file")

	steps, err := d.Steps(ctx, idemdriver.StepParams{Scope: a.Scope, Key: a.Key, CreatedAt: a.CreatedAt})
	require.NoError(t, err)
	require.Len(t, steps, 2)
	require.Equal(t, "charge", steps[0].Name)
	require.True(t, steps[0].Done)
	require.Equal(t, []byte(`{}`), steps[0].Result)
	require.Equal(t, "k1", steps[0].SealKey)
	require.Equal(t, a.CreatedAt.Add(5*time.Microsecond), steps[0].FinishedAt)
	require.Equal(t, "notify", steps[1].Name)
	require.False(t, steps[1].Done)
	for _, s := range steps {
		require.False(t, s.AtMostOnce)
		require.Empty(t, s.Reason)
		require.Empty(t, s.ResolvedBy)
		require.True(t, s.ResolvedAt.IsZero())
	}

	// The foreign key still cascades: a release takes b's steps.
	ok, err = d.Release(ctx, idemdriver.FenceParams{Scope: b.Scope, Key: b.Key, FencingToken: b.FencingToken, CreatedAt: b.CreatedAt})
	require.NoError(t, err)
	require.True(t, ok)
	require.Zero(t, countSteps(t, db, "b"))
	require.Equal(t, 2, countSteps(t, db, "a"))

	// UNKNOWN is accepted.
	step := idemdriver.StepParams{Scope: a.Scope, Key: a.Key, CreatedAt: a.CreatedAt, FencingToken: a.FencingToken, Name: "transfer"}
	_, err = d.StartStep(ctx, idemdriver.StartStepParams{StepParams: step, Relay: []byte("r"), AtMostOnce: true})
	require.NoError(t, err)
	require.NoError(t, d.MarkUnknown(ctx, idemdriver.UnknownParams{StepParams: step, Reason: idemdriver.ReasonStepUncertain}))
	got, err := d.Get(ctx, idemdriver.GetParams{Scope: a.Scope, Key: a.Key})
	require.NoError(t, err)
	require.Equal(t, idemdriver.StateUnknown, got.State)
	list, err := d.List(ctx, idemdriver.ListParams{State: idemdriver.StateUnknown, Limit: 10})
	require.NoError(t, err)
	require.Len(t, list, 1)
	foreignKeyCheck(t, db)

	// Down refuses while a record is UNKNOWN, and writes nothing: first for
	// its at-most-once start, which version 6 cannot keep (--force
	// overrides that), then for the record itself.
	_, err = d.MigrateDown(ctx)
	require.ErrorIs(t, err, idemdriver.ErrDropsRecords)
	_, err = d.MigrateDownDroppingRecords(ctx)
	require.ErrorContains(t, err, "an UNKNOWN record remains")
	require.EqualValues(t, 7, schemaVersion(t, d))
	require.Equal(t, 3, countSteps(t, db, "a"))

	// Resolved, it goes back to version 6's tables, rows kept.
	require.NoError(t, d.ResolveStep(ctx, idemdriver.ResolveStepParams{StepParams: step, By: "ops", Why: "test", Retention: time.Hour}))
	m, err := d.MigrateDown(ctx)
	require.NoError(t, err)
	require.EqualValues(t, 7, m.Version)
	require.EqualValues(t, 6, schemaVersion(t, d))
	require.Equal(t, v6Indexes, indexes(t, db))
	require.Equal(t, 3, countSteps(t, db, "a"))
	foreignKeyCheck(t, db)
	_, err = db.Exec(`UPDATE idem_keys SET state = 'UNKNOWN' WHERE key = 'a'`)
	require.ErrorContains(t, err, "CHECK constraint failed", "version 6's CHECK")

	// Every later migration applies after the rebuild, to the schema of a
	// new file.
	require.NoError(t, d.Migrate(ctx))
	require.Greater(t, schemaVersion(t, d), int64(7))
	require.Equal(t, schemaRows(t, dbtest.SQLite(t).DB(), "idem_"), schemaRows(t, db, "idem_"))
	require.Equal(t, 3, countSteps(t, db, "a"))
	foreignKeyCheck(t, db)
}

// Migration 00008 adds the partial index of FAILED records (the
// completer's read) to a version 7 file, records kept; its Down drops it.
func TestMigrateFailedIndex(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	d := migratedTo(t, 7)
	db := d.DB()
	a := claimKey(t, d, "a")
	insertV6Steps(t, db, a)
	ok, err := d.Fail(ctx, idemdriver.FenceParams{Scope: a.Scope, Key: a.Key, FencingToken: a.FencingToken, CreatedAt: a.CreatedAt})
	require.NoError(t, err)
	require.True(t, ok)
	claimKey(t, d, "b")
	v7Indexes := indexes(t, db)
	keysBefore := dbtest.DumpSQL(t, db, "(SELECT rowid, * FROM idem_keys ORDER BY rowid)")
	abandoned := func() []string {
		recs, _, err := d.Abandoned(ctx, idemdriver.AbandonedParams{Limit: 10})
		require.NoError(t, err)
		var keys []string
		for _, r := range recs {
			keys = append(keys, r.Key)
		}
		return keys
	}
	require.Equal(t, []string{"a"}, abandoned(), "read without the index too")

	migrateTo(t, d, 8)
	require.EqualValues(t, 8, schemaVersion(t, d))
	require.ElementsMatch(t, append(v7Indexes[:len(v7Indexes):len(v7Indexes)],
		"index | idem_keys_failed | idem_keys | CREATE INDEX idem_keys_failed ON idem_keys (created_at) WHERE state = 'FAILED'"),
		indexes(t, db))
	require.Equal(t, schemaRows(t, migratedTo(t, 8).DB(), "idem_"), schemaRows(t, db, "idem_"), "the schema of a new file")
	require.Equal(t, keysBefore, dbtest.DumpSQL(t, db, "(SELECT rowid, * FROM idem_keys ORDER BY rowid)"))
	require.Equal(t, []string{"a"}, abandoned())
	foreignKeyCheck(t, db)

	m, err := d.MigrateDown(ctx)
	require.NoError(t, err)
	require.EqualValues(t, 8, m.Version)
	require.EqualValues(t, 7, schemaVersion(t, d))
	require.Equal(t, v7Indexes, indexes(t, db))
	require.Equal(t, keysBefore, dbtest.DumpSQL(t, db, "(SELECT rowid, * FROM idem_keys ORDER BY rowid)"))
}

// A view naming idem_keys would be carried off by the rebuild: the
// migration refuses, and writes nothing.
func TestMigrateUnknownRefusesAView(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	d := migratedTo(t, 6)
	a := claimKey(t, d, "a")
	insertV6Steps(t, d.DB(), a)
	_, err := d.DB().Exec(`CREATE VIEW processing AS SELECT scope, key FROM idem_keys WHERE state = 'PROCESSING'`)
	require.NoError(t, err)
	before := schemaRows(t, d.DB(), "")

	err = d.Migrate(ctx)
	require.ErrorContains(t, err, "a view, trigger or foreign key names idem_keys or idem_steps")
	require.EqualValues(t, 6, schemaVersion(t, d))
	require.Equal(t, before, schemaRows(t, d.DB(), ""))
	require.Equal(t, 2, countSteps(t, d.DB(), "a"))

	_, err = d.DB().Exec(`DROP VIEW processing`)
	require.NoError(t, err)
	require.NoError(t, d.Migrate(ctx))
	require.Equal(t, 2, countSteps(t, d.DB(), "a"))
}

// Steps on a file whose migrations stop before them (00006, 00007) are
// refused with idemdriver.ErrSchemaTooOld, and write nothing; so is the
// completer's read before 00006.
func TestStepsSchemaTooOld(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	for _, version := range []int{5, 6} {
		d := migratedTo(t, version)
		rec := claimKey(t, d, "k")
		step := idemdriver.StepParams{Scope: rec.Scope, Key: rec.Key, CreatedAt: rec.CreatedAt, FencingToken: rec.FencingToken, Name: "charge"}
		_, err := d.StartStep(ctx, idemdriver.StartStepParams{StepParams: step, Relay: []byte("r"), AtMostOnce: true})
		require.ErrorIs(t, err, idemdriver.ErrSchemaTooOld, "version %d", version)
		_, err = d.Steps(ctx, step)
		require.ErrorIs(t, err, idemdriver.ErrSchemaTooOld, "version %d", version)
		require.ErrorIs(t, d.MarkUnknown(ctx, idemdriver.UnknownParams{StepParams: step, Reason: idemdriver.ReasonStepUncertain}),
			idemdriver.ErrSchemaTooOld, "version %d", version)
		_, err = d.FinishStep(ctx, idemdriver.FinishStepParams{StepParams: step, Result: []byte("x")})
		require.ErrorIs(t, err, idemdriver.ErrSchemaTooOld, "version %d", version)
		if _, _, err := d.Abandoned(ctx, idemdriver.AbandonedParams{Limit: 10}); version < 6 {
			require.ErrorIs(t, err, idemdriver.ErrSchemaTooOld, "version %d: no idem_steps", version)
		} else {
			require.NoError(t, err, "version %d: the read needs idem_steps only", version)
		}
		require.ErrorIs(t, d.ResolveStep(ctx, idemdriver.ResolveStepParams{StepParams: step, Applied: true, Result: []byte("x")}),
			idemdriver.ErrSchemaTooOld, "version %d", version)
		got, err := d.Get(ctx, idemdriver.GetParams{Scope: rec.Scope, Key: rec.Key})
		require.NoError(t, err)
		require.Equal(t, idemdriver.StateProcessing, got.State, "version %d: nothing written", version)
	}
}
