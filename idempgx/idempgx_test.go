package idempgx_test

import (
	"context"
	"fmt"
	"maps"
	"os"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/idemgo/idem/idemdriver"
	"github.com/idemgo/idem/idemdriver/idemdrivertest"
	"github.com/idemgo/idem/idempgx"
	"github.com/idemgo/idem/internal/dbtest"
)

func newDriver(t testing.TB) idemdriver.Driver { return openDriver(t, false, nil) }

// testPooler is IDEMPGX_TEST_POOLER: "transaction" when TEST_DATABASE_URL
// points at a transaction pooler (pgbouncer pool_mode=transaction; its
// exec mode in the URL, for example default_query_exec_mode=exec), or
// "session". With either, every driver of these tests names its schema
// through Options.Schema and its pool sends no search_path, which
// pgbouncer refuses as a startup parameter.
var testPooler = os.Getenv("IDEMPGX_TEST_POOLER")

// openDriver returns a migrated driver on a fresh schema: found through
// search_path, or named by Options.Schema (schemaOption, or behind a pooler)
// on a pool without search_path. tracer, when not nil, traces the pool.
func openDriver(t testing.TB, schemaOption bool, tracer pgx.QueryTracer) *idempgx.Driver {
	t.Helper()
	return openDriverOrder(t, schemaOption, tracer, idempgx.ClaimAdaptive)
}

// openDriverOrder is openDriver with the claim order pinned
// (Options.ClaimOrder).
func openDriverOrder(t testing.TB, schemaOption bool, tracer pgx.QueryTracer, order idempgx.ClaimOrder) *idempgx.Driver {
	t.Helper()
	return openDrivers(t, schemaOption, tracer, order)[0]
}

// openDrivers returns one migrated driver per order, all on one pool and
// one fresh schema (see openDriver).
func openDrivers(t testing.TB, schemaOption bool, tracer pgx.QueryTracer, orders ...idempgx.ClaimOrder) []*idempgx.Driver {
	t.Helper()
	url, schema := dbtest.PostgresURL(t)
	cfg, err := pgxpool.ParseConfig(url)
	require.NoError(t, err)
	cfg.MaxConns = 16
	if schemaOption {
		cfg.MaxConns = 4 // a second suite in the same package run: fewer server connections
	}
	if tracer != nil {
		cfg.ConnConfig.Tracer = tracer
	}
	var opts idempgx.Options
	if schemaOption || testPooler != "" {
		delete(cfg.ConnConfig.RuntimeParams, "search_path")
		opts.Schema, opts.TransactionPooler = schema, testPooler == "transaction"
	}
	pool, err := pgxpool.NewWithConfig(context.Background(), cfg)
	require.NoError(t, err)
	t.Cleanup(pool.Close)
	var drivers []*idempgx.Driver
	for _, order := range orders {
		opts.ClaimOrder = order
		d, err := idempgx.NewWithOptions(pool, opts)
		require.NoError(t, err)
		require.NoError(t, d.Migrate(context.Background()))
		drivers = append(drivers, d)
	}
	return drivers
}

type business struct {
	pool  *pgxpool.Pool
	table string
}

func (b business) Insert(ctx context.Context, tx any, id string) error {
	_, err := tx.(pgx.Tx).Exec(ctx, `INSERT INTO `+b.table+` (id) VALUES ($1)`, id)
	return err
}

func (b business) Count(ctx context.Context, id string) (n int, err error) {
	err = b.pool.QueryRow(ctx, `SELECT count(*) FROM `+b.table+` WHERE id = $1`, id).Scan(&n)
	return n, err
}

// countingTracer counts the statements pgx sends (n), and its exchanges
// with the server (trips): a statement sent alone, or a batch sent whole (a
// prepare, once per statement and connection, is not counted).
type countingTracer struct{ n, trips atomic.Int64 }

func (c *countingTracer) TraceQueryStart(ctx context.Context, _ *pgx.Conn, _ pgx.TraceQueryStartData) context.Context {
	c.n.Add(1)
	c.trips.Add(1)
	return ctx
}
func (c *countingTracer) TraceQueryEnd(context.Context, *pgx.Conn, pgx.TraceQueryEndData) {}

