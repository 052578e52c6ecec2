package idempgx_test

import (
	"context"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/idemgo/idem/idemdriver"
	"github.com/idemgo/idem/idempgx"
	"github.com/idemgo/idem/internal/dbtest"
)

// A scope or key PostgreSQL text cannot hold is refused with
// idemdriver.ErrUnstorable by every request-path method, whatever the pool's
// exec mode. Regression (issue 10, pgbouncer transaction pooling with
// default_query_exec_mode=simple_protocol, which reproduces straight on the
// server): simple_protocol interpolates the arguments into the query text,
// and a NUL byte there broke the protocol message (08P01 "invalid message
// format"), which the core answers 503, not the 500 of a value that can
// never be stored.
func TestUnstorableInEveryExecMode(t *testing.T) {
	t.Parallel()
	odd := map[string]string{"nul": "acct\x00evil", "invalid-utf8": "acct\xff\xfe"}
	inEveryExecMode(t, 2, func(t *testing.T, mode string, d *idempgx.Driver) {
		ctx := context.Background()
		for what, v := range odd {
			fp := idemdriver.FenceParams{Scope: v, Key: "k", FencingToken: 1, CreatedAt: time.Now(), LeaseDuration: time.Minute}
			calls := map[string]func() error{
				"Claim": func() error {
					_, err := d.Claim(ctx, idemdriver.ClaimParams{Scope: v, Key: "k", Method: "POST", Path: "/",
						Fingerprint: []byte{1}, LeaseDuration: time.Minute, Retention: time.Hour})
					return err
				},
				"Claim (path)": func() error {
					_, err := d.Claim(ctx, idemdriver.ClaimParams{Scope: "acct", Key: "k", Method: "POST", Path: "/" + v,
						Fingerprint: []byte{1}, LeaseDuration: time.Minute, Retention: time.Hour})
					return err
				},
				"Claim (owner)": func() error {
					_, err := d.Claim(ctx, idemdriver.ClaimParams{Scope: "acct", Key: "k", Method: "POST", Path: "/",
						Fingerprint: []byte{1}, LeaseDuration: time.Minute, Retention: time.Hour, Owner: v})
					return err
				},
				"ClaimTx": func() error {
					_, tx, err := d.ClaimTx(ctx, idemdriver.ClaimParams{Scope: v, Key: "k", Method: "POST", Path: "/",
						Fingerprint: []byte{1}, LeaseDuration: time.Minute, Retention: time.Hour}, time.Second)
					if tx != nil {
						defer tx.Rollback(ctx) //nolint:errcheck // the test's own
					}
					return err
				},
				"Get": func() error {
					_, err := d.Get(ctx, idemdriver.GetParams{Scope: v, Key: "k"})
					return err
				},
				"Get (key)": func() error {
					_, err := d.Get(ctx, idemdriver.GetParams{Scope: "acct", Key: v})
					return err
				},
				"Heartbeat": func() error { _, err := d.Heartbeat(ctx, fp); return err },
				"Complete": func() error {
					_, err := d.Complete(ctx, idemdriver.CompleteParams{FenceParams: fp,
						Response: idemdriver.Response{Status: 200, BodyStored: true}})
					return err
				},
				"Complete in a transaction": func() error {
					tx, err := d.Begin(ctx)
					require.NoError(t, err)
					defer tx.Rollback(ctx) //nolint:errcheck // the test's own
					_, err = tx.Complete(ctx, idemdriver.CompleteParams{FenceParams: fp,
						Response: idemdriver.Response{Status: 200, BodyStored: true}})
					return err
				},
				"Fail":    func() error { _, err := d.Fail(ctx, fp); return err },
				"Release": func() error { _, err := d.Release(ctx, fp); return err },
				"Remove": func() error {
					_, err := d.Remove(ctx, idemdriver.RemoveParams{FenceParams: fp, State: idemdriver.StateFailed})
					return err
				},
				"List": func() error {
					_, err := d.List(ctx, idemdriver.ListParams{Scope: v, Limit: 10})
					return err
				},
			}
			for call, f := range calls {
				require.ErrorIs(t, f(), idemdriver.ErrUnstorable, "%s, %s in the scope, exec mode %s", call, what, mode)
			}
		}
		// The pool is still good for plain values.
		_, err := d.Get(ctx, idemdriver.GetParams{Scope: "acct", Key: "k"})
		require.ErrorIs(t, err, idemdriver.ErrNotFound)
	})
}

// inEveryExecMode runs f, in parallel subtests, on a migrated store of each
// pgx exec mode (default_query_exec_mode), plain and partitioned, on a pool
// of maxConns connections.
func inEveryExecMode(t *testing.T, maxConns int32, f func(t *testing.T, mode string, d *idempgx.Driver)) {
	for _, mode := range execModes {
		for _, partitioned := range []bool{false, true} {
			name := mode
			if partitioned {
				name += "/partitioned"
			}
			t.Run(name, func(t *testing.T) {
				t.Parallel()
				url, _ := dbtest.PostgresURL(t)
				cfg, err := pgxpool.ParseConfig(url + "&default_query_exec_mode=" + mode)
				require.NoError(t, err)
				cfg.MaxConns = maxConns
				f(t, mode, storeOn(t, cfg, partitioned))
			})
		}
	}
}

// storeOn returns a migrated store, plain or partitioned, on a pool of cfg,
// closed when the test ends.
func storeOn(t testing.TB, cfg *pgxpool.Config, partitioned bool) *idempgx.Driver {
	t.Helper()
	pool, err := pgxpool.NewWithConfig(context.Background(), cfg)
	require.NoError(t, err)
	t.Cleanup(pool.Close)
	d := idempgx.New(pool)
	if partitioned {
		d = idempgx.NewPartitioned(pool, idempgx.PartitionConfig{})
	}
	require.NoError(t, d.Migrate(context.Background()))
	return d
}
