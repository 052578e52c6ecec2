package idemsqlite_test

import (
	"context"
	"database/sql"
	"fmt"
	"log"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"

	"github.com/idemgo/idem"
	"github.com/idemgo/idem/idemsqlite"
	"github.com/idemgo/idem/internal/dbtest"
)

// Open a store on a file (created, in WAL mode), migrate it, and protect a
// handler with it.
func ExampleOpen() {
	dir, _ := os.MkdirTemp("", "idemsqlite-example")
	defer os.RemoveAll(dir)
	ctx := context.Background()
	store, err := idemsqlite.Open(ctx, filepath.Join(dir, "idem.db"))
	if err != nil {
		log.Fatal(err)
	}
	defer store.Close()
	if err := store.Migrate(ctx); err != nil {
		log.Fatal(err)
	}
	mw, err := idem.NewMiddleware(store, idem.Options{Scope: idem.SingleTenant})
	if err != nil {
		log.Fatal(err)
	}
	srv := httptest.NewServer(mw.Handler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.WriteHeader(http.StatusCreated)
		fmt.Fprint(w, `{"id":"pay_1"}`)
	})))
	defer srv.Close()

	dbtest.PrintPost(srv.URL, "order-1", `{"amount":1000}`)
	dbtest.PrintPost(srv.URL, "order-1", `{"amount":1000}`)
	// Output:
	// 201 replayed="" {"id":"pay_1"}
	// 201 replayed="true" {"id":"pay_1"}
}

// Tx hands the handler the claim's transaction: its rows and idem's record
// of the answer commit together. A statement that fails is the handler's to
// answer: here a duplicate order number is a 409, recorded and replayed
// like any answer. (SQLite fails only the statement; PostgreSQL aborts the
// whole transaction, and idem then records the 409 on its own.)
func ExampleTx() {
	store, done := dbtest.ExampleStore()
	defer done()
	if _, err := store.DB().Exec(`CREATE TABLE orders (number TEXT PRIMARY KEY)`); err != nil {
		log.Fatal(err)
	}
	mw, err := idem.NewMiddleware(store, idem.Options{Scope: idem.SingleTenant})
	if err != nil {
		log.Fatal(err)
	}
	srv := httptest.NewServer(mw.Handler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		tx, err := idem.Tx[*sql.Tx](r.Context())
		if err != nil {
			http.Error(w, err.Error(), http.StatusServiceUnavailable)
			return
		}
		number := r.URL.Query().Get("number")
		if _, err := tx.ExecContext(r.Context(), `INSERT INTO orders (number) VALUES (?)`, number); err != nil {
			// Never ignore it: answer what it means.
			http.Error(w, "order "+number+" exists", http.StatusConflict)
			return
		}
		w.WriteHeader(http.StatusCreated)
		fmt.Fprintf(w, `{"order":%q}`, number)
		// No Commit here: idem commits the order and its outcome together.
	})))
	defer srv.Close()

	dbtest.PrintPost(srv.URL+"?number=A-1", "k1", `{}`)
	dbtest.PrintPost(srv.URL+"?number=A-1", "k2", `{}`) // another request for the same order
	dbtest.PrintPost(srv.URL+"?number=A-1", "k2", `{}`) // its retry gets the same answer
	var n int
	_ = store.DB().QueryRow(`SELECT count(*) FROM orders`).Scan(&n)
	fmt.Println("orders:", n)
	// Output:
	// 201 replayed="" {"order":"A-1"}
	// 409 replayed="" order A-1 exists
	// 409 replayed="true" order A-1 exists
	// orders: 1
}
