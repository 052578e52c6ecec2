package idempgx_test

import (
	"context"
	"net/http"
	"os"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/idemgo/idem"
	"github.com/idemgo/idem/idemdriver"
	"github.com/idemgo/idem/idempgx"
	"github.com/idemgo/idem/internal/dbtest"
)

// EnvSyncRep names a PostgreSQL server of the test's own that it may
// reconfigure (ALTER SYSTEM SET synchronous_standby_names, then reload):
// scripts/topology/pg-sync-failover sets it. Never the shared test server.
const envSyncRep = "TEST_SYNCREP_URL"

// The COMMIT that carries an outcome is never cancelled: with a synchronous
// standby that does not acknowledge, the outcome stays invisible (the record
// PROCESSING, locked) past CompleteTimeout, a duplicate is not answered a
// replay, and the outcome is recorded once the server releases the commit.
// Regression (issue 10): CompleteTimeout cancelled the wait for synchronous
// replication; PostgreSQL then kept the commit locally ("canceling wait for
// synchronous replication ... already committed locally"), duplicates
// replayed it, and a failover lost it.
func TestOutcomeCommitWaitsForSynchronousStandby(t *testing.T) {
	base := os.Getenv(envSyncRep)
	if base == "" {
		t.Skipf("%s is not set: this test reconfigures its server (run scripts/topology/pg-sync-failover)", envSyncRep)
	}
	for _, writes := range []string{"plain", "writes-in-claim-tx"} {
		t.Run(writes, func(t *testing.T) { testOutcomeCommitWaits(t, base, writes == "writes-in-claim-tx") })
	}
}

func testOutcomeCommitWaits(t *testing.T, base string, inClaimTx bool) {
	ctx := context.Background()
	admin := syncRepPool(t, base, "", "local")
	setStandbys := func(names string) {
		_, err := admin.Exec(ctx, "ALTER SYSTEM SET synchronous_standby_names = '"+names+"'")
		require.NoError(t, err)
		_, err = admin.Exec(ctx, "SELECT pg_reload_conf()")
		require.NoError(t, err)
	}
	setStandbys("")
	t.Cleanup(func() { setStandbys("") }) // releases a commit still waiting

	schema := dbtest.Name("idemsyncrep")
	_, err := admin.Exec(ctx, "CREATE SCHEMA "+schema)
	require.NoError(t, err)
	t.Cleanup(func() { _, _ = admin.Exec(context.Background(), "DROP SCHEMA "+schema+" CASCADE") })
	reader := idempgx.New(syncRepPool(t, base, schema, "local"))
	require.NoError(t, reader.Migrate(ctx))
	_, err = reader.Pool().Exec(ctx, `CREATE TABLE business_rows (id text PRIMARY KEY)`)
	require.NoError(t, err)

	_, err = reader.Pool().Exec(ctx, `CREATE TABLE sync_probe (id int)`)
	require.NoError(t, err)
	probe := syncRepPool(t, base, schema, "on")
	store := idempgx.New(syncRepPool(t, base, schema, "on"))
	t.Cleanup(func() { setStandbys("") }) // before the pool's Close, which waits for the commit
	mw, err := idem.NewMiddleware(store, idem.Options{Engine: idem.EngineOptions{Timeouts: idem.TimeoutOptions{Complete: time.Second, Claim: time.Second}}, Scope: idem.SingleTenant})
	require.NoError(t, err)
	var runs atomic.Int32
	h := mw.Handler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		runs.Add(1)
		if inClaimTx {
			tx, err := idem.Tx[pgx.Tx](r.Context())
			require.NoError(t, err)
			_, err = tx.Exec(r.Context(), `INSERT INTO business_rows VALUES ('p1')`)
			require.NoError(t, err)
		}
		// The claim has committed; from now on every COMMIT waits for a
		// standby that never acknowledges.
		setStandbys("idem_no_such_standby")
		waitCommitsWait(t, probe)
		w.WriteHeader(http.StatusCreated)
		_, _ = w.Write([]byte(`{"id":"p1"}`))
	}))

	first := sendPayment(h)
	require.Equal(t, http.StatusServiceUnavailable, first.Code, first.Body.String())
	rec, err := reader.Get(ctx, idemdriver.GetParams{Scope: idem.SingleTenantScope, Key: "k"})
	require.NoError(t, err)
	require.Equal(t, idemdriver.StateProcessing, rec.State, "an outcome the standby does not have is not visible")
	dup := sendPayment(h)
	require.NotEqual(t, http.StatusCreated, dup.Code, "a duplicate must not replay an outcome the standby does not have: %s", dup.Body.String())
	require.Equal(t, int32(1), runs.Load())

	setStandbys("") // the server releases the waiting commit: the outcome is recorded
	require.Eventually(t, func() bool {
		rec, err := reader.Get(ctx, idemdriver.GetParams{Scope: idem.SingleTenantScope, Key: "k"})
		return err == nil && rec.State == idemdriver.StateSucceeded
	}, 30*time.Second, 50*time.Millisecond)
	replay := sendPayment(h)
	require.Equal(t, http.StatusCreated, replay.Code, replay.Body.String())
	require.Equal(t, "true", replay.Header().Get(idem.HeaderReplayed))
	require.Equal(t, int32(1), runs.Load())
}

// syncRepPool opens a pool on base with search_path schema (if not "") and
// synchronous_commit sc ("local": setup sessions that do not wait).
func syncRepPool(t *testing.T, base, schema, sc string) *pgxpool.Pool {
	t.Helper()
	cfg, err := pgxpool.ParseConfig(base)
	require.NoError(t, err)
	if schema != "" {
		cfg.ConnConfig.RuntimeParams["search_path"] = schema
	}
	cfg.ConnConfig.RuntimeParams["synchronous_commit"] = sc
	pool, err := pgxpool.NewWithConfig(context.Background(), cfg)
	require.NoError(t, err)
	t.Cleanup(pool.Close)
	return pool
}

// waitCommitsWait returns once a COMMIT on probe waits for the standby (the
// reload that set synchronous_standby_names is asynchronous).
func waitCommitsWait(t *testing.T, probe *pgxpool.Pool) {
	t.Helper()
	require.Eventually(t, func() bool {
		ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
		defer cancel()
		_, err := probe.Exec(ctx, `INSERT INTO sync_probe VALUES (1)`)
		return err != nil // still waiting when the context ended
	}, 10*time.Second, 10*time.Millisecond, "COMMIT never started waiting for the standby")
}
