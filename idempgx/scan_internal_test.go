package idempgx

import (
	"context"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/idemgo/idem/idemdriver"
	"github.com/idemgo/idem/internal/dbtest"
)

// pgxScan is a row whose records are scanned by pgx alone (no fast path);
// when fast is set, it is a row on which the fast path must decode.
type pgxScan struct {
	pgx.Rows
	t    *testing.T
	fast *bool
}

func (r pgxScan) Scan(dest ...any) error {
	s, ok := dest[0].(*rowScanner)
	if len(dest) != 1 || !ok {
		return r.Rows.Scan(dest...)
	}
	if r.fast != nil {
		*r.fast = s.decode(r.Rows)
		if *r.fast {
			return nil
		}
	}
	return r.Rows.Scan(s.dest...)
}

// The fast path of record scans (rowScanner) gives the records pgx gives,
// for records of every shape: in flight, succeeded, sealed, failed, a body
// not kept, another method, a request kept; and it is taken wherever pgx's
// results are binary (the default exec mode; text in the pooler's).
func TestFastScanMatchesPgx(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := dbtest.PostgresPool(t)
	d := New(pool)
	require.NoError(t, d.Migrate(ctx))
	_, err := pool.Exec(ctx, `INSERT INTO idem_keys (scope, key, method, path, fingerprint, state, fencing_token, locked_until,
		response_status, response_headers, response_body, response_body_stored, response_body_size, seal_key, request,
		created_at, updated_at, completed_at, expires_at, attempts, owner) VALUES
	('s', 'processing', 'POST', '/v1/p', '\x0102', 'PROCESSING', 3, now() + interval '30 s',
		NULL, NULL, NULL, NULL, NULL, '', NULL, now() - interval '1 h', now(), NULL, now() + interval '1 day', 2, 'host/1'),
	('s', 'succeeded', 'PUT', '/v1/p/1', '\xff', 'SUCCEEDED', 1, NULL,
		201, convert_to('{"Content-Type":["application/json"],"X-A":["1","2"]}', 'UTF8'), '\x7b7d', true, 2, '', '\x61',
		now() - interval '2 h', now(), now(), now() + interval '1 day', 1, ''),
	('s', 'sealed', 'POST', '/v1/p', '\x01', 'SUCCEEDED', 1, NULL,
		200, NULL, '\x00010203', true, 4, 'k1', NULL, now(), now(), now(), now() + interval '1 day', 1, ''),
	('s', 'failed', 'PATCH', '/v1/p', '\x01', 'FAILED', 7, NULL,
		NULL, NULL, NULL, NULL, NULL, '', NULL, '1999-12-31 23:59:59.999999+00', now(), NULL, '2100-01-01 00:00:00.000001+00', 9, ''),
	('s', 'not kept', 'OPTIONS', '/v1/ü', '\x01', 'SUCCEEDED', 1, NULL,
		200, convert_to('{}', 'UTF8'), '', false, 9000000, '', NULL, now(), now(), now(), now() + interval '1 day', 1, 'ü'),
	('s', 'lease run out', 'DELETE', '/v1/p', '\x01', 'PROCESSING', 2, now() - interval '5 s',
		NULL, NULL, NULL, NULL, NULL, '', NULL, now(), now(), NULL, now() + interval '1 day', 1, ''),
	('s', 'expired', 'POST', '/v1/p', '\x01', 'SUCCEEDED', 1, NULL,
		201, convert_to('{}', 'UTF8'), '\x7b7d', true, 2, '', NULL, now() - interval '2 day', now(), now(), now() - interval '1 s', 1, '')`)
	require.NoError(t, err)
	binary := pool.Config().ConnConfig.DefaultQueryExecMode == pgx.QueryExecModeCacheStatement ||
		pool.Config().ConnConfig.DefaultQueryExecMode == pgx.QueryExecModeCacheDescribe

	read := func(key string, fast *bool) (idemdriver.Record, bool) {
		rows, err := pool.Query(ctx, getSQL, "s", key, int64(0))
		require.NoError(t, err)
		defer rows.Close()
		require.True(t, rows.Next(), key)
		rec, err := scanWithRequest(pgxScan{Rows: rows, t: t, fast: fast})
		require.NoError(t, err, key)
		// readSQL's shape: now first, no scope, key or lease left.
		rows2, err := pool.Query(ctx, readSQL, "s", key, int64(0))
		require.NoError(t, err)
		defer rows2.Close()
		require.True(t, rows2.Next(), key)
		rec2, expired, err := scanRead(pgxScan{Rows: rows2, t: t, fast: fast}, idemdriver.ClaimParams{Scope: "s", Key: key})
		require.NoError(t, err, key)
		rec2.Response = rec.Response // getSQL's carries the request
		require.InDelta(t, rec.LeaseLeft, rec2.LeaseLeft, float64(time.Second), key)
		rec2.LeaseLeft = rec.LeaseLeft
		require.Equal(t, rec, rec2, key)
		return rec, expired
	}
	for _, key := range []string{"processing", "succeeded", "sealed", "failed", "not kept", "lease run out", "expired"} {
		var fast bool
		got, gotExpired := read(key, &fast)
		require.Equal(t, binary, fast, "%s: the fast path decodes binary results, and only those", key)
		want, wantExpired := read(key, nil)
		require.InDelta(t, want.LeaseLeft, got.LeaseLeft, float64(time.Second), key)
		want.LeaseLeft = got.LeaseLeft
		require.Equal(t, want, got, key)
		require.Equal(t, wantExpired, gotExpired, key)
	}
	// Spot checks that the comparison compares something.
	rec, _ := read("succeeded", nil)
	require.Equal(t, map[string][]string{"Content-Type": {"application/json"}, "X-A": {"1", "2"}}, rec.Response.Header)
	require.Equal(t, "{}", string(rec.Response.Body))
	require.Equal(t, "a", string(rec.Response.Request))
	_, expired := read("expired", nil)
	require.True(t, expired)
	_, expired = read("succeeded", nil)
	require.False(t, expired)
	rec, _ = read("failed", nil)
	require.Equal(t, int64(7), rec.FencingToken)
	require.Equal(t, 9, rec.Attempts)
	require.Equal(t, time.Date(1999, 12, 31, 23, 59, 59, 999999000, time.UTC), rec.CreatedAt.UTC())
	require.Equal(t, time.Date(2100, 1, 1, 0, 0, 0, 1000, time.UTC), rec.ExpiresAt.UTC())
}
