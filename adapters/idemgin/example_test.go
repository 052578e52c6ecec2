package idemgin_test

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

	"github.com/gin-gonic/gin"

	"github.com/idemgo/idem"
	"github.com/idemgo/idem/adapters/idemgin"
	"github.com/idemgo/idem/idemsqlite"
)

// post sends one JSON POST with an Idempotency-Key and prints what came back.
func post(url, key, body string) {
	req, _ := http.NewRequest(http.MethodPost, url, strings.NewReader(body))
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Idempotency-Key", key)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		log.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	fmt.Printf("%d replayed=%q %s\n", resp.StatusCode, resp.Header.Get("Idempotent-Replayed"), strings.TrimSpace(string(b)))
}

// Protect a gin route group. The charge handler writes its business row in
// the claim's transaction (transactional mode, CONTRACT section 6); a retry
// gets the recorded response, and a declined card, answered with
// c.AbortWithStatusJSON, is recorded and replayed as the 402 it is.
func Example() {
	dir, _ := os.MkdirTemp("", "idemgin-example")
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
	if _, err := store.DB().Exec(`CREATE TABLE payments (id INTEGER PRIMARY KEY, amount INTEGER)`); err != nil {
		log.Fatal(err)
	}
	mw, err := idem.New(idem.Config{
		Store: store,
		Scope: func(r *http.Request) (string, error) { return "merchant_42", nil },
	})
	if err != nil {
		log.Fatal(err)
	}

	gin.SetMode(gin.ReleaseMode)
	r := gin.New()
	r.Use(gin.Recovery())
	v1 := r.Group("/v1", idemgin.Middleware(mw))
	v1.POST("/payments", func(c *gin.Context) {
		var req struct {
			Amount int64 `json:"amount" binding:"required"`
		}
		if err := c.ShouldBindJSON(&req); err != nil {
			c.AbortWithStatusJSON(http.StatusBadRequest, gin.H{"error": err.Error()})
			return
		}
		if req.Amount > 100000 {
			c.AbortWithStatusJSON(http.StatusPaymentRequired, gin.H{"error": "card declined"})
			return
		}
		// c.Request is idem's: its context carries the claim's transaction.
		tx, err := idemsqlite.Tx(c.Request.Context())
		if err != nil {
			_ = c.AbortWithError(http.StatusServiceUnavailable, err)
			return
		}
		res, err := tx.ExecContext(c.Request.Context(), `INSERT INTO payments (amount) VALUES (?)`, req.Amount)
		if err != nil {
			_ = c.AbortWithError(http.StatusServiceUnavailable, err)
			return
		}
		id, _ := res.LastInsertId()
		c.JSON(http.StatusCreated, gin.H{"payment": id, "amount": req.Amount})
	})
	srv := httptest.NewServer(r)
	defer srv.Close()

	post(srv.URL+"/v1/payments", "order-1", `{"amount":1000}`)
	post(srv.URL+"/v1/payments", "order-1", `{"amount":1000}`)
	post(srv.URL+"/v1/payments", "order-2", `{"amount":500000}`)
	post(srv.URL+"/v1/payments", "order-2", `{"amount":500000}`)
	var n int
	_ = store.DB().QueryRow(`SELECT count(*) FROM payments`).Scan(&n)
	fmt.Println("payments:", n)
	// Output:
	// 201 replayed="" {"amount":1000,"payment":1}
	// 201 replayed="true" {"amount":1000,"payment":1}
	// 402 replayed="" {"error":"card declined"}
	// 402 replayed="true" {"error":"card declined"}
	// payments: 1
}
