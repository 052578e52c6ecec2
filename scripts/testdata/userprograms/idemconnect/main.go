// A new user's program on idemconnect and the core: SQLite, a protected
// handler, a retry replayed (scripts/release-check; shared/user.go).
package main

import (
	"fmt"
	"net/http"
	"net/http/httptest"

	"connectrpc.com/connect"

	"github.com/idemgo/idem/adapters/idemconnect"
)

func main() {
	mw, done := newMiddleware(nil)
	defer done()
	// A plain handler stands for a Connect service; the code a 409 maps to
	// is printed to use connect-go as a service would.
	fmt.Println("409 is", idemconnect.Code("", http.StatusConflict), "not", connect.CodeUnknown)
	srv := httptest.NewServer(idemconnect.Handler(mw, http.HandlerFunc(charge)))
	defer srv.Close()
	twice(srv.URL)
}
