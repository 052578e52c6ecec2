package idemconnect_test

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"

	"connectrpc.com/connect"

	"github.com/idemgo/idem"
	"github.com/idemgo/idem/adapters/idemconnect"
	"github.com/idemgo/idem/internal/dbtest"
)

// Protect a Connect service: the retry of a call gets the recorded response,
// and idem's refusals reach the Connect client as Connect codes.
func Example() {
	// idem.New on SQLite in a temporary directory, every request in the
	// scope merchant_42: see idem's Example and idemsqlite.ExampleOpen.
	mw, _, done := dbtest.ExampleMiddleware(idem.Options{Engine: idem.EngineOptions{Response: idem.ResponseOptions{Outcome: idemconnect.Outcome}}})
	defer done()

	charges := int64(0)
	mux := http.NewServeMux()
	mux.Handle(procedure, connect.NewUnaryHandler(procedure,
		func(ctx context.Context, req *connect.Request[ChargeRequest]) (*connect.Response[ChargeResponse], error) {
			charges++
			return connect.NewResponse(&ChargeResponse{Charge: charges, Amount: req.Msg.Amount}), nil
		}, connect.WithCodec(jsonCodec{})))
	srv := httptest.NewServer(idemconnect.Handler(mw, mux))
	defer srv.Close()

	client := connect.NewClient[ChargeRequest, ChargeResponse](http.DefaultClient, srv.URL+procedure, connect.WithCodec(jsonCodec{}))
	call := func(key string, amount int64) {
		req := connect.NewRequest(&ChargeRequest{Amount: amount})
		req.Header().Set("Idempotency-Key", key)
		res, err := client.CallUnary(context.Background(), req)
		var cerr *connect.Error
		if errors.As(err, &cerr) {
			fmt.Println("error:", cerr.Code())
			return
		}
		fmt.Printf("charge %d, amount %d, replayed=%q\n", res.Msg.Charge, res.Msg.Amount, res.Header().Get("Idempotent-Replayed"))
	}
	call("order-1", 1000)
	call("order-1", 1000)
	call("order-1", 9999) // the same key for another request
	call("not a key", 1000)
	fmt.Println("charges:", charges)
	// Output:
	// charge 1, amount 1000, replayed=""
	// charge 1, amount 1000, replayed="true"
	// error: failed_precondition
	// error: invalid_argument
	// charges: 1
}

// The README's line: idem in front of a mux of Connect handlers; a retry
// gets the recorded response, and idem's own refusals (here an invalid key)
// are answered in the Connect protocol.
func ExampleHandler() {
	mw, _, done := dbtest.ExampleMiddleware(idem.Options{Engine: idem.EngineOptions{Response: idem.ResponseOptions{Outcome: idemconnect.Outcome}}})
	defer done()
	connectMux := http.NewServeMux()
	connectMux.Handle(procedure, connect.NewUnaryHandler(procedure,
		func(ctx context.Context, req *connect.Request[ChargeRequest]) (*connect.Response[ChargeResponse], error) {
			return connect.NewResponse(&ChargeResponse{Charge: 1, Amount: req.Msg.Amount}), nil
		}, connect.WithCodec(jsonCodec{})))
	mux := http.NewServeMux()

	mux.Handle("/", idemconnect.Handler(mw, connectMux))

	srv := httptest.NewServer(mux)
	defer srv.Close()
	dbtest.PrintPost(srv.URL+procedure, "order-1", `{"amount":1000}`)
	dbtest.PrintPost(srv.URL+procedure, "order-1", `{"amount":1000}`)
	dbtest.PrintPost(srv.URL+procedure, "not a key", `{"amount":1000}`)
	// Output:
	// 200 replayed="" {"charge":1,"amount":1000}
	// 200 replayed="true" {"charge":1,"amount":1000}
	// 400 replayed="" {"code":"invalid_argument","message":"invalid Idempotency-Key: character 4 of the key is byte 0x20; only visible ASCII (0x21-0x7E) is allowed"}
}
