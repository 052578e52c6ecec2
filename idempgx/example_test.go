package idempgx_test

import (
	"context"
	"errors"
	"fmt"
	"log"
	"net/http"
	"os"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemgo/idem"
	"github.com/idemgo/idem/idempgx"
)

// New takes the application's pgx pool; Migrate creates idem_keys in the
// pool's search_path schema. (Compiled, not run: it needs a server.)
func ExampleNew() {
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, os.Getenv("DATABASE_URL"))
	if err != nil {
		log.Fatal(err)
	}
	defer pool.Close()
	store := idempgx.New(pool)
	if err := store.Migrate(ctx); err != nil {
		log.Fatal(err)
	}
	mw, err := idem.NewMiddleware(store, idem.Options{Scope: func(r *http.Request) (string, error) { return r.Header.Get("X-Account"), nil }})
	if err != nil {
		log.Fatal(err)
	}
	http.Handle("POST /v1/payments", mw.Handler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.WriteHeader(http.StatusCreated)
	})))
}

// Tx is the claim's pgx.Tx. A failed statement aborts a PostgreSQL
// transaction: answer what it means (here a unique violation is a 409) and
// idem rolls back and records that answer; a 2xx after it would claim writes
// that never happened, and is answered 500 instead. (Compiled, not run.)
func ExampleTx() {
	pay := func(w http.ResponseWriter, r *http.Request) {
		tx, err := idem.Tx[pgx.Tx](r.Context())
		if err != nil {
			http.Error(w, err.Error(), http.StatusServiceUnavailable)
			return
		}
		_, err = tx.Exec(r.Context(), `INSERT INTO orders (number) VALUES ($1)`, r.URL.Query().Get("number"))
		var pgErr *pgconn.PgError
		switch {
		case errors.As(err, &pgErr) && pgErr.Code == "23505": // unique_violation
			http.Error(w, "the order exists", http.StatusConflict)
			return
		case err != nil:
			http.Error(w, "try again", http.StatusServiceUnavailable) // FAILED: the retry runs again
			return
		}
		w.WriteHeader(http.StatusCreated)
		fmt.Fprint(w, `{"status":"created"}`)
		// No Commit: idem commits the order and its outcome together.
	}
	_ = pay
}

// NewPartitioned keeps records in daily partitions, so that retention drops
// whole days instead of deleting rows (docs/retention.md). (Compiled, not
// run.)
func ExampleNewPartitioned() {
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, os.Getenv("DATABASE_URL"))
	if err != nil {
		log.Fatal(err)
	}
	defer pool.Close()
	store := idempgx.NewPartitioned(pool, idempgx.PartitionConfig{DaysAhead: 7}) // default 7
	// Migrate: the partitioned table, and today's through today+7's partitions.
	if err := store.Migrate(ctx); err != nil {
		log.Fatal(err)
	}
	if _, err := idem.NewMiddleware(store, idem.Options{Scope: idem.SingleTenant}); err != nil {
		log.Fatal(err) // a Retention beyond the partitions' MaxRetention is refused
	}
}
