package idem_test

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"log"
	"net/http"
	"net/http/httptest"
	"strings"
	"time"

	"github.com/idemgo/idem"
	"github.com/idemgo/idem/idemsqlite"
	"github.com/idemgo/idem/internal/dbtest"
)

// Protect a handler: the first request runs it, a retry with the same key
// gets the stored response, a reused key with another body gets 422.
func Example() {
	store, done := dbtest.ExampleStore() // SQLite in a temporary directory; see idemsqlite.ExampleOpen
	defer done()

	mw, err := idem.NewMiddleware(store, idem.Options{Scope: func(r *http.Request) (string, error) { return "merchant_42", nil }})
	if err != nil {
		log.Fatal(err)
	}
	charges := 0
	charge := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		charges++
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusCreated)
		_, _ = fmt.Fprintf(w, `{"charge":%d}`, charges) // a write error means the client is gone
	})
	srv := httptest.NewServer(mw.Handler(charge))
	defer srv.Close()

	dbtest.PrintPost(srv.URL, "order-1001", `{"amount":1000,"currency":"JPY"}`)
	dbtest.PrintPost(srv.URL, "order-1001", `{ "currency":"JPY", "amount":1000 }`) // same JSON, reordered
	dbtest.PrintPost(srv.URL, "order-1001", `{"amount":9999,"currency":"JPY"}`)
	fmt.Println("charges:", charges)
	// Output:
	// 201 replayed="" {"charge":1}
	// 201 replayed="true" {"charge":1}
	// 422 replayed="" {"detail":"this Idempotency-Key was first used with a different request (its body, query or media type differ); a retry must send the first request unchanged, and a new request needs a new key","new_key_safe":false,"status":422,"title":"Idempotency-Key reused with a different request","type":"https://github.com/idemgo/idem/blob/main/docs/problems.md#key-reused"}
	// charges: 1
}

// The handler writes its business rows in the claim's transaction; idem
// writes the outcome in the same transaction and commits both together
// (CONTRACT section 6).
func Example_claimTransaction() {
	store, done := dbtest.ExampleStore()
	defer done()
	if _, err := store.DB().Exec(`CREATE TABLE payments (id INTEGER PRIMARY KEY, amount INTEGER)`); err != nil {
		log.Fatal(err)
	}
	mw, err := idem.NewMiddleware(store, idem.Options{Scope: idem.SingleTenant})
	if err != nil {
		log.Fatal(err)
	}
	pay := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		// Call the payment provider first, then write: the transaction (and
		// SQLite's write lock) begins on the first idem.Tx call.
		tx, err := idem.Tx[*sql.Tx](r.Context())
		if err != nil {
			http.Error(w, err.Error(), http.StatusServiceUnavailable)
			return
		}
		res, err := tx.ExecContext(r.Context(), `INSERT INTO payments (amount) VALUES (1000)`)
		if err != nil {
			http.Error(w, err.Error(), http.StatusServiceUnavailable)
			return
		}
		id, _ := res.LastInsertId()
		w.WriteHeader(http.StatusCreated)
		_, _ = fmt.Fprintf(w, `{"payment":%d}`, id) // a write error means the client is gone
		// No Commit here: idem commits the payment and its outcome together.
	})
	srv := httptest.NewServer(mw.Handler(pay))
	defer srv.Close()

	dbtest.PrintPost(srv.URL, "pay-1", `{}`)
	dbtest.PrintPost(srv.URL, "pay-1", `{}`)
	var n int
	_ = store.DB().QueryRow(`SELECT count(*) FROM payments`).Scan(&n)
	fmt.Println("payments:", n)
	// Output:
	// 201 replayed="" {"payment":1}
	// 201 replayed="true" {"payment":1}
	// payments: 1
}

// A validation failure need not burn the key: the handler releases it, so
// nothing is recorded and the corrected request with the same key runs.
// (By default a 4xx is an outcome, replayed to every retry.)
func ExampleReleaseKey() {
	store, done := dbtest.ExampleStore()
	defer done()
	mw, err := idem.NewMiddleware(store, idem.Options{Scope: idem.SingleTenant})
	if err != nil {
		log.Fatal(err)
	}
	pay := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if !strings.Contains(r.URL.RawQuery, "currency=") { // validate before any side effect
			_ = idem.ReleaseKey(r.Context())
			http.Error(w, "currency is required", http.StatusBadRequest)
			return
		}
		w.WriteHeader(http.StatusCreated)
		_, _ = fmt.Fprint(w, `{"id":"pay_1"}`) // a write error means the client is gone
	})
	srv := httptest.NewServer(mw.Handler(pay))
	defer srv.Close()

	dbtest.PrintPost(srv.URL, "order-7", `{"amount":1000}`)
	dbtest.PrintPost(srv.URL+"?currency=JPY", "order-7", `{"amount":1000}`) // corrected, same key
	dbtest.PrintPost(srv.URL+"?currency=JPY", "order-7", `{"amount":1000}`)
	// Output:
	// 400 replayed="" currency is required
	// 201 replayed="" {"id":"pay_1"}
	// 201 replayed="true" {"id":"pay_1"}
}

