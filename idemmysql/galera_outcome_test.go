package idemmysql_test

import (
	"context"
	"database/sql"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/idemgo/idem"
	"github.com/idemgo/idem/idemdriver"
	"github.com/idemgo/idem/idemdriver/idemdrivertest"
	"github.com/idemgo/idem/idemmysql"
	"github.com/idemgo/idem/internal/dbtest"
)

// galeraPair returns drivers on one fresh database through two nodes of a
// Galera cluster: TEST_MYSQL_URL and TEST_MYSQL_URL_2 (set by
// scripts/topology/galera). The test is skipped without the second node.
func galeraPair(t testing.TB, secondParams string) (first, second *idemmysql.Driver) {
	t.Helper()
	if _, ok := idemdrivertest.SecondNode(t, idemdrivertest.EnvSecondMySQL); !ok {
		t.Skipf("%s is not set: a second Galera node is needed (run scripts/topology/galera)", idemdrivertest.EnvSecondMySQL)
	}
	url, _ := dbtest.MySQLURL(t)
	first, err := idemmysql.Open(context.Background(), url)
	require.NoError(t, err)
	t.Cleanup(func() { first.Close() })
	var on string
	require.NoError(t, first.DB().QueryRow(`SELECT @@wsrep_on`).Scan(&on))
	require.Equal(t, "1", on, "TEST_MYSQL_URL is not a Galera node")
	require.NoError(t, first.Migrate(context.Background()))
	require.Eventually(t, func() bool { // node 2 may not have applied the CREATE DATABASE yet
		second, err = idemmysql.Open(context.Background(), idemdrivertest.OnSecondNode(t, idemdrivertest.EnvSecondMySQL, url)+secondParams)
		return err == nil
	}, 10*time.Second, 20*time.Millisecond, "open the database on the second node: %v", err)
	t.Cleanup(func() { second.Close() })
	return first, second
}

func galeraClaim(key string) idemdriver.ClaimParams {
	return idemdriver.ClaimParams{Scope: "acct", Key: key, Method: "POST", Path: "/v1/payments",
		Fingerprint: make([]byte, 32), LeaseDuration: 30 * time.Second, Retention: time.Hour}
}

// A claim on one node, right after a completion on another, sees the
// outcome and replays it. Regression (issue 10): with wsrep_sync_wait=0,
// 305 of 1200 such duplicates got 409 from a stale PROCESSING row.
func TestGaleraClaimReadsSeeTheLatestOutcome(t *testing.T) {
	d1, d2 := galeraPair(t, "")
	ctx := context.Background()
	stale := 0
	const n = 300
	for i := range n {
		p := galeraClaim(fmt.Sprintf("k%d", i))
		res, err := d1.Claim(ctx, p)
		require.NoError(t, err)
		require.True(t, res.Claimed)
		galeraComplete(t, d1, p, res)
		dup, err := d2.Claim(ctx, p)
		require.NoError(t, err)
		require.False(t, dup.Claimed, "a duplicate on node 2 took over a live claim")
		if dup.Record.State != idemdriver.StateSucceeded {
			stale++
		}
	}
	require.Zero(t, stale, "duplicates on node 2 that read a stale PROCESSING row instead of the outcome (of %d)", n)
}

// galeraComplete records a 201 for the claim res of p.
func galeraComplete(t testing.TB, d *idemmysql.Driver, p idemdriver.ClaimParams, res idemdriver.ClaimResult) {
	t.Helper()
	ok, err := d.Complete(context.Background(), idemdriver.CompleteParams{
		FenceParams: idemdriver.FenceParams{Scope: p.Scope, Key: p.Key, FencingToken: res.Record.FencingToken, CreatedAt: res.Record.CreatedAt},
		Response:    idemdriver.Response{Status: 201, Header: map[string][]string{}, Body: []byte(`{}`), BodyStored: true, BodySize: 2},
	})
	require.NoError(t, err)
	require.True(t, ok)
}

// takeoverStore runs fn between the completion written in the business
// transaction and its COMMIT, on the real driver.
type takeoverStore struct {
	*idemmysql.Driver
	fn func()
}