// Each statement of a batch counts (the partitioned claim is one).
func (c *countingTracer) TraceBatchStart(ctx context.Context, _ *pgx.Conn, _ pgx.TraceBatchStartData) context.Context {
	c.trips.Add(1)
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
		// A partitioned store behind a pooler logs in as the role whose
		// search_path names its schema (see partitionedPool): keep it.
		if n.HasUser && !(pd.Partitioned() && testPooler != "") {
			cfg.ConnConfig.User, cfg.ConnConfig.Password = n.User, n.Password
		}
	}
	pool, err := pgxpool.NewWithConfig(context.Background(), cfg)
	require.NoError(t, err)
	t.Cleanup(pool.Close)
	if pd.Partitioned() {
		return idempgx.NewPartitioned(pool, idempgx.PartitionConfig{})
	}
	d2, err := idempgx.NewWithOptions(pool, idempgx.Options{Schema: pd.Schema(), TransactionPooler: testPooler == "transaction"})
	require.NoError(t, err)
	return d2
}

func TestConformance(t *testing.T) { idemdrivertest.Run(t, harness(false)) }

// harness is the conformance harness of drivers on fresh schemas, found
// through search_path or named by Options.Schema (see openDriver). The
// drivers found through search_path order their claims adaptively (the
// default, Options.ClaimOrder: a new driver sends the INSERT first), those
// of the schema option read first, so that the suite runs through both
// orders; the statement budget is counted with the order pinned.
func harness(schemaOption bool) idemdrivertest.Harness {
	order, counted := idempgx.ClaimAdaptive, idempgx.ClaimInsertFirst
	// The INSERT first: one statement claims a new key, the completion another;
	// with writes in the claim's transaction the completion rides in the
	// business transaction (BEGIN, COMMIT); in one-commit mode BEGIN, the
	// INSERT (which sets the lock bound), the completion and COMMIT. A replay,
	// 409 or 422 is the INSERT, which meets the key, and the read; in
	// one-commit mode BEGIN, the INSERT, ROLLBACK and the read.
	budget := map[string]int{"first": 2, "first-claim-tx": 4, "first-one-commit": 4, "replay-one-commit": 4, "replay": 2, "in-flight": 2, "key-reused": 2}
	if schemaOption {
		// Read first: a replay, 409 or 422 is the read alone, a new key
		// the read and the INSERT.
		order, counted = idempgx.ClaimReadFirst, idempgx.ClaimReadFirst
		budget = map[string]int{"first": 3, "first-claim-tx": 5, "first-one-commit": 5, "replay-one-commit": 1, "replay": 1, "in-flight": 1, "key-reused": 1}
	}
	return idemdrivertest.Harness{
		NewDriver: func(t *testing.T) idemdriver.Driver { return openDriverOrder(t, schemaOption, nil, order) },
		Unreachable: func(t *testing.T) idemdriver.Driver {
			pool, err := pgxpool.New(context.Background(), "postgres://postgres@127.0.0.1:1/none?sslmode=disable&connect_timeout=2")
			require.NoError(t, err)
			t.Cleanup(pool.Close)
			return idempgx.New(pool)
		},
		NewCountingDriver: func(t *testing.T) (idemdriver.Driver, func() int64) {
			tracer := &countingTracer{}
			return openDriverOrder(t, schemaOption, tracer, counted), tracer.n.Load
		},
		Budget:       budget,
		Business:     newBusiness,
		Maintenance:  true,
		SecondDriver: secondDriver,
		Dump:         dump,
		Tamper:       tamper,
		Starve:       starve,
	}
}

// starve is Harness.Starve: it acquires every connection of d's pool.
func starve(t *testing.T, d idemdriver.Driver) func() {
	pool := d.(*idempgx.Driver).Pool()
	var conns []*pgxpool.Conn
	for range pool.Config().MaxConns {
		c, err := pool.Acquire(context.Background())
		require.NoError(t, err)
		conns = append(conns, c)
	}
	return func() {
		for _, c := range conns {
			c.Release()
		}
	}
}

// tamper is Harness.Tamper: an UPDATE of the row (scope, key) of d's
// idem_keys, set's columns to its values (nil for NULL).
func tamper(t *testing.T, d idemdriver.Driver, scope, key string, set map[string]any) {
	pd := d.(*idempgx.Driver)
	table := "idem_keys"
	if pd.Schema() != "" {
		table = pd.Schema() + "." + table
	}
	cols := slices.Sorted(maps.Keys(set))
	assign := make([]string, len(cols))
	args := make([]any, 0, len(cols)+2)
	for i, c := range cols {
		assign[i] = fmt.Sprintf("%s = $%d", pgx.Identifier{c}.Sanitize(), i+1)
		args = append(args, set[c])
	}
	tag, err := pd.Pool().Exec(context.Background(), fmt.Sprintf("UPDATE %s SET %s WHERE scope = $%d AND key = $%d",
		table, strings.Join(assign, ", "), len(cols)+1, len(cols)+2), append(args, scope, key)...)
	require.NoError(t, err)
	require.EqualValues(t, 1, tag.RowsAffected(), "tamper with %s/%s", scope, key)
}

