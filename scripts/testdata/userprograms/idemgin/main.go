// A new user's program on idemgin and the core: SQLite, a protected
// handler, a retry replayed (scripts/release-check).
package main

import (
	"context"
	"fmt"
	"io"
	"log"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"

	"github.com/idemgo/idem"
	"github.com/idemgo/idem/adapters/idemgin"
	"github.com/idemgo/idem/idemsqlite"

	"github.com/gin-gonic/gin"
)

func main() {
	ctx := context.Background()
	dir, err := os.MkdirTemp("", "idem-user-")
	if err != nil {
		log.Fatal(err)
	}
	defer os.RemoveAll(dir)
	store, err := idemsqlite.Open(ctx, filepath.Join(dir, "idem.db"))
	if err != nil {
		log.Fatal(err)
	}
	defer store.Close()
	if err := store.Migrate(ctx); err != nil {
		log.Fatal(err)
	}
	mw, err := idem.New(idem.Config{EngineConfig: idem.EngineConfig{Store: store}, Scope: idem.SingleTenant})
	if err != nil {
		log.Fatal(err)
	}
	charges := 0
	gin.SetMode(gin.ReleaseMode)
	r := gin.New()
	r.Use(idemgin.Middleware(mw))
	r.POST("/", func(c *gin.Context) {
		charges++
		c.JSON(http.StatusCreated, gin.H{"charge": charges})
	})
	srv := httptest.NewServer(r)
	defer srv.Close()
	post(srv.URL)
	post(srv.URL)
	fmt.Println("charges:", charges)
}

// post sends the same charge with the same Idempotency-Key and prints the
// answer.
func post(url string) {
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
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		log.Fatal(err)
	}
	fmt.Printf("%d replayed=%q %s\n", resp.StatusCode, resp.Header.Get("Idempotent-Replayed"), b)
}
