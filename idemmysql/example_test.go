package idemmysql_test

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"log"
	"net/http"
	"os"

	"github.com/go-sql-driver/mysql"

	"github.com/idemgo/idem"
	"github.com/idemgo/idem/idemmysql"
)

// Open connects from a mysql:// URL (see ParseURL) and owns its pool;
// Migrate creates idem_keys in the URL's database. (Compiled, not run: it
// needs a server.)
func ExampleOpen() {
	ctx := context.Background()
	store, err := idemmysql.Open(ctx, os.Getenv("MYSQL_URL")) // mysql://user:pass@host:3306/app
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
	http.Handle("POST /v1/payments", mw.Handler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.WriteHeader(http.StatusCreated)
	})))
}

// Tx is the claim's *sql.Tx (READ COMMITTED). Never swallow a statement's
// error: after a deadlock InnoDB has rolled the whole transaction back.
// Answer what it means: a duplicate (1062) is a 409, recorded and replayed;
// anything else a 5xx, so the retry runs again. (Compiled, not run.)
func ExampleTx() {
	pay := func(w http.ResponseWriter, r *http.Request) {
		tx, err := idem.Tx[*sql.Tx](r.Context())
		if err != nil {
			http.Error(w, err.Error(), http.StatusServiceUnavailable)
			return
		}
		_, err = tx.ExecContext(r.Context(), `INSERT INTO orders (number) VALUES (?)`, r.URL.Query().Get("number"))
		var myErr *mysql.MySQLError
		switch {
		case errors.As(err, &myErr) && myErr.Number == 1062: // ER_DUP_ENTRY
			http.Error(w, "the order exists", http.StatusConflict)
			return
		case err != nil:
			http.Error(w, "try again", http.StatusServiceUnavailable)
			return
		}
		w.WriteHeader(http.StatusCreated)
		fmt.Fprint(w, `{"status":"created"}`)
	}
	_ = pay
}