func (s takeoverStore) Begin(ctx context.Context) (idemdriver.Tx, error) {
	tx, err := s.Driver.Begin(ctx)
	return takeoverTx{tx, s.fn}, err
}

type takeoverTx struct {
	idemdriver.Tx
	fn func()
}

func (t takeoverTx) Complete(ctx context.Context, p idemdriver.CompleteParams) (bool, error) {
	ok, err := t.Tx.Complete(ctx, p)
	if ok && err == nil {
		t.fn()
	}
	return ok, err
}

// An owner on node 1 whose COMMIT loses certification (1213) to a takeover
// committed on node 2 is answered the lease-lost 409, as on one server, and
// its business writes are gone. Regression (issue 10): it was answered 503.
func TestGaleraCertificationFailureIsLeaseLost(t *testing.T) {
	d1, d2 := galeraPair(t, "")
	ctx := context.Background()
	_, err := d1.DB().Exec(`CREATE TABLE business_rows (id VARCHAR(255) PRIMARY KEY) ENGINE = InnoDB`)
	require.NoError(t, err)
	fp := []byte(strings.Repeat("f", 32))
	var took atomic.Bool
	takeover := func() {
		// The lease has run out, as seen from node 2 (the clock moved by an hour).
		p := galeraClaim("k")
		p.Scope, p.Fingerprint, p.ClockOffset = idem.SingleTenantScope, fp, time.Hour
		res, err := d2.Claim(ctx, p)
		require.NoError(t, err)
		require.True(t, res.Claimed, "the takeover on node 2")
		took.Store(true)
	}
	mw, err := idem.NewMiddleware(takeoverStore{d1, takeover}, idem.Options{
		Scope:   idem.SingleTenant,
		Request: idem.RequestOptions{Fingerprint: func(*http.Request, []byte) []byte { return fp }},
	})
	require.NoError(t, err)
	h := mw.Handler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		tx, err := idem.Tx[*sql.Tx](r.Context())
		require.NoError(t, err)
		_, err = tx.ExecContext(r.Context(), `INSERT INTO business_rows VALUES ('p1')`)
		require.NoError(t, err)
		w.WriteHeader(http.StatusCreated)
	}))
	req := httptest.NewRequest(http.MethodPost, "/v1/payments", strings.NewReader(`{}`))
	req.Header.Set(idem.HeaderKey, "k")
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, req)
	require.True(t, took.Load())
	require.Equal(t, http.StatusConflict, rec.Code, rec.Body.String())
	require.Contains(t, rec.Body.String(), idem.ProblemTypeBase+"request-in-flight")
	var n int
	require.NoError(t, d2.DB().QueryRow(`SELECT count(*) FROM business_rows`).Scan(&n))
	require.Zero(t, n, "the owner's business writes did not commit")
}

// BenchmarkGaleraReplay measures the cost of wsrep_sync_wait: a duplicate's
// claim on node 2 of a key completed on node 1 (a replay), with the
// setting off (0) and as Open sets it (1). scripts/topology/galera runs it.
func BenchmarkGaleraReplay(b *testing.B) {
	for _, w := range []string{"0", "1"} {
		b.Run("wsrep_sync_wait="+w, func(b *testing.B) {
			d1, d2 := galeraPair(b, "?wsrep_sync_wait="+w)
			ctx := context.Background()
			p := galeraClaim("k")
			res, err := d1.Claim(ctx, p)
			require.NoError(b, err)
			galeraComplete(b, d1, p, res)
			require.Eventually(b, func() bool { // with 0, node 2 may not have applied it yet
				dup, err := d2.Claim(ctx, p)
				return err == nil && dup.Record.State == idemdriver.StateSucceeded
			}, 10*time.Second, time.Millisecond)
			b.ResetTimer()
			for b.Loop() {
				dup, err := d2.Claim(ctx, p)
				if err != nil || dup.Record.State != idemdriver.StateSucceeded {
					b.Fatalf("replay on node 2: %v %v", dup.Record.State, err)
				}
			}
		})
	}
}
