package idemecho_test

import (
	"fmt"
	"log"
	"net/http"
	"net/http/httptest"

	"github.com/labstack/echo/v4"
	"github.com/labstack/echo/v4/middleware"

	"github.com/idemgo/idem"
	"github.com/idemgo/idem/adapters/idemecho"
	"github.com/idemgo/idem/internal/dbtest"
)

// Protect an echo route group. An error the handler returns is answered by
// echo's HTTPErrorHandler inside idem's writer, so a declined card is recorded
// and replayed as the 402 it is, and a provider outage (503) is not recorded:
// its retry runs again (CONTRACT section 5).
func Example() {
	// idem.New on SQLite in a temporary directory, every request in the
	// scope merchant_42: see idem's Example and idemsqlite.ExampleOpen.
	mw, _, done := dbtest.ExampleMiddleware(idem.Options{})
	defer done()

	e := echo.New()
	e.HideBanner = true
	e.Use(middleware.Recover())
	v1 := e.Group("/v1", idemecho.Middleware(mw))
	attempts := 0
	v1.POST("/payments", func(c echo.Context) error {
		attempts++
		var req struct {
			Amount int64 `json:"amount"`
		}
		if err := c.Bind(&req); err != nil {
			return err
		}
		switch {
		case req.Amount > 100000:
			return echo.NewHTTPError(http.StatusPaymentRequired, "card declined")
		case req.Amount == 0:
			return echo.NewHTTPError(http.StatusServiceUnavailable, "provider unavailable")
		}
		return c.JSON(http.StatusCreated, map[string]any{"payment": attempts, "amount": req.Amount})
	})
	srv := httptest.NewServer(e)
	defer srv.Close()

	dbtest.PrintPost(srv.URL+"/v1/payments", "order-1", `{"amount":1000}`)
	dbtest.PrintPost(srv.URL+"/v1/payments", "order-1", `{"amount":1000}`)
	dbtest.PrintPost(srv.URL+"/v1/payments", "order-2", `{"amount":500000}`)
	dbtest.PrintPost(srv.URL+"/v1/payments", "order-2", `{"amount":500000}`)
	dbtest.PrintPost(srv.URL+"/v1/payments", "order-3", `{"amount":0}`)
	dbtest.PrintPost(srv.URL+"/v1/payments", "order-3", `{"amount":0}`)
	fmt.Println("handler runs:", attempts)
	// Output:
	// 201 replayed="" {"amount":1000,"payment":1}
	// 201 replayed="true" {"amount":1000,"payment":1}
	// 402 replayed="" {"message":"card declined"}
	// 402 replayed="true" {"message":"card declined"}
	// 503 replayed="" {"message":"provider unavailable"}
	// 503 replayed="" {"message":"provider unavailable"}
	// handler runs: 4
}

// The package documentation's registration, and the README's one line: a
// group's routes, under idem's middleware.
func ExampleMiddleware() {
	store, done := dbtest.ExampleStore() // SQLite in a temporary directory; see idemsqlite.ExampleOpen
	defer done()
	tenantOf := func(r *http.Request) (string, error) { return "merchant_42", nil } // from your authentication
	runs := 0
	charge := func(c echo.Context) error {
		runs++
		return c.JSON(http.StatusCreated, map[string]int{"run": runs})
	}
	pay := charge

	mw, err := idem.NewMiddleware(store, idem.Options{Scope: tenantOf})
	if err != nil {
		log.Fatal(err)
	}
	e := echo.New()
	e.Use(middleware.Recover())
	payments := e.Group("/v1", idemecho.Middleware(mw))
	payments.POST("/charges", charge)

	e.Group("/v1", idemecho.Middleware(mw)).POST("/payments", pay)

	e.HideBanner = true
	srv := httptest.NewServer(e)
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
