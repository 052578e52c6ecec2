// The README's quick start: one payment endpoint protected by idem, on
// embedded SQLite. Run it with go run . and send it the README's curl
// commands.
package main

import (
	"context"
	"database/sql"
	"flag"
	"fmt"
	"io"
	"log"
	"net/http"

	"github.com/idemgo/idem"
	"github.com/idemgo/idem/idemsqlite"
)

func main() {
	addr := flag.String("addr", "127.0.0.1:8080", "listen address")
	flag.Parse()
	ctx := context.Background()

	store, err := idemsqlite.Open(ctx, "quickstart.db") // idem's records and the payments, in one file
	if err != nil {
		log.Fatal(err)
	}
	if err := store.Migrate(ctx); err != nil { // idem's table
		log.Fatal(err)
	}
	if _, err := store.DB().ExecContext(ctx, `CREATE TABLE IF NOT EXISTS payments (id INTEGER PRIMARY KEY, body TEXT)`); err != nil {
		log.Fatal(err)
	}

	// Scope: who owns a key; with many customers, the authenticated one.
	mw, err := idem.NewMiddleware(store, idem.Options{Scope: idem.SingleTenant})
	if err != nil {
		log.Fatal(err)
	}

	pay := func(w http.ResponseWriter, r *http.Request) {
		body, err := io.ReadAll(r.Body)
		var res sql.Result
		if err == nil {
			var tx *sql.Tx // the claim's transaction: idem commits it with the outcome, never you
			if tx, err = idem.Tx[*sql.Tx](r.Context()); err == nil {
				res, err = tx.ExecContext(r.Context(), `INSERT INTO payments (body) VALUES (?)`, body)
			}
		}
		if err != nil {
			http.Error(w, "try again", http.StatusServiceUnavailable) // a 5xx: the retry runs again
			return
		}
		id, _ := res.LastInsertId()
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusCreated)
		_, _ = fmt.Fprintf(w, "{\"payment\":%d}\n", id) // replayed byte for byte to every retry
	}
	http.Handle("POST /payments", mw.Handler(http.HandlerFunc(pay))) // only the routes with side effects

	log.Printf("listening on http://%s", *addr)
	log.Fatal(http.ListenAndServe(*addr, nil))
}
