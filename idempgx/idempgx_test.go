package idempgx_test

import (
	"context"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/idemgo/idem/idemdriver"
	"github.com/idemgo/idem/idemdriver/idemdrivertest"
	"github.com/idemgo/idem/idempgx"
	"github.com/idemgo/idem/internal/dbtest"
)

func newDriver(t *testing.T) idemdriver.Driver {
	t.Helper()
	d := idempgx.New(dbtest.PostgresPool(t))
	require.NoError(t, d.Migrate(context.Background()))
	return d
}

type business struct{ pool *pgxpool.Pool }

func (b business) Insert(ctx context.Context, tx idemdriver.Tx, id string) error {
	_, err := tx.Native().(pgx.Tx).Exec(ctx, `INSERT INTO business_rows (id) VALUES ($1)`, id)
	return err
}

func (b business) Count(ctx context.Context, id string) (n int, err error) {
	err = b.pool.QueryRow(ctx, `SELECT count(*) FROM business_rows WHERE id = $1`, id).Scan(&n)
	return n, err
}

func TestConformance(t *testing.T) {
	idemdrivertest.Run(t, idemdrivertest.Harness{
		NewDriver: newDriver,
		Unreachable: func(t *testing.T) idemdriver.Driver {
			pool, err := pgxpool.New(context.Background(), "postgres://postgres@127.0.0.1:1/none?sslmode=disable&connect_timeout=2")
			require.NoError(t, err)
			t.Cleanup(pool.Close)
			return idempgx.New(pool)
		},
		Business: func(t *testing.T, d idemdriver.Driver) idemdrivertest.Business {
			pool := d.(*idempgx.Driver).Pool()
			_, err := pool.Exec(context.Background(), `CREATE TABLE business_rows (id text PRIMARY KEY)`)
			require.NoError(t, err)
			return business{pool}
		},
	})
}
