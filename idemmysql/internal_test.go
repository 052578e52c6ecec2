package idemmysql

import (
	"context"
	"database/sql"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/idemgo/idem/idemdriver"

	"github.com/idemgo/idem/internal/dbtest"
)

func TestMigrateLockName(t *testing.T) {
	t.Parallel()
	require.Equal(t, "idem_migrations.payments", migrateLockName("payments"))
	long := migrateLockName(strings.Repeat("d", 64))
	require.LessOrEqual(t, len(long), 64, "MySQL lock names hold 64 characters")
	require.NotEqual(t, long, migrateLockName(strings.Repeat("d", 63)+"e"))
}

// No statement on the request path scans: each finds its row through the
// primary key (CONTRACT section 10).
func TestStatementsUsePrimaryKey(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	url, _ := dbtest.MySQLURL(t)
	d, err := Open(ctx, url)
	require.NoError(t, err)
	t.Cleanup(func() { d.Close() })
	require.NoError(t, d.Migrate(ctx))
	// A few rows, so that the optimizer has a choice.
	for _, k := range []string{"a", "b", "c", "d"} {
		_, err := d.Claim(ctx, claimParams("acct", k))
		require.NoError(t, err)
	}
	args := map[stmtID][]any{
		stRead:      {int64(0), "acct", "b"},
		stTakeover:  {"POST", "/", []byte("f"), int64(1), int64(1), int64(1), int64(1), 1, "acct", "b", int64(1), int64(1), int64(1)},
		stHeartbeat: {int64(0), int64(1), int64(0), "acct", "b", int64(1)},
		stComplete:  {201, []byte("{}"), []byte("x"), true, int64(1), int64(0), int64(0), "acct", "b", int64(1)},
		stFail:      {int64(0), "acct", "b", int64(1)},
	}
	for id, a := range args {
		rows, err := d.DB().QueryContext(ctx, "EXPLAIN "+queries[id], a...)
		require.NoError(t, err)
		cols, err := rows.Columns()
		require.NoError(t, err)
		found := false
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
			if row["table"] == "k" || row["table"] == "idem_keys" {
				found = true
				require.Equal(t, "PRIMARY", row["key"], "statement %d: %v", id, row)
				require.Contains(t, []string{"const", "range", "eq_ref"}, row["type"], "statement %d: %v", id, row)
			}
		}
		require.NoError(t, rows.Err())
		rows.Close()
		require.True(t, found, "statement %d", id)
	}
}

func claimParams(scope, key string) idemdriver.ClaimParams {
	return idemdriver.ClaimParams{Scope: scope, Key: key, Method: "POST", Path: "/",
		Fingerprint: []byte("f"), LeaseDuration: time.Minute, Retention: time.Hour}
}
