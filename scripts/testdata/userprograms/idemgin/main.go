// A new user's program on idemgin and the core: SQLite, a protected gin
// route, a retry replayed (scripts/release-check; shared/user.go).
package main

import (
	"net/http"
	"net/http/httptest"

	"github.com/gin-gonic/gin"

	"github.com/idemgo/idem/adapters/idemgin"
)

func main() {
	mw, done := newMiddleware(nil)
	defer done()
	gin.SetMode(gin.ReleaseMode)
	r := gin.New()
	r.Use(idemgin.Middleware(mw))
	r.POST("/", func(c *gin.Context) {
		charges++
		c.JSON(http.StatusCreated, gin.H{"charge": charges})
	})
	srv := httptest.NewServer(r)
	defer srv.Close()
	twice(srv.URL)
}
