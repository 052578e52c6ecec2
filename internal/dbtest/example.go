package dbtest

import (
	"context"
	"errors"
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

// ExampleStore opens a migrated SQLite store in a new temporary directory,
// for runnable examples, which have no testing.T: a failure ends the program
// (log.Fatal). The returned function closes the store and removes the
// directory.
func ExampleStore() (*idemsqlite.Driver, func()) {
	dir, err := os.MkdirTemp("", "idem-example")
	if err != nil {
		log.Fatal(err)
	}
	ctx := context.Background()
	store, err := idemsqlite.Open(ctx, filepath.Join(dir, "idem.db"))
	if err != nil {
		log.Fatal(err)
	}
	if err := store.Migrate(ctx); err != nil {
		log.Fatal(err)
	}
	return store, func() {
		if err := errors.Join(store.Close(), os.RemoveAll(dir)); err != nil {
			log.Fatal(err)
		}
	}
}

// ExampleMiddleware returns idem's middleware with cfg on a store of
// ExampleStore (a nil cfg.Scope puts every request in the
// scope "merchant_42"), the store, and the function that closes the store and
// removes its directory. A failure ends the program (log.Fatal).
func ExampleMiddleware(cfg idem.Options) (*idem.Middleware, *idemsqlite.Driver, func()) {
	store, done := ExampleStore()
	if cfg.Scope == nil {
		cfg.Scope = func(*http.Request) (string, error) { return "merchant_42", nil }
	}
	mw, err := idem.NewMiddleware(store, cfg)
	if err != nil {
		done()
		log.Fatal(err)
	}
	return mw, store, done
}

// PrintPost sends one POST to url with Content-Type application/json, the
// Idempotency-Key key and body, and prints what came back for an example's
// Output: `<status> replayed="<Idempotent-Replayed>" <body, trimmed>`.
func PrintPost(url, key, body string) {
	req, err := http.NewRequest(http.MethodPost, url, strings.NewReader(body))
	if err != nil {
		log.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Idempotency-Key", key)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		log.Fatal(err)
	}
	b, err := io.ReadAll(resp.Body)
	if err = errors.Join(err, resp.Body.Close()); err != nil {
		log.Fatal(err)
	}
	fmt.Printf("%d replayed=%q %s\n", resp.StatusCode, resp.Header.Get("Idempotent-Replayed"), strings.TrimSpace(string(b)))
}
