// A new user's program on idemecho and the core: SQLite, a protected echo
// route, a retry replayed (scripts/release-check; shared/user.go).
package main

import (
	"net/http"
	"net/http/httptest"

	"github.com/labstack/echo/v4"

	"github.com/idemgo/idem/adapters/idemecho"
)

func main() {
	mw, done := newMiddleware(nil)
	defer done()
	e := echo.New()
	e.Use(idemecho.Middleware(mw))
	e.POST("/", func(c echo.Context) error {
		charges++
		return c.JSON(http.StatusCreated, map[string]int{"charge": charges})
	})
	srv := httptest.NewServer(e)
	defer srv.Close()
	twice(srv.URL)
}
