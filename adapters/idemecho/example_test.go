package idemecho_test

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

	"github.com/labstack/echo/v4"
	"github.com/labstack/echo/v4/middleware"

	"github.com/idemgo/idem"
	"github.com/idemgo/idem/adapters/idemecho"
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

// Protect an echo route group. An error the handler returns is answered by
// echo's HTTPErrorHandler inside idem's writer, so a declined card is recorded
// and replayed as the 402 it is, and a provider outage (503) is not recorded:
// its retry runs again (CONTRACT section 5).
func Example() {
	dir, _ := os.MkdirTemp("", "idemecho-example")
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
	mw, err := idem.New(idem.Config{
		Store: store,
		Scope: func(r *http.Request) (string, error) { return "merchant_42", nil },
	})
	if err != nil {
		log.Fatal(err)
	}

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

	post(srv.URL+"/v1/payments", "order-1", `{"amount":1000}`)
	post(srv.URL+"/v1/payments", "order-1", `{"amount":1000}`)
	post(srv.URL+"/v1/payments", "order-2", `{"amount":500000}`)
	post(srv.URL+"/v1/payments", "order-2", `{"amount":500000}`)
	post(srv.URL+"/v1/payments", "order-3", `{"amount":0}`)
	post(srv.URL+"/v1/payments", "order-3", `{"amount":0}`)
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
