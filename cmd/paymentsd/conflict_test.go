package main

import (
	"context"
	"database/sql"
	"errors"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/idemgo/idem/internal/dbtest"
)

// deadlock runs two transactions that each lock one row and then want the
// other's, and returns the error the database gave the one it chose to
// abort. begin, update and end drive one database's transactions.
func deadlock[TX any](t *testing.T, begin func() (TX, error), update func(TX, int) error, end func(TX)) error {
	t.Helper()
	a, err := begin()
	require.NoError(t, err)
	defer end(a)
	b, err := begin()
	require.NoError(t, err)
	defer end(b)
	require.NoError(t, update(a, 1))
	require.NoError(t, update(b, 2))
	crossed := make(chan error, 1)
	go func() { crossed <- update(a, 2) }() // waits for b's lock
	errB := update(b, 1)                    // closes the cycle
	if errB != nil {
		end(b) // frees a
		<-crossed
		return errB
	}
	return <-crossed
}

// Regression: in the Galera storm, a node's certification refused the
// payment's INSERT with 1213 (a lost race) and paymentsd answered 500. A
// database's "this transaction conflicted, retry it" is answered 503 with
// Retry-After, on every database that reports one (real deadlocks).
func TestConflictIsRetryLater(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	for name, conflict := range map[string]func(t *testing.T) error{
		"mysql": func(t *testing.T) error {
			db := dbtest.MySQLDB(t)
			_, err := db.Exec(`CREATE TABLE rows_ (id INT PRIMARY KEY, n INT)`)
			require.NoError(t, err)
			_, err = db.Exec(`INSERT INTO rows_ VALUES (1, 0), (2, 0)`)
			require.NoError(t, err)
			return deadlock(t, func() (*sql.Tx, error) { return db.BeginTx(ctx, nil) },
				func(tx *sql.Tx, id int) error {
					_, err := tx.Exec(`UPDATE rows_ SET n = n + 1 WHERE id = ?`, id)
					return err
				}, func(tx *sql.Tx) { _ = tx.Rollback() }) // ends either way; ErrTxDone after the abort is expected
		},
		"postgres": func(t *testing.T) error {
			pool := dbtest.PostgresPool(t)
			_, err := pool.Exec(ctx, `CREATE TABLE rows_ (id INT PRIMARY KEY, n INT); INSERT INTO rows_ VALUES (1, 0), (2, 0)`)
			require.NoError(t, err)
			return deadlock(t, func() (pgx.Tx, error) { return pool.Begin(ctx) },
				func(tx pgx.Tx, id int) error {
					_, err := tx.Exec(ctx, `UPDATE rows_ SET n = n + 1 WHERE id = $1`, id)
					return err
				}, func(tx pgx.Tx) { _ = tx.Rollback(ctx) }) // ends either way; ErrTxClosed after the abort is expected
		},
	} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			err := conflict(t)
			require.Error(t, err, "one of the two transactions is aborted")
			require.True(t, conflicted(err), "%v", err)
			rec := httptest.NewRecorder()
			a := &api{log: slog.New(slog.DiscardHandler)}
			a.storeFailed(rec, httptest.NewRequest(http.MethodPost, "/v1/payments", nil), "recording the payment", err)
			require.Equal(t, http.StatusServiceUnavailable, rec.Code, rec.Body.String())
			require.Equal(t, "1", rec.Header().Get("Retry-After"))
		})
	}
	require.False(t, conflicted(errors.New("disk full")))
}
