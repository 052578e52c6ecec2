// A new user's program on the core module alone: SQLite, a protected
// handler, a retry replayed (scripts/release-check; shared/user.go).
package main

import (
	"net/http"
	"net/http/httptest"
)

func main() {
	mw, done := newMiddleware(nil)
	defer done()
	srv := httptest.NewServer(mw.Handler(http.HandlerFunc(charge)))
	defer srv.Close()
	twice(srv.URL)
}
