package idempgx

import (
	"context"
	"encoding/hex"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/idemgo/idem/idemdriver"
	"github.com/idemgo/idem/internal/dbtest"
)

// The fenced writes (heartbeat, complete, fail, release, and the renewal
// of many leases) find their row
// through the primary key, whatever the statistics say, so their cost does
// not grow with the records in flight (issue 11). With statistics taken while
// no record was PROCESSING, PostgreSQL planned them on the partial index
// idem_keys_processing (state = 'PROCESSING') and filtered every PROCESSING
// record. The plans checked are the generic ones pgx's prepared statements
// settle on, and the custom ones of their first executions.
func TestFencedWritesUsePrimaryKey(t *testing.T) {
	t.Parallel()
	for _, partitioned := range []bool{false, true} {
		t.Run(fmt.Sprintf("partitioned=%v", partitioned), func(t *testing.T) {
			t.Parallel()
			pool := dbtest.PostgresPool(t)
			d := New(pool)
			if partitioned {
				d = NewPartitioned(pool, PartitionConfig{})
			}
			requireFencedWritesUsePrimaryKey(t, d)
		})
	}
}

func requireFencedWritesUsePrimaryKey(t *testing.T, d *Driver) {
	ctx := context.Background()
	pool := d.Pool()
	require.NoError(t, d.Migrate(ctx))
	// Finished records, analyzed; then 5,000 in flight the statistics do not know of.
	_, err := pool.Exec(ctx, `INSERT INTO idem_keys (scope, key, method, path, fingerprint, state, fencing_token,
		response_status, created_at, updated_at, completed_at, expires_at, attempts)
		SELECT 'acct', 'done-' || g, 'POST', '/', '\x00', 'SUCCEEDED', 1, 201, now(), now(), now(), now() + interval '1 day', 1
		FROM generate_series(1, 20000) g`)
	require.NoError(t, err)
	_, err = pool.Exec(ctx, `ANALYZE idem_keys`)
	require.NoError(t, err)
	_, err = pool.Exec(ctx, `INSERT INTO idem_keys (scope, key, method, path, fingerprint, state, fencing_token,
		locked_until, created_at, updated_at, expires_at, attempts)
		SELECT 'acct', 'busy-' || g, 'POST', '/', '\x00', 'PROCESSING', 1, now() + interval '30 seconds',
			now(), now(), now() + interval '1 day', 1
		FROM generate_series(1, 5000) g`)
	require.NoError(t, err)

	created := time.Now()
	for name, c := range map[string]struct {
		query string
		args  []any
	}{
		"heartbeat": {heartbeatSQL, []any{"acct", "busy-7", int64(1), created, int64(0), int64(30e6)}},
		"complete":  {completeSQL, []any{"acct", "busy-7", int64(1), created, int64(0), 201, []byte("{}"), []byte("x"), true, int64(1), "", []byte("t"), []byte("r")}},
		"fail":      {failSQL, []any{"acct", "busy-7", int64(1), created, int64(0)}},
		"release":   {releaseSQL, []any{"acct", "busy-7", int64(1), created}},
		// Two leases (Renew): the arrays as literals.
		"renew": {renewSQL, []any{"{acct,acct}", "{busy-7,busy-8}", "{1,1}",
			"{" + created.Format(time.RFC3339Nano) + "," + created.Format(time.RFC3339Nano) + "}", int64(0), int64(30e6)}},
	} {
		for _, mode := range []string{"force_generic_plan", "force_custom_plan"} {
			text := explain(t, pool, mode, c.query, c.args)
			require.Contains(t, text, "_pkey", "%s (%s): the primary key\n%s", name, mode, text)
			// The partial index, and its partitions' copies (named after locked_until).
			require.NotContains(t, text, "idem_keys_processing", "%s (%s):\n%s", name, mode, text)
			require.NotContains(t, text, "locked_until_idx", "%s (%s):\n%s", name, mode, text)
		}
	}
}

// explain returns the plan PostgreSQL makes for the prepared statement query
// under plan_cache_mode mode, executed with args.
func explain(t *testing.T, pool *pgxpool.Pool, mode, query string, args []any) string {
	t.Helper()
	ctx := context.Background()
	conn, err := pool.Acquire(ctx)
	require.NoError(t, err)
	defer conn.Release()
	tx, err := conn.Begin(ctx)
	require.NoError(t, err)
	defer tx.Rollback(ctx) //nolint:errcheck // the settings and the statement go with it
	_, err = tx.Exec(ctx, "SET LOCAL plan_cache_mode = "+mode)
	require.NoError(t, err)
	_, err = tx.Exec(ctx, "PREPARE fenced_write AS "+query)
	require.NoError(t, err)
	literals := make([]string, len(args))
	for i, a := range args {
		switch v := a.(type) {
		case string:
			literals[i] = "'" + v + "'"
		case []byte:
			literals[i] = "'\\x" + hex.EncodeToString(v) + "'"
		case time.Time:
			literals[i] = "'" + v.Format(time.RFC3339Nano) + "'"
		default:
			literals[i] = fmt.Sprint(v)
		}
	}
	rows, err := tx.Query(ctx, "EXPLAIN EXECUTE fenced_write("+strings.Join(literals, ", ")+")")
	require.NoError(t, err)
	var plan []string
	for rows.Next() {
		var line string
		require.NoError(t, rows.Scan(&line))
		plan = append(plan, line)
	}
	require.NoError(t, rows.Err())
	_, err = tx.Exec(ctx, "DEALLOCATE fenced_write")
	require.NoError(t, err)
	return strings.Join(plan, "\n")
}

// claimArgs boxes a Middleware's lease, retention and owner once and reuses
// them; a claim with other values (another Middleware on the same driver)
// must get its own, never the last one's.
func TestClaimArgsFollowEachClaimsConfig(t *testing.T) {
	t.Parallel()
	d := &Driver{}
	a := idemdriver.ClaimParams{Scope: "s", Key: "k", Method: "POST", Path: "/p", Fingerprint: []byte{1},
		LeaseDuration: 30 * time.Second, Retention: 24 * time.Hour, Owner: "host/1"}
	b := a
	b.Method, b.LeaseDuration, b.Retention, b.Owner = "OPTIONS", 5*time.Second, time.Hour, "host/2"
	want := func(p idemdriver.ClaimParams) []any {
		return []any{p.Scope, p.Key, p.ClockOffset.Microseconds(), p.Method, p.Path, p.Fingerprint,
			p.LeaseDuration.Microseconds(), p.Retention.Microseconds(), p.Owner}
	}
	for _, p := range []idemdriver.ClaimParams{a, a, b, a, b, b} {
		require.Equal(t, want(p), d.claimArgs(p))
	}
	// Only one of the three differs from the last claim's (b's).
	for _, change := range []func(*idemdriver.ClaimParams){
		func(p *idemdriver.ClaimParams) { p.Owner = "host/3" },
		func(p *idemdriver.ClaimParams) { p.LeaseDuration += time.Second },
		func(p *idemdriver.ClaimParams) { p.Retention += time.Second },
	} {
		c := b
		change(&c)
		require.Equal(t, want(c), d.claimArgs(c))
		require.Equal(t, want(b), d.claimArgs(b))
	}
}
