// What every new user's program shares; scripts/release-check copies this
// file beside each program's main.go: a store, the middleware on it, and
// the same charge posted twice.
package main

import (
	"context"
	"fmt"
	"io"
	"log"
	"net/http"
	"os"
	"path/filepath"
	"strings"

	"github.com/idemgo/idem"
	"github.com/idemgo/idem/idemsqlite"
)

// charges counts the handler's runs: the side effect.
var charges int

// newMiddleware returns the middleware on a migrated SQLite store in a
// temporary directory, reporting to obs (nil: none); done removes them.
func newMiddleware(obs idem.Observer) (mw *idem.Middleware, done func()) {
	ctx := context.Background()
	dir, err := os.MkdirTemp("", "idem-user-")
	if err != nil {
		log.Fatal(err)
	}
	store, err := idemsqlite.Open(ctx, filepath.Join(dir, "idem.db"))
	if err != nil {
		log.Fatal(err)
	}
	if err := store.Migrate(ctx); err != nil {
		log.Fatal(err)
	}
	mw, err = idem.NewMiddleware(store, idem.Options{Scope: idem.SingleTenant, Engine: idem.EngineOptions{Observer: obs}})
	if err != nil {
		log.Fatal(err)
	}
	return mw, func() {
		_ = store.Close()
		_ = os.RemoveAll(dir)
	}
}

// charge is a net/http handler with the side effect.
func charge(w http.ResponseWriter, r *http.Request) {
	charges++
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(http.StatusCreated)
	fmt.Fprintf(w, `{"charge":%d}`, charges)
}

// twice posts the same charge with the same Idempotency-Key twice, prints
// each answer, then the charges made.
func twice(url string) {
	for range 2 {
		req, err := http.NewRequest(http.MethodPost, url, strings.NewReader(`{"amount":1000}`))
		if err != nil {
			log.Fatal(err)
		}
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set("Idempotency-Key", "order-1001")
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			log.Fatal(err)
		}
		b, err := io.ReadAll(resp.Body)
		_ = resp.Body.Close()
		if err != nil {
			log.Fatal(err)
		}
		fmt.Printf("%d replayed=%q %s\n", resp.StatusCode, resp.Header.Get("Idempotent-Replayed"), b)
	}
	fmt.Println("charges:", charges)
}
