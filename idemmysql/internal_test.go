package idemmysql

import (
	"context"
	"database/sql"
	"fmt"
	"testing"
	"time"

	"github.com/go-sql-driver/mysql"
	"github.com/stretchr/testify/require"

	"github.com/idemgo/idem/idemdriver"

	"github.com/idemgo/idem/internal/dbtest"
)

// No statement on the request path scans: each finds its row through the
// primary key (CONTRACT section 10).
func TestStatementsUsePrimaryKey(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	d := openMigrated(t)
	// A few rows, so that the optimizer has a choice.
	for _, k := range []string{"a", "b", "c", "d"} {
		_, err := d.Claim(ctx, claimParams("acct", k))
		require.NoError(t, err)
	}
	args := map[stmtID][]any{
		stRead:      {int64(0), "acct", "b"},
		stTakeover:  {"POST", "/", []byte("f"), "host/1", int64(1), int64(0), int64(1), int64(1), int64(1), int64(1), 1, "acct", "b", int64(1), int64(1), "FAILED", int64(1), int64(1)},
		stHeartbeat: {int64(0), int64(1), int64(0), "acct", "b", int64(1), int64(1)},
		stComplete:  {201, []byte("{}"), []byte("x"), true, int64(1), "", []byte("t"), []byte("r"), int64(0), int64(0), "acct", "b", int64(1), int64(1)},
		stFail:      {int64(0), "acct", "b", int64(1), int64(1)},
		stRelease:   {"acct", "b", int64(1), int64(1)},
	}
	for id, a := range args {
		found := false
		for _, row := range explain(t, d.DB(), queries[id], a...) {
			if row["table"] == "k" || row["table"] == "idem_keys" {
				found = true
				require.Equal(t, "PRIMARY", row["key"], "statement %d: %v", id, row)
				require.Contains(t, []string{"const", "range", "eq_ref"}, row["type"], "statement %d: %v", id, row)
			}
		}
		require.True(t, found, "statement %d", id)
	}
}

// openMigrated opens a driver on a fresh database (dbtest.MySQLURL), closed
// when the test ends, and migrates it.
func openMigrated(t *testing.T) *Driver {
	t.Helper()
	url, _ := dbtest.MySQLURL(t)
	d, err := Open(context.Background(), url)
	require.NoError(t, err)
	t.Cleanup(func() { d.Close() })
	require.NoError(t, d.Migrate(context.Background()))
	return d
}

func claimParams(scope, key string) idemdriver.ClaimParams {
	return idemdriver.ClaimParams{Scope: scope, Key: key, Method: "POST", Path: "/",
		Fingerprint: []byte("f"), LeaseDuration: time.Minute, Retention: time.Hour}
}

// explain returns EXPLAIN's rows for query, by column name.
func explain(t *testing.T, db *sql.DB, query string, args ...any) []map[string]string {
	t.Helper()
	rows, err := db.Query("EXPLAIN "+query, args...)
	require.NoError(t, err)
	defer rows.Close()
	cols, err := rows.Columns()
	require.NoError(t, err)
	var out []map[string]string
	for rows.Next() {
		vals := make([]sql.NullString, len(cols))
		ptrs := make([]any, len(cols))
		for i := range vals {
			ptrs[i] = &vals[i]
		}
		require.NoError(t, rows.Scan(ptrs...))
		row := map[string]string{}
		for i, c := range cols {
			row[c] = vals[i].String
		}
		out = append(out, row)
	}
	require.NoError(t, rows.Err())
	return out
}

// The maintenance statements read index ranges: the purge walks
// idem_keys_expires_at, its DELETE the primary key, Stuck and the
// completer's read (Abandoned) idem_keys_processing (the latter two ranges
// of it: PROCESSING up to now, FAILED). On a table where most records are
// live.
func TestMaintenanceStatementsUseIndexes(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	d := openMigrated(t)
	var keys [][2][]byte
	for i := 0; i < 300; i++ {
		p := claimParams(fmt.Sprint("acct", i%5), fmt.Sprint("k", i))
		if i%10 == 0 {
			p.ClockOffset = -2 * time.Hour // expired, and stuck
		}
		res, err := d.Claim(ctx, p)
		require.NoError(t, err)
		fence := idemdriver.FenceParams{Scope: p.Scope, Key: p.Key, FencingToken: res.Record.FencingToken, CreatedAt: res.Record.CreatedAt}
		switch {
		case i%20 == 5:
			ok, err := d.Fail(ctx, fence)
			require.NoError(t, err)
			require.True(t, ok)
		case i%10 != 0:
			ok, err := d.Complete(ctx, idemdriver.CompleteParams{FenceParams: fence})
			require.NoError(t, err)
			require.True(t, ok)
		default:
			keys = append(keys, [2][]byte{[]byte(p.Scope), []byte(p.Key)})
		}
	}
	_, err := d.DB().ExecContext(ctx, "INSERT INTO idem_steps (scope, `key`, created_at, name, started_token, started_at, relay)\n"+
		"SELECT scope, `key`, created_at, 'charge', fencing_token, created_at, '' FROM idem_keys WHERE state <> 'SUCCEEDED'")
	require.NoError(t, err)
	_, err = d.DB().ExecContext(ctx, `ANALYZE TABLE idem_keys, idem_steps`)
	require.NoError(t, err)
	for _, tc := range []struct {
		name, query, index string
		args               []any
	}{
		{"purge", queries[stPurgeSelect], "idem_keys_expires_at", append(purgeArgs(idemdriver.PurgeParams{}), 1000)},
		{"purge delete", deleteKeysSQL(keys), "PRIMARY", nil},
		{"stuck", stuckSQL, "idem_keys_processing", []any{int64(0), 50}},
		{"abandoned", abandonedSQL, "idem_keys_processing", []any{int64(0), int64(0), 50}},
	} {
		found := false
		for _, row := range explain(t, d.DB(), tc.query, tc.args...) {
			if row["table"] == "k" || row["table"] == "idem_keys" {
				found = true
				require.Equal(t, tc.index, row["key"], "%s: %v", tc.name, row)
				require.Equal(t, "range", row["type"], "%s: %v", tc.name, row)
			}
		}
		require.True(t, found, tc.name)
	}
	// The completer's read looks each record's steps up by the primary
	// key's prefix (scope, key, created_at).
	found := false
	for _, row := range explain(t, d.DB(), abandonedSQL, int64(0), int64(0), 50) {
		if row["table"] == "s" {
			found = true
			require.Equal(t, "PRIMARY", row["key"], "%v", row)
			require.Contains(t, []string{"ref", "eq_ref"}, row["type"], "%v", row)
			require.Contains(t, row["ref"], ".k.created_at", "%v", row)
		}
	}
	require.True(t, found, "abandoned: idem_steps")
}

