package idemecho_test

import (
	"fmt"
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
