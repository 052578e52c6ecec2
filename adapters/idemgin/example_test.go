package idemgin_test

import (
	"database/sql"
	"fmt"
	"log"
	"net/http"
	"net/http/httptest"

	"github.com/gin-gonic/gin"

	"github.com/idemgo/idem"
	"github.com/idemgo/idem/adapters/idemgin"
	"github.com/idemgo/idem/internal/dbtest"
)

// Protect a gin route group. The charge handler writes its business row in
// the claim's transaction (CONTRACT section 6); a retry
// gets the recorded response, and a declined card, answered with
// c.AbortWithStatusJSON, is recorded and replayed as the 402 it is.
func Example() {
	// idem.New on SQLite in a temporary directory, every request in the
	// scope merchant_42: see idem's Example and idemsqlite.ExampleOpen.
	mw, store, done := dbtest.ExampleMiddleware(idem.Options{})
	defer done()
	if _, err := store.DB().Exec(`CREATE TABLE payments (id INTEGER PRIMARY KEY, amount INTEGER)`); err != nil {
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
		tx, err := idem.Tx[*sql.Tx](c.Request.Context())
		if err != nil {
			_ = c.AbortWithError(http.StatusServiceUnavailable, err)
			return
		}
		res, err := tx.ExecContext(c.Request.Context(), `INSERT INTO payments (amount) VALUES (?)`, req.Amount)
		if err != nil {
			_ = c.AbortWithError(http.StatusServiceUnavailable, err)
			return
		}
		id, err := res.LastInsertId()
		if err != nil {
			_ = c.AbortWithError(http.StatusServiceUnavailable, err)
			return
		}
		c.JSON(http.StatusCreated, gin.H{"payment": id, "amount": req.Amount})
	})
	srv := httptest.NewServer(r)
	defer srv.Close()

	dbtest.PrintPost(srv.URL+"/v1/payments", "order-1", `{"amount":1000}`)
	dbtest.PrintPost(srv.URL+"/v1/payments", "order-1", `{"amount":1000}`)
	dbtest.PrintPost(srv.URL+"/v1/payments", "order-2", `{"amount":500000}`)
	dbtest.PrintPost(srv.URL+"/v1/payments", "order-2", `{"amount":500000}`)
	var n int
	if err := store.DB().QueryRow(`SELECT count(*) FROM payments`).Scan(&n); err != nil {
		log.Fatal(err)
	}
	fmt.Println("payments:", n)
	// Output:
	// 201 replayed="" {"amount":1000,"payment":1}
	// 201 replayed="true" {"amount":1000,"payment":1}
	// 402 replayed="" {"error":"card declined"}
	// 402 replayed="true" {"error":"card declined"}
	// payments: 1
}

// The package documentation's registration, and the README's one line: a
// group's routes, under idem's middleware.
func ExampleMiddleware() {
	store, done := dbtest.ExampleStore() // SQLite in a temporary directory; see idemsqlite.ExampleOpen
	defer done()
	tenantOf := func(r *http.Request) (string, error) { return "merchant_42", nil } // from your authentication
	runs := 0
	charge := func(c *gin.Context) {
		runs++
		c.JSON(http.StatusCreated, gin.H{"run": runs})
	}
	pay := charge
	gin.SetMode(gin.ReleaseMode)

	mw, err := idem.NewMiddleware(store, idem.Options{Scope: tenantOf})
	if err != nil {
		log.Fatal(err)
	}
	r := gin.New()
	r.Use(gin.Recovery())
	payments := r.Group("/v1", idemgin.Middleware(mw))
	payments.POST("/charges", charge)

	r.Group("/v1", idemgin.Middleware(mw)).POST("/payments", pay)

	srv := httptest.NewServer(r)
	defer srv.Close()
	dbtest.PrintPost(srv.URL+"/v1/charges", "order-1", `{}`)
	dbtest.PrintPost(srv.URL+"/v1/charges", "order-1", `{}`)
	dbtest.PrintPost(srv.URL+"/v1/payments", "order-2", `{}`)
	dbtest.PrintPost(srv.URL+"/v1/payments", "order-2", `{}`)
	// Output:
	// 201 replayed="" {"run":1}
	// 201 replayed="true" {"run":1}
	// 201 replayed="" {"run":2}
	// 201 replayed="true" {"run":2}
}