// The purge's locking read takes no gap locks (READ COMMITTED): while a
// batch holds its rows, new keys are claimed and live records completed
// without waiting. Under REPEATABLE READ, the next-key lock past the
// scanned range would block every INSERT of a later expires_at.
func TestPurgeBlocksNoClaim(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	d := openMigrated(t)
	for i := 0; i < 3; i++ {
		p := claimParams("acct", fmt.Sprint("old", i))
		p.ClockOffset = -2 * time.Hour
		_, err := d.Claim(ctx, p)
		require.NoError(t, err)
	}
	// A record that expires after the new keys will: they are inserted in
	// the index gap between the range the batch read and this record.
	lp := claimParams("acct", "live")
	lp.Retention = 48 * time.Hour
	live, err := d.Claim(ctx, lp)
	require.NoError(t, err)

	// A batch's first statements, held open.
	tx, err := d.db.BeginTx(ctx, d.beginOpts)
	require.NoError(t, err)
	defer tx.Rollback() //nolint:errcheck
	rows, err := tx.QueryContext(ctx, queries[stPurgeSelect], append(purgeArgs(idemdriver.PurgeParams{}), 1000)...)
	require.NoError(t, err)
	n := 0
	for rows.Next() {
		n++
	}
	require.NoError(t, rows.Err())
	require.Equal(t, 3, n)

	qctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	for i := 0; i < 5; i++ {
		res, err := d.Claim(qctx, claimParams("acct", fmt.Sprint("new", i)))
		require.NoError(t, err, "a new key is claimed while a batch holds its rows")
		require.True(t, res.Claimed)
	}
	ok, err := d.Complete(qctx, idemdriver.CompleteParams{FenceParams: idemdriver.FenceParams{
		Scope: "acct", Key: "live", FencingToken: live.Record.FencingToken, CreatedAt: live.Record.CreatedAt}})
	require.NoError(t, err)
	require.True(t, ok)
	require.NoError(t, tx.Rollback())
}

// The renewal of many leases (Renew) finds its rows through the primary
// key, and so does the read after one that did not renew them all, with
// an index that holds no record in flight (written SUCCEEDED, so that
// InnoDB keeps no deleted PROCESSING entries for the estimate to count): a
// plain state = 'PROCESSING' made MySQL read them through
// idem_keys_processing instead, every record in flight (and, at
// REPEATABLE READ, lock that range of the index against new claims).
func TestRenewalUsesPrimaryKey(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	url, _ := dbtest.MySQLURL(t)
	d, err := Open(ctx, url)
	require.NoError(t, err)
	t.Cleanup(func() { d.Close() })
	require.NoError(t, d.Migrate(ctx))
	_, err = d.DB().Exec("INSERT INTO idem_keys (scope, `key`, method, path, fingerprint, state, fencing_token, " +
		"created_at, updated_at, expires_at, attempts) " +
		"WITH RECURSIVE n (i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM n WHERE i < 300) " +
		"SELECT 'acct', CONCAT('k', i), 'POST', '/', 'f', 'SUCCEEDED', 1, UTC_TIMESTAMP(6), UTC_TIMESTAMP(6), UTC_TIMESTAMP(6) + INTERVAL 1 DAY, 1 FROM n")
	require.NoError(t, err)
	_, err = d.DB().Exec(`ANALYZE TABLE idem_keys`)
	require.NoError(t, err)
	// The plan for the values written into the statement, which MySQL
	// weighs against the index (index dives), as it may for a prepared
	// statement's parameters.
	cfg, err := ParseURL(url)
	require.NoError(t, err)
	cfg.InterpolateParams = true
	connector, err := mysql.NewConnector(cfg)
	require.NoError(t, err)
	literal := sql.OpenDB(connector)
	t.Cleanup(func() { _ = literal.Close() })
	fences := []any{"acct", "k1", int64(1), int64(1), "acct", "k2", int64(1), int64(1)}
	for query, args := range map[string][]any{
		renewSQL(2):   append([]any{int64(0), int64(1), int64(0)}, fences...),
		renewedSQL(2): fences,
	} {
		rows := explain(t, literal, query, args...)
		require.Len(t, rows, 1, query)
		require.Equal(t, "PRIMARY", rows[0]["key"], "%s: %v", query, rows[0])
		require.Equal(t, "range", rows[0]["type"], "%s: %v", query, rows[0])
	}
}
