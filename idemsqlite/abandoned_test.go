package idemsqlite_test

import (
	"context"
	"database/sql"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/idemgo/idem/idemdriver"
	"github.com/idemgo/idem/idemsqlite"
	"github.com/idemgo/idem/internal/dbtest"
)

// Only a name beginning with idemdriver.InternalStepPrefix, byte for byte,
// is idem's own step: SQLite's LIKE would take 'IDEM:charge' for one too
// (it ignores ASCII case).
func TestAbandonedInternalPrefixIsCaseSensitive(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	d := dbtest.SQLite(t)
	for key, name := range map[string]string{"upper": "IDEM:charge", "internal": idemdriver.KeptRequestStep, "near": "idem-charge"} {
		rec := claimKey(t, d, key)
		_, err := d.StartStep(ctx, idemdriver.StartStepParams{StepParams: idemdriver.StepParams{Scope: rec.Scope, Key: rec.Key,
			CreatedAt: rec.CreatedAt, FencingToken: rec.FencingToken, Name: name}, Relay: []byte("r")})
		require.NoError(t, err)
		ok, err := d.Fail(ctx, idemdriver.FenceParams{Scope: rec.Scope, Key: rec.Key, FencingToken: rec.FencingToken, CreatedAt: rec.CreatedAt})
		require.NoError(t, err)
		require.True(t, ok)
	}
	recs, _, err := d.Abandoned(ctx, idemdriver.AbandonedParams{Limit: 10})
	require.NoError(t, err)
	var keys []string
	for _, r := range recs {
		keys = append(keys, r.Key)
	}
	require.ElementsMatch(t, []string{"upper", "near"}, keys)
	_, _, err = d.Abandoned(ctx, idemdriver.AbandonedParams{Limit: 0})
	require.Error(t, err, "Limit must be positive")
	_, _, err = d.Abandoned(ctx, idemdriver.AbandonedParams{Limit: 1, Grace: -1})
	require.Error(t, err, "Grace not negative")
}

// The completer's read (Abandoned) goes through the partial indexes of
// PROCESSING records (by lease) and FAILED ones (00008), each record's
// steps through idem_steps's primary key: no scan of either table. On a
// file where most records are SUCCEEDED, with and without ANALYZE's
// statistics.
func TestAbandonedUsesPartialIndexes(t *testing.T) {
	t.Parallel()
	db := dbtest.SQLite(t).DB()
	_, err := db.Exec(`WITH RECURSIVE n (i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM n WHERE i < 2000)
		INSERT INTO idem_keys (scope, key, method, path, fingerprint, state, fencing_token, locked_until,
			created_at, updated_at, expires_at, attempts)
		SELECT 'acct', 'k' || i, 'POST', '/', x'00',
			CASE i % 20 WHEN 0 THEN 'FAILED' WHEN 1 THEN 'PROCESSING' ELSE 'SUCCEEDED' END, 1,
			CASE i % 20 WHEN 1 THEN i END, i, i, i + 1000000, 1 FROM n`)
	require.NoError(t, err)
	_, err = db.Exec(`INSERT INTO idem_steps (scope, key, created_at, name, started_token, started_at, relay)
		SELECT scope, key, created_at, 'charge', 1, created_at, x'' FROM idem_keys WHERE created_at % 2 = 0`)
	require.NoError(t, err)
	for _, analyzed := range []bool{false, true} {
		if analyzed {
			_, err := db.Exec(`ANALYZE`)
			require.NoError(t, err)
		}
		plan := queryPlan(t, db, idemsqlite.AbandonedSQL, sql.Named("limit", 10), sql.Named("grace", 0), sql.Named("offset", 0))
		text := strings.Join(plan, "\n")
		require.Contains(t, text, "USING INDEX idem_keys_processing (locked_until<?)", "analyzed %t:\n%s", analyzed, text)
		require.Contains(t, text, "USING INDEX idem_keys_failed", "analyzed %t:\n%s", analyzed, text)
		for _, step := range plan {
			if strings.HasPrefix(step, "SCAN ") || strings.HasPrefix(step, "SEARCH ") {
				require.Contains(t, step, " USING ", "analyzed %t: no table scan:\n%s", analyzed, text)
			}
			if strings.HasPrefix(step, "SEARCH s ") {
				require.Contains(t, step, "(scope=? AND key=? AND created_at=?)", "analyzed %t:\n%s", analyzed, text)
			}
		}
	}
}

// queryPlan is EXPLAIN QUERY PLAN's detail column of query.
func queryPlan(t *testing.T, db *sql.DB, query string, args ...any) []string {
	t.Helper()
	rows, err := db.Query(`EXPLAIN QUERY PLAN `+query, args...)
	require.NoError(t, err)
	defer rows.Close()
	var plan []string
	for rows.Next() {
		var id, parent, unused int
		var detail string
		require.NoError(t, rows.Scan(&id, &parent, &unused, &detail))
		plan = append(plan, detail)
	}
	require.NoError(t, rows.Err())
	return plan
}
