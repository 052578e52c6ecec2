package main

// The Go snippets of README.md, docs/clients.md and docs/observability.md
// that need the commands module's dependencies (stripe-go,
// go-retryablehttp, Prometheus), each verbatim in an Example
// (TestSnippets in the root package checks it).

import (
	"context"
	"errors"
	"fmt"
	"log"
	"net/http"
	"net/http/httptest"
	"strings"
	"time"

	"github.com/hashicorp/go-retryablehttp"
	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
	"github.com/stripe/stripe-go/v82"

	"github.com/idemgo/idem"
	"github.com/idemgo/idem/idemclient"
	"github.com/idemgo/idem/internal/dbtest"
)

// stripe-go pointed at paymentsd, with the caller's own key, and a reused
// key told apart (docs/clients.md). (Compiled, not run: it needs paymentsd;
// TestStripeGoConcurrentCallsOneKey runs the real client.)
func Example_stripeGo() {
	ctx := context.Background()

	backend := stripe.GetBackendWithConfig(stripe.APIBackend, &stripe.BackendConfig{
		URL:               stripe.String("http://127.0.0.1:8080"), // paymentsd
		MaxNetworkRetries: stripe.Int64(5),
	})
	sc := stripe.NewClient("sk_test_acme", stripe.WithBackends(&stripe.Backends{
		API: backend, Connect: backend, Uploads: backend, MeterEvents: backend,
	}))
	params := &stripe.PaymentIntentCreateParams{
		Amount: stripe.Int64(1999), Currency: stripe.String("eur"), Customer: stripe.String("cus_42"),
	}
	params.SetIdempotencyKey("order-6735") // else stripe-go makes one, kept across its retries
	pi, err := sc.V1PaymentIntents.Create(ctx, params)
	var se *stripe.Error
	if errors.As(err, &se) && se.Type == stripe.ErrorTypeIdempotency {
		// the key was first used with other parameters
	}

	if err != nil {
		log.Fatal(err)
	}
	log.Println(pi.ID)
}

// The README's stripe-go client. (Compiled, not run.)
func Example_stripeGoREADME() {
	ctx := context.Background()
	paymentsdURL := "http://127.0.0.1:8080"
	params := &stripe.PaymentIntentCreateParams{Amount: stripe.Int64(1999), Currency: stripe.String("eur")}
	params.SetIdempotencyKey("order-6735")

	b := stripe.GetBackendWithConfig(stripe.APIBackend, &stripe.BackendConfig{URL: stripe.String(paymentsdURL), MaxNetworkRetries: stripe.Int64(5)})
	sc := stripe.NewClient("sk_test_acme", stripe.WithBackends(&stripe.Backends{API: b, Connect: b, Uploads: b, MeterEvents: b}))
	pi, err := sc.V1PaymentIntents.Create(ctx, params) // 20 at once with one key: 20 OK, one PaymentIntent, one charge

	if err != nil {
		log.Fatal(err)
	}
	log.Println(pi.ID)
}

// go-retryablehttp with idemclient's retry policy and backoff
// (docs/clients.md). (Compiled, not run;
// TestRetryableHTTPWithIdemclientCheckRetry runs it against paymentsd.)
func Example_retryablehttp() {
	url, body, orderID := "http://127.0.0.1:8080/v1/payments", `{"amount":1000,"currency":"EUR"}`, "order-6735"

	client := retryablehttp.NewClient()
	client.RetryMax = 10
	client.CheckRetry = idemclient.DefaultCheckRetry // retries 409, 429, 502, 503, 504; never 400 or 422
	client.Backoff = func(_, _ time.Duration, attempt int, resp *http.Response) time.Duration {
		return idemclient.DefaultBackoff(attempt+1, resp) // honours the 409's Retry-After
	}

	req, _ := retryablehttp.NewRequest(http.MethodPost, url, strings.NewReader(body))
	req.Header.Set("Idempotency-Key", orderID) // the same on every retry
	resp, err := client.Do(req)

	if err != nil {
		log.Fatal(err)
	}
	defer resp.Body.Close()
	log.Println(resp.Status)
}

// An idem.Observer counting decisions in a Prometheus counter
// (docs/observability.md): a first execution and its replay.
func Example_prometheusObserver() {
	store, done := dbtest.ExampleStore() // SQLite in a temporary directory
	defer done()
	merchantFromAuth := idem.SingleTenant
	decisions := prometheus.NewCounterVec(prometheus.CounterOpts{Name: "idem_decisions_total", Help: "idem's decisions."},
		[]string{"decision", "route"})

	mw, _ := idem.NewMiddleware(store, idem.Options{Scope: merchantFromAuth, Engine: idem.EngineOptions{
		Observer: idem.ObserverFunc(func(ctx context.Context, e idem.Event) {
			decisions.WithLabelValues(e.Kind.String(), e.Route).Inc()
		}),
	}})

	mux := http.NewServeMux()
	mux.Handle("POST /v1/payments", mw.Handler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.WriteHeader(http.StatusCreated)
		_, _ = fmt.Fprint(w, `{"id":"pay_1"}`) // a write error means the client is gone
	})))
	srv := httptest.NewServer(mux)
	dbtest.PrintPost(srv.URL+"/v1/payments", "order-1", `{}`)
	dbtest.PrintPost(srv.URL+"/v1/payments", "order-1", `{}`)
	srv.Close() // waits for the handlers, which call the observer once the answer is written
	for _, kind := range []string{"executed", "replayed"} {
		var m dto.Metric
		if err := decisions.WithLabelValues(kind, "/v1/payments").Write(&m); err != nil {
			log.Fatal(err)
		}
		fmt.Printf("idem_decisions_total{decision=%q,route=\"/v1/payments\"} %v\n", kind, m.GetCounter().GetValue())
	}
	// Output:
	// 201 replayed="" {"id":"pay_1"}
	// 201 replayed="true" {"id":"pay_1"}
	// idem_decisions_total{decision="executed",route="/v1/payments"} 1
	// idem_decisions_total{decision="replayed",route="/v1/payments"} 1
}
