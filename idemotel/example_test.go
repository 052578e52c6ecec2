package idemotel_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"sort"
	"strings"

	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"

	"github.com/idemgo/idem"
	"github.com/idemgo/idem/idemotel"
	"github.com/idemgo/idem/idemsqlite"
)

// The package documentation's observer on the SDK's providers: a first
// execution and its replay, counted in idem.decisions.
func ExampleNewObserver() {
	store, done := exampleStore() // SQLite in a temporary directory; see idemsqlite.ExampleOpen
	defer done()
	scope := idem.SingleTenant
	reader := sdkmetric.NewManualReader() // a Prometheus exporter in production
	mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader))
	tp := sdktrace.NewTracerProvider()

	obs, err := idemotel.NewObserver(idemotel.WithMeterProvider(mp), idemotel.WithTracerProvider(tp))
	if err != nil {
		log.Fatal(err)
	}
	mw, err := idem.NewMiddleware(store, idem.Options{Scope: scope, Engine: idem.EngineOptions{Observer: obs}})
	if err != nil {
		log.Fatal(err)
	}

	srv := httptest.NewServer(mw.Handler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.WriteHeader(http.StatusCreated)
		_, _ = fmt.Fprint(w, `{"id":"pay_1"}`) // a write error means the client is gone
	})))
	printPost(srv.URL, "order-1", `{}`)
	printPost(srv.URL, "order-1", `{}`)
	srv.Close() // waits for the handlers, which call the observer once the answer is written

	var rm metricdata.ResourceMetrics
	if err := reader.Collect(context.Background(), &rm); err != nil {
		log.Fatal(err)
	}
	var counts []string
	for _, sm := range rm.ScopeMetrics {
		for _, m := range sm.Metrics {
			if sum, ok := m.Data.(metricdata.Sum[int64]); ok && m.Name == "idem.decisions" {
				for _, dp := range sum.DataPoints {
					decision, _ := dp.Attributes.Value("idem.decision")
					counts = append(counts, fmt.Sprintf("%s{idem.decision=%s} %d", m.Name, decision.String(), dp.Value))
				}
			}
		}
	}
	sort.Strings(counts)
	for _, c := range counts {
		fmt.Println(c)
	}
	// Output:
	// 201 replayed="" {"id":"pay_1"}
	// 201 replayed="true" {"id":"pay_1"}
	// idem.decisions{idem.decision=executed} 1
	// idem.decisions{idem.decision=replayed} 1
}

// docs/observability.md's observer: the providers named, each defaulting to
// the global one. (Compiled, not run.)
func ExampleNewObserver_providers() {
	store, done := exampleStore()
	defer done()
	scope := idem.SingleTenant
	meterProvider := sdkmetric.NewMeterProvider()  // with your exporter's reader
	tracerProvider := sdktrace.NewTracerProvider() // with your exporter's span processor

	obs, err := idemotel.NewObserver(
		idemotel.WithMeterProvider(meterProvider),   // default: otel.GetMeterProvider()
		idemotel.WithTracerProvider(tracerProvider), // default: otel.GetTracerProvider()
	)
	if err != nil {
		log.Fatal(err)
	}
	mw, err := idem.NewMiddleware(store, idem.Options{Scope: scope, Engine: idem.EngineOptions{Observer: obs}})
	if err != nil {
		log.Fatal(err)
	}

	log.Fatal(http.ListenAndServe("127.0.0.1:8080", mw.Handler(http.NotFoundHandler())))
}

// exampleStore is a migrated SQLite store in a new temporary directory and
// the function that closes it and removes the directory (internal/dbtest's
// ExampleStore, which this module does not import: it would bring the
// PostgreSQL and MySQL drivers into idemotel's go.mod).
func exampleStore() (*idemsqlite.Driver, func()) {
	dir, err := os.MkdirTemp("", "idemotel-example")
	if err != nil {
		log.Fatal(err)
	}
	ctx := context.Background()
	store, err := idemsqlite.Open(ctx, filepath.Join(dir, "idem.db"))
	if err == nil {
		err = store.Migrate(ctx)
	}
	if err != nil {
		log.Fatal(err)
	}
	return store, func() {
		if err := errors.Join(store.Close(), os.RemoveAll(dir)); err != nil {
			log.Fatal(err)
		}
	}
}

// printPost sends a POST with key and body to url and prints the status,
// Idempotent-Replayed and the body.
func printPost(url, key, body string) {
	req, err := http.NewRequest(http.MethodPost, url, strings.NewReader(body))
	if err != nil {
		log.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set(idem.HeaderKey, key)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		log.Fatal(err)
	}
	b, err := io.ReadAll(resp.Body)
	if err = errors.Join(err, resp.Body.Close()); err != nil {
		log.Fatal(err)
	}
	fmt.Printf("%d replayed=%q %s\n", resp.StatusCode, resp.Header.Get(idem.HeaderReplayed), strings.TrimSpace(string(b)))
}