// dump is Harness.Dump: every column of every idem_keys row, decoded by pgx
// whatever the exec mode (text and bytea as their bytes, others printed).
func dump(t *testing.T, d idemdriver.Driver) [][]byte {
	pd := d.(*idempgx.Driver)
	table := "idem_keys"
	if pd.Schema() != "" {
		table = pd.Schema() + "." + table
	}
	rows, err := pd.Pool().Query(context.Background(), `SELECT * FROM `+table)
	require.NoError(t, err)
	defer rows.Close()
	var out [][]byte
	for rows.Next() {
		vals, err := rows.Values()
		require.NoError(t, err)
		for _, v := range vals {
			switch v := v.(type) {
			case []byte:
				out = append(out, v)
			case string:
				out = append(out, []byte(v))
			default:
				out = append(out, []byte(fmt.Sprint(v)))
			}
		}
	}
	require.NoError(t, rows.Err())
	return out
}

func newBusiness(t *testing.T, d idemdriver.Driver) idemdrivertest.Business {
	pd := d.(*idempgx.Driver)
	table := "business_rows"
	if pd.Schema() != "" {
		table = pd.Schema() + "." + table
	}
	_, err := pd.Pool().Exec(context.Background(), `CREATE TABLE `+table+` (id text PRIMARY KEY)`)
	require.NoError(t, err)
	return business{pd.Pool(), table}
}

// The conformance suite on drivers whose tables are named through
// Options.Schema, on pools whose search_path does not name that schema
// (public): every statement, migration, lease and business write finds its
// table in the named schema, none in public.
func TestConformanceSchemaOption(t *testing.T) {
	h := harness(true)
	newDriver := h.NewDriver
	h.NewDriver = func(t *testing.T) idemdriver.Driver {
		d := newDriver(t).(*idempgx.Driver)
		var inPath bool
		require.NoError(t, d.Pool().QueryRow(context.Background(),
			`SELECT to_regclass('idem_keys') IS NOT NULL OR to_regclass('idem_locks') IS NOT NULL`).Scan(&inPath))
		require.False(t, inPath, "idem's tables are in the named schema, not on the search_path")
		return d
	}
	idemdrivertest.Run(t, h)
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

// Regression (a new user's try): a SUCCEEDED record whose response_body was
// set to NULL by hand was read, by the claim's scan (scan.go) as by Get,
// as a whole response with an empty body, and replayed as an empty 201. It
// reads as no response (idemsql.DecodeResponse), which the engine answers
// 500 response-missing.
func TestNullBodyReadsAsNoResponse(t *testing.T) {
	t.Parallel()
	d := openDriver(t, false, nil)
	ctx := context.Background()
	p := idemdriver.ClaimParams{Scope: "acct", Key: "k", Method: "POST", Path: "/pay", Fingerprint: []byte("fp"),
		LeaseDuration: time.Minute, Retention: time.Hour}
	res, err := d.Claim(ctx, p)
	require.NoError(t, err)
	require.True(t, res.Claimed)
	body := []byte(`{"id":"pay_1","amount":100}`)
	ok, err := d.Complete(ctx, idemdriver.CompleteParams{
		FenceParams: idemdriver.FenceParams{Scope: "acct", Key: "k", FencingToken: res.Record.FencingToken, CreatedAt: res.Record.CreatedAt},
		Response:    idemdriver.Response{Status: 201, Body: body, BodyStored: true, BodySize: int64(len(body))}})
	require.NoError(t, err)
	require.True(t, ok)
	again, err := d.Claim(ctx, p)
	require.NoError(t, err)
	require.Equal(t, body, again.Record.Response.Body, "whole before the damage")

	_, err = d.Pool().Exec(ctx, `UPDATE idem_keys SET response_body = NULL`)
	require.NoError(t, err)
	again, err = d.Claim(ctx, p)
	require.NoError(t, err)
	require.False(t, again.Claimed)
	require.Equal(t, idemdriver.StateSucceeded, again.Record.State)
	require.Nil(t, again.Record.Response, "the claim's read")
	rec, err := d.Get(ctx, idemdriver.GetParams{Scope: "acct", Key: "k"})
	require.NoError(t, err)
	require.Nil(t, rec.Response, "Get")
}
