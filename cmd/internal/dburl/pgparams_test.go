package dburl

import (
	"context"
	"errors"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/idemgo/idem/idemdriver"
	"github.com/idemgo/idem/idempgx"
	"github.com/idemgo/idem/internal/dbtest"
)

func TestSplitPGParams(t *testing.T) {
	for _, tc := range []struct {
		in, url string
		want    pgParams
	}{
		{"postgres://u@h/db", "postgres://u@h/db", pgParams{}},
		{"postgres://u@h/db?sslmode=disable", "postgres://u@h/db?sslmode=disable", pgParams{}},
		{"postgres://u@h:6432/db?sslmode=disable&idem_pooler=transaction&idem_schema=idem",
			"postgres://u@h:6432/db?sslmode=disable&default_query_exec_mode=exec", pgParams{true, "idem"}},
		{"postgres://u@h/db?idem_pooler=transaction&default_query_exec_mode=simple_protocol",
			"postgres://u@h/db?default_query_exec_mode=simple_protocol", pgParams{transactionPooler: true}},
		{"postgres://u@h/db?idem_pooler=transaction&default_query_exec_mode=cache_statement",
			"postgres://u@h/db?default_query_exec_mode=cache_statement", pgParams{transactionPooler: true}},
		{"postgres://u@h/db?idem_pooler=session", "postgres://u@h/db", pgParams{}},
		{"postgresql://u:p%40ss@h/db?idem_schema=a_b&application_name=x%20y", "postgresql://u:p%40ss@h/db?application_name=x%20y", pgParams{schema: "a_b"}},
	} {
		url, p, err := splitPGParams(tc.in)
		if err != nil || url != tc.url || p != tc.want {
			t.Errorf("splitPGParams(%q) = %q, %+v, %v; want %q, %+v", tc.in, url, p, err, tc.url, tc.want)
		}
	}
	for _, bad := range []string{
		"postgres://h/db?idem_pooler=statement",
		"postgres://h/db?idem_pooler=",
		"postgres://h/db?idem_schema=",
		"postgres://h/db?idem_schema=a&idem_schema=b",
		"postgres://h/db?idem_poolr=transaction",
	} {
		if _, _, err := splitPGParams(bad); err == nil {
			t.Errorf("splitPGParams(%q): no error", bad)
		}
	}
	ctx := context.Background()
	if _, err := Open(ctx, MySQL, "mysql://root@h/db?idem_schema=x", Options{}); err == nil || !strings.Contains(err.Error(), "PostgreSQL parameter") {
		t.Errorf("idem_schema on MySQL: %v", err)
	}
	if _, err := Open(ctx, Postgres, "postgres://h/db?idem_schema=x", Options{Partitioned: true}); err == nil {
		t.Error("idem_schema with Partitioned accepted")
	}
}

// idem_schema puts idem's tables in the schema it names, whatever the
// search_path, and idem_pooler=transaction refuses an exec mode that
// cannot work behind the pooler, on the PostgreSQL server directly.
func TestOpenPostgresParams(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	base := dbtest.RequireURL(t, dbtest.EnvPostgres)
	_, schema := dbtest.PostgresURL(t) // search_path not given: idem_schema alone names it
	url := base + sep(base) + ParamSchema + "=" + schema + "&" + ParamPooler + "=transaction"
	checkSchemaStore(t, ctx, url, schema)

	_, err := Open(ctx, Postgres, base+sep(base)+ParamPooler+"=transaction&default_query_exec_mode=cache_statement", Options{})
	if !errors.Is(err, idempgx.ErrPoolerExecMode) {
		t.Fatalf("cache_statement behind a transaction pooler: %v, want ErrPoolerExecMode", err)
	}
	if _, err := Open(ctx, Postgres, base+sep(base)+ParamSchema+"=Bad-Name", Options{}); err == nil {
		t.Fatal("a schema that is not a plain identifier accepted")
	}
}

// The same through a real pgbouncer in transaction pooling, which refuses
// search_path as a startup parameter: TEST_PGBOUNCER_URL names it (for
// example postgres://postgres@127.0.0.1:6432/test?sslmode=disable), in front
// of the TEST_DATABASE_URL server. Skipped without it.
func TestOpenThroughPgbouncer(t *testing.T) {
	t.Parallel()
	bouncer := os.Getenv("TEST_PGBOUNCER_URL")
	if bouncer == "" {
		t.Skip("TEST_PGBOUNCER_URL is not set: no pgbouncer to test through")
	}
	_, schema := dbtest.PostgresURL(t)
	checkSchemaStore(t, context.Background(), bouncer+sep(bouncer)+ParamPooler+"=transaction&"+ParamSchema+"="+schema, schema)
}

// checkSchemaStore opens url, migrates, claims and completes a key, and
// checks that idem_keys is in schema.
func checkSchemaStore(t *testing.T, ctx context.Context, url, schema string) {
	t.Helper()
	s, err := Open(ctx, Postgres, url, Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	if s.Partitioned {
		t.Fatal("a plain store opened partitioned")
	}
	if got := s.Driver.(*idempgx.Driver).Schema(); got != schema {
		t.Fatalf("driver schema %q, want %q", got, schema)
	}
	if err := s.Driver.Migrate(ctx); err != nil {
		t.Fatal(err)
	}
	exerciseStore(t, ctx, s)
	var n int
	if err := s.Pool.QueryRow(ctx, `SELECT count(*) FROM pg_tables WHERE schemaname = $1 AND tablename = 'idem_keys'`, schema).Scan(&n); err != nil || n != 1 {
		t.Fatalf("idem_keys in %s: %d, %v", schema, n, err)
	}
	// Opened again, the existing table in the schema is found.
	again, err := Open(ctx, Postgres, url, Options{})
	if err != nil {
		t.Fatal(err)
	}
	again.Close()
}

// exerciseStore claims a key, completes it and reads it back.
func exerciseStore(t *testing.T, ctx context.Context, s *Store) {
	t.Helper()
	res, err := s.Driver.Claim(ctx, idemdriver.ClaimParams{Scope: "acct", Key: "k1", Method: "POST", Path: "/v1/payments",
		Fingerprint: make([]byte, 32), LeaseDuration: 30 * time.Second, Retention: time.Hour})
	if err != nil || !res.Claimed {
		t.Fatalf("claim: %+v, %v", res, err)
	}
	ok, err := s.Driver.Complete(ctx, idemdriver.CompleteParams{
		FenceParams: idemdriver.FenceParams{Scope: "acct", Key: "k1", FencingToken: res.Record.FencingToken, CreatedAt: res.Record.CreatedAt},
		Response:    idemdriver.Response{Status: 201, Body: []byte("{}"), BodyStored: true, BodySize: 2}})
	if err != nil || !ok {
		t.Fatalf("complete: %v, %v", ok, err)
	}
	rec, err := s.Driver.Get(ctx, idemdriver.GetParams{Scope: "acct", Key: "k1"})
	if err != nil || rec.State != idemdriver.StateSucceeded {
		t.Fatalf("get: %+v, %v", rec, err)
	}
}

func sep(u string) string {
	if strings.Contains(u, "?") {
		return "&"
	}
	return "?"
}
