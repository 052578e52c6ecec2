package browser_test

import (
	"fmt"
	"log"
	"net/http"
	"net/http/httptest"
	"strings"

	"github.com/rs/cors"

	"github.com/idemgo/idem"
	"github.com/idemgo/idem/internal/dbtest"
)

// pageKeysOnly is docs/clients.md's check that refuses the keys a page did
// not make (a browser may add one of its own).
func pageKeysOnly(next http.Handler) http.Handler { // cors -> pageKeysOnly -> idem -> handler
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if k := r.Header.Get("Idempotency-Key"); k != "" && !strings.HasPrefix(strings.Trim(k, `"`), "web-") {
			http.Error(w, "the Idempotency-Key must come from the page (web-...)", http.StatusBadRequest)
			return
		}
		next.ServeHTTP(w, r)
	})
}

// idem inside rs/cors, as docs/clients.md shows it (WithCORS is the same):
// every answer of idem, a replay included, carries the CORS headers, and
// the page may read idem's. Then the same with pageKeysOnly between them.
func Example_cors() {
	// idem on SQLite in a temporary directory (idemsqlite.ExampleOpen).
	mw, _, done := dbtest.ExampleMiddleware(idem.Options{})
	defer done()
	orders := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.WriteHeader(http.StatusCreated)
		_, _ = fmt.Fprint(w, `{"order":"ord_1"}`) // a write error means the client is gone
	})

	c := cors.New(cors.Options{
		AllowedOrigins: []string{"https://shop.example.com"},
		AllowedMethods: []string{http.MethodPost, http.MethodPatch},
		AllowedHeaders: []string{"Content-Type", "Idempotency-Key"},
		ExposedHeaders: []string{"Idempotent-Replayed", "Retry-After", "Idempotency-Key", "Idempotency-Key-Expires", "Location"},
	})
	handler := c.Handler(mw.Handler(orders)) // cors -> idem -> handler

	checked := c.Handler(pageKeysOnly(mw.Handler(orders)))
	for i, h := range []http.Handler{handler, checked} {
		srv := httptest.NewServer(h)
		for _, key := range []string{"web-", "web-", "order-"} {
			key += fmt.Sprint(i + 1)
			req, err := http.NewRequest(http.MethodPost, srv.URL+"/v1/orders", strings.NewReader(`{}`))
			if err != nil {
				log.Fatal(err)
			}
			req.Header.Set("Origin", "https://shop.example.com")
			req.Header.Set("Idempotency-Key", key)
			resp, err := http.DefaultClient.Do(req)
			if err != nil {
				log.Fatal(err)
			}
			if err := resp.Body.Close(); err != nil {
				log.Fatal(err)
			}
			fmt.Printf("%s %d replayed=%q allow-origin=%q\n", key, resp.StatusCode,
				resp.Header.Get("Idempotent-Replayed"), resp.Header.Get("Access-Control-Allow-Origin"))
		}
		srv.Close()
	}
	// Output:
	// web-1 201 replayed="" allow-origin="https://shop.example.com"
	// web-1 201 replayed="true" allow-origin="https://shop.example.com"
	// order-1 201 replayed="" allow-origin="https://shop.example.com"
	// web-2 201 replayed="" allow-origin="https://shop.example.com"
	// web-2 201 replayed="true" allow-origin="https://shop.example.com"
	// order-2 400 replayed="" allow-origin="https://shop.example.com"
}
