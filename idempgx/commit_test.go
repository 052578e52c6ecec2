package idempgx_test

import (
	"context"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/idemgo/idem"
	"github.com/idemgo/idem/idemdriver"
	"github.com/idemgo/idem/idempgx"
	"github.com/idemgo/idem/internal/dbtest"
)

// A COMMIT that fails (here a deferred foreign key, checked at COMMIT)
// rolls back the business rows and idem's completion together; idem then
// records FAILED, so the retry runs at once, and says so. Regression: the
// record stayed PROCESSING for a whole lease (every retry 409, Retry-After
// 30) and the 503 said "the request was not processed".
func TestCommitFailureReleasesTheClaim(t *testing.T) {
	ctx := context.Background()
	pool := dbtest.PostgresPool(t)
	d := idempgx.New(pool)
	require.NoError(t, d.Migrate(ctx))
	_, err := pool.Exec(ctx, `CREATE TABLE parents (id int PRIMARY KEY);
		CREATE TABLE children (parent_id int REFERENCES parents (id) DEFERRABLE INITIALLY DEFERRED)`)
	require.NoError(t, err)
	mw, err := idem.NewMiddleware(d, idem.Options{Scope: idem.SingleTenant})
	require.NoError(t, err)
	runs := 0
	h := mw.Handler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		runs++
		tx, err := idem.Tx[pgx.Tx](r.Context())
		require.NoError(t, err)
		if runs == 1 {
			_, err = tx.Exec(r.Context(), `INSERT INTO children VALUES (42)`) // no parent 42: COMMIT fails
		} else {
			_, err = tx.Exec(r.Context(), `INSERT INTO parents VALUES (42)`)
		}
		require.NoError(t, err)
		w.WriteHeader(http.StatusCreated)
	}))

	first := sendPayment(h)
	require.Equal(t, http.StatusServiceUnavailable, first.Code)
	var p map[string]any
	require.NoError(t, json.Unmarshal(first.Body.Bytes(), &p))
	require.Equal(t, idem.ProblemTypeBase+"store-unavailable", p["type"])
	require.Contains(t, p["detail"], "which was not recorded (the writes of the request's transaction were rolled back with it)")
	rec, err := d.Get(ctx, idemdriver.GetParams{Scope: "global", Key: "k"})
	require.NoError(t, err)
	require.Equal(t, idemdriver.StateFailed, rec.State, "the claim is released, not held for a lease")

	second := sendPayment(h)
	require.Equal(t, http.StatusCreated, second.Code, "the retry runs at once")
	require.Equal(t, 2, runs)
	var children int
	require.NoError(t, pool.QueryRow(ctx, `SELECT count(*) FROM children`).Scan(&children))
	require.Zero(t, children, "the failed commit's rows are gone")
}

// sendPayment serves one POST /v1/payments with body {} and Idempotency-Key
// "k" through h, in-process, and returns the answer.
func sendPayment(h http.Handler) *httptest.ResponseRecorder {
	req := httptest.NewRequest(http.MethodPost, "/v1/payments", strings.NewReader(`{}`))
	req.Header.Set(idem.HeaderKey, "k")
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, req)
	return rec
}
