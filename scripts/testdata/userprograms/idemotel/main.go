// A new user's program on idemotel and the core: SQLite, a protected
// handler observed, a retry replayed (scripts/release-check; shared/user.go).
package main

import (
	"log"
	"net/http"
	"net/http/httptest"

	"go.opentelemetry.io/otel/sdk/metric"

	"github.com/idemgo/idem/idemotel"
)

func main() {
	reader := metric.NewManualReader()
	obs, err := idemotel.NewObserver(idemotel.WithMeterProvider(metric.NewMeterProvider(metric.WithReader(reader))))
	if err != nil {
		log.Fatal(err)
	}
	mw, done := newMiddleware(obs)
	defer done()
	srv := httptest.NewServer(mw.Handler(http.HandlerFunc(charge)))
	defer srv.Close()
	twice(srv.URL)
}