// The package documentation's "Using it": a store and its tables, then the
// middleware on each route with side effects. (Compiled, not run: it
// creates idem.db in the working directory and serves.)
func ExampleNewMiddleware() {
	ctx := context.Background()
	merchantFromAuth := func(r *http.Request) (string, error) { return "merchant_42", nil } // the authenticated account
	createPayment := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { w.WriteHeader(http.StatusCreated) })
	mux := http.NewServeMux()

	store, _ := idemsqlite.Open(ctx, "idem.db") // or idempgx.New(pool)
	_ = store.Migrate(ctx)
	mw, _ := idem.NewMiddleware(store, idem.Options{Scope: merchantFromAuth})
	mux.Handle("POST /v1/payments", mw.Handler(createPayment))

	log.Fatal(http.ListenAndServe("127.0.0.1:8080", mux))
}

// Engine.Do runs the claim protocol around a function, for work that is
// not an HTTP request (a message, a job): the first call runs it and
// records its Result with the rows it wrote; a call again with the same key
// (a redelivery) gets that Result without running anything.
func ExampleEngine_Do() {
	store, done := dbtest.ExampleStore() // SQLite in a temporary directory; see idemsqlite.ExampleOpen
	defer done()
	if _, err := store.DB().Exec(`CREATE TABLE orders (id TEXT PRIMARY KEY)`); err != nil {
		log.Fatal(err)
	}
	ctx := context.Background()
	msgID, data := "msg-1", []byte(`{"order":42}`)

	engine, _ := idem.NewEngineWith(store, idem.EngineOptions{})
	res, err := engine.Do(ctx, idem.DoParams{Scope: "orders", Key: msgID, Payload: data},
		func(ctx context.Context) (idem.Result, error) {
			tx, _ := idem.Tx[*sql.Tx](ctx) // committed with the outcome
			_, err := tx.ExecContext(ctx, "INSERT INTO orders (id) VALUES (?)", msgID)
			return idem.Result{Status: 200}, err
		})
	fmt.Println(res.Status, err)

	res, err = engine.Do(ctx, idem.DoParams{Scope: "orders", Key: msgID, Payload: data},
		func(ctx context.Context) (idem.Result, error) {
			return idem.Result{}, errors.New("not run: the first call's outcome is recorded")
		})
	fmt.Println(res.Status, err)
	var n int
	if err := store.DB().QueryRow(`SELECT count(*) FROM orders`).Scan(&n); err != nil {
		log.Fatal(err)
	}
	fmt.Println("orders:", n)
	// Output:
	// 200 <nil>
	// 200 <nil>
	// orders: 1
}

// A step keeps its result: the execution below fails after its charge,
// and its retry books the recorded charge instead of charging again
// (docs/contract.md section 11.1).
func ExampleStep() {
	store, done := dbtest.ExampleStore()
	defer done()
	engine, _ := idem.NewEngineWith(store, idem.EngineOptions{})
	calls, ledgerDown := 0, true
	pay := func(ctx context.Context) (idem.Result, error) {
		chargeID, err := idem.Step(ctx, "charge", func(ctx context.Context) (string, error) {
			calls++ // the provider's call, with Idempotency-Key: idem.RelayKey(ctx, "charge")
			return "ch_1", nil
		})
		if err != nil {
			return idem.Result{}, err // the step stays started: a retry runs it again under the same relayed key
		}
		if ledgerDown {
			ledgerDown = false
			return idem.Result{}, errors.New("the ledger is down") // recorded FAILED: the retry runs again
		}
		return idem.Result{Status: 201, Body: []byte(chargeID)}, nil
	}
	p := idem.DoParams{Scope: "acct_1", Key: "order-1"}
	_, err := engine.Do(context.Background(), p, pay)
	fmt.Println(err)
	res, err := engine.Do(context.Background(), p, pay)
	fmt.Println(res.Status, string(res.Body), err, "provider calls:", calls)
	// Output:
	// the ledger is down
	// 201 ch_1 <nil> provider calls: 1
}

// One Middleware per route group, each with its own Retention, on one
// store (docs/retention.md): a record keeps the lifetime of the route that
// created it, as its Idempotency-Key-Expires shows.
func ExampleOptions_retention() {
	store, done := dbtest.ExampleStore()
	defer done()
	scope := idem.SingleTenant
	quotes := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { w.WriteHeader(http.StatusCreated) })
	payments := quotes

	short, _ := idem.NewMiddleware(store, idem.Options{Scope: scope, Engine: idem.EngineOptions{Retention: time.Hour}})     // quotes, previews
	long, _ := idem.NewMiddleware(store, idem.Options{Scope: scope, Engine: idem.EngineOptions{Retention: 72 * time.Hour}}) // payments, transfers

	mux := http.NewServeMux()
	mux.Handle("POST /v1/quotes", short.Handler(quotes))
	mux.Handle("POST /v1/payments", long.Handler(payments))

	srv := httptest.NewServer(mux)
	defer srv.Close()
	expires := func(path, key string) time.Time {
		req, err := http.NewRequest(http.MethodPost, srv.URL+path, strings.NewReader(`{}`))
		if err != nil {
			log.Fatal(err)
		}
		req.Header.Set("Idempotency-Key", key)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			log.Fatal(err)
		}
		if err := resp.Body.Close(); err != nil {
			log.Fatal(err)
		}
		t, err := http.ParseTime(resp.Header.Get(idem.HeaderKeyExpires))
		if err != nil {
			log.Fatal(err)
		}
		return t
	}
	fmt.Println("payments outlive quotes by", expires("/v1/payments", "pay-1").Sub(expires("/v1/quotes", "quote-1")).Round(time.Hour))
	// Output: payments outlive quotes by 71h0m0s
}
