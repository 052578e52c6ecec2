package idempgx_test

import (
	"context"
	"sync/atomic"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/idemgo/idem/idemdriver"
	"github.com/idemgo/idem/idemdriver/idemdrivertest"
	"github.com/idemgo/idem/idempgx"
	"github.com/idemgo/idem/internal/dbtest"
)

func newDriver(t testing.TB) idemdriver.Driver {
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

// countingTracer counts the statements pgx sends.
type countingTracer struct{ n atomic.Int64 }

func (c *countingTracer) TraceQueryStart(ctx context.Context, _ *pgx.Conn, _ pgx.TraceQueryStartData) context.Context {
	c.n.Add(1)
	return ctx
}
func (c *countingTracer) TraceQueryEnd(context.Context, *pgx.Conn, pgx.TraceQueryEndData) {}

// The partitioned claim is a batch: each of its statements counts.
func (c *countingTracer) TraceBatchStart(ctx context.Context, _ *pgx.Conn, _ pgx.TraceBatchStartData) context.Context {
	return ctx
}
func (c *countingTracer) TraceBatchQuery(context.Context, *pgx.Conn, pgx.TraceBatchQueryData) {
	c.n.Add(1)
}
func (c *countingTracer) TraceBatchEnd(context.Context, *pgx.Conn, pgx.TraceBatchEndData) {}

// secondDriver opens another pool on d's schema, as another process would.
func secondDriver(t *testing.T, d idemdriver.Driver) idemdriver.Driver {
	pd := d.(*idempgx.Driver)
	cfg := pd.Pool().Config()
	if n, ok := idemdrivertest.SecondNode(t, idemdrivertest.EnvSecondPostgres); ok { // another way to the database
		cfg.ConnConfig.Host, cfg.ConnConfig.Port, cfg.ConnConfig.Fallbacks = n.Host, n.Port, nil
		if n.HasUser {
			cfg.ConnConfig.User, cfg.ConnConfig.Password = n.User, n.Password
		}
	}
	pool, err := pgxpool.NewWithConfig(context.Background(), cfg)
	require.NoError(t, err)
	t.Cleanup(pool.Close)
	if pd.Partitioned() {
		return idempgx.NewPartitioned(pool, idempgx.PartitionConfig{})
	}
	return idempgx.New(pool)
}

func TestConformance(t *testing.T) {
	idemdrivertest.Run(t, idemdrivertest.Harness{
		NewDriver: func(t *testing.T) idemdriver.Driver { return newDriver(t) },
		Unreachable: func(t *testing.T) idemdriver.Driver {
			pool, err := pgxpool.New(context.Background(), "postgres://postgres@127.0.0.1:1/none?sslmode=disable&connect_timeout=2")
			require.NoError(t, err)
			t.Cleanup(pool.Close)
			return idempgx.New(pool)
		},
		NewCountingDriver: func(t *testing.T) (idemdriver.Driver, func() int64) {
			url, _ := dbtest.PostgresURL(t)
			cfg, err := pgxpool.ParseConfig(url)
			require.NoError(t, err)
			tracer := &countingTracer{}
			cfg.ConnConfig.Tracer = tracer
			pool, err := pgxpool.NewWithConfig(context.Background(), cfg)
			require.NoError(t, err)
			t.Cleanup(pool.Close)
			d := idempgx.New(pool)
			require.NoError(t, d.Migrate(context.Background()))
			return d, tracer.n.Load
		},
		// One claim statement, one completion; in transactional mode the
		// completion rides in the business transaction (BEGIN, COMMIT).
		Budget:       map[string]int{"first": 2, "first-transactional": 4, "replay": 1, "in-flight": 1, "key-reused": 1},
		Business:     newBusiness,
		Maintenance:  true,
		SecondDriver: secondDriver,
	})
}

func newBusiness(t *testing.T, d idemdriver.Driver) idemdrivertest.Business {
	pool := d.(*idempgx.Driver).Pool()
	_, err := pool.Exec(context.Background(), `CREATE TABLE business_rows (id text PRIMARY KEY)`)
	require.NoError(t, err)
	return business{pool}
}

func BenchmarkDriver(b *testing.B) { idemdrivertest.Benchmark(b, newDriver) }

// Regression: a search_path naming no existing schema failed with "cannot
// scan NULL into *string".
func TestMigrateMissingSchema(t *testing.T) {
	url, _ := dbtest.PostgresURL(t)
	cfg, err := pgxpool.ParseConfig(url)
	require.NoError(t, err)
	cfg.ConnConfig.RuntimeParams["search_path"] = "no_such_schema_here"
	pool, err := pgxpool.NewWithConfig(context.Background(), cfg)
	require.NoError(t, err)
	t.Cleanup(pool.Close)
	err = idempgx.New(pool).Migrate(context.Background())
	require.ErrorContains(t, err, "no schema of the connection's search_path exists")
}
