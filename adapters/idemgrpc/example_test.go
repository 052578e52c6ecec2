package idemgrpc_test

import (
	"context"
	"fmt"
	"log"
	"net"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/structpb"

	"github.com/idemgo/idem"
	"github.com/idemgo/idem/adapters/idemgrpc"
	"github.com/idemgo/idem/internal/dbtest"
)

// Protect a gRPC method: the retry of a call gets the recorded response,
// and idem's refusals reach the client as gRPC codes. The service is
// hand-written here (no protoc); with generated code, register it as usual.
func Example() {
	// SQLite in a temporary directory (idemsqlite.ExampleOpen).
	store, done := dbtest.ExampleStore()
	defer done()
	merchant := func(ctx context.Context) (string, error) { return "merchant_42", nil } // from your auth interceptor
	ic, err := idemgrpc.NewInterceptor(store, idem.EngineOptions{}, merchant, idemgrpc.ForMethods("/payments.v1.Payments/Charge"), idemgrpc.WithMetadata("x-charge-id"))
	if err != nil {
		log.Fatal(err)
	}

	charges := 0
	chargeHandler := func(ctx context.Context, req *structpb.Struct) (*structpb.Struct, error) {
		charges++ // the side effect
		_ = grpc.SetHeader(ctx, metadata.Pairs("x-charge-id", fmt.Sprint("ch_", charges)))
		return structpb.NewStruct(map[string]any{"charge": charges, "amount": req.Fields["amount"].GetNumberValue()})
	}
	srv := grpc.NewServer(grpc.ChainUnaryInterceptor(ic.UnaryServerInterceptor()))
	srv.RegisterService(&grpc.ServiceDesc{ServiceName: "payments.v1.Payments", HandlerType: (*any)(nil),
		Methods: []grpc.MethodDesc{{MethodName: "Charge", Handler: func(_ any, ctx context.Context, dec func(any) error, icpt grpc.UnaryServerInterceptor) (any, error) {
			in := &structpb.Struct{}
			if err := dec(in); err != nil {
				return nil, err
			}
			info := &grpc.UnaryServerInfo{FullMethod: "/payments.v1.Payments/Charge"}
			return icpt(ctx, in, info, func(ctx context.Context, req any) (any, error) { return chargeHandler(ctx, req.(*structpb.Struct)) })
		}}}}, nil)
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		log.Fatal(err)
	}
	go func() { _ = srv.Serve(lis) }()
	defer srv.Stop()

	conn, err := grpc.NewClient(lis.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		log.Fatal(err)
	}
	defer func() { _ = conn.Close() }()
	call := func(key string, amount float64) {
		ctx := metadata.AppendToOutgoingContext(context.Background(), "idempotency-key", key)
		req, _ := structpb.NewStruct(map[string]any{"amount": amount})
		res := &structpb.Struct{}
		var header metadata.MD
		if err := conn.Invoke(ctx, "/payments.v1.Payments/Charge", req, res, grpc.Header(&header)); err != nil {
			fmt.Println("error:", status.Code(err))
			return
		}
		fmt.Printf("charge %v, amount %v, %s, replayed=%q\n", res.Fields["charge"].GetNumberValue(), res.Fields["amount"].GetNumberValue(),
			header.Get("x-charge-id")[0], header.Get(idemgrpc.MetadataReplayed))
	}
	call("order-1", 1000)
	call("order-1", 1000)
	call("order-1", 9999) // the same key for another request
	call("not a key", 1000)
	fmt.Println("charges:", charges)
	// Output:
	// charge 1, amount 1000, ch_1, replayed=[]
	// charge 1, amount 1000, ch_1, replayed=["true"]
	// error: FailedPrecondition
	// error: InvalidArgument
	// charges: 1
}

// The package documentation's and the README's interceptor: idem on the
// methods named (leave health checks and reads out: they carry no key),
// after the authentication that puts the scope in the context. (Compiled,
// not run; Example runs a service.)
func ExampleNewInterceptor() {
	store, done := dbtest.ExampleStore() // SQLite in a temporary directory; see idemsqlite.ExampleOpen
	defer done()
	merchantFromAuth := func(ctx context.Context) (string, error) { return "merchant_42", nil } // what auth put in the context
	var auth grpc.UnaryServerInterceptor                                                        // your authentication

	ic, err := idemgrpc.NewInterceptor(store, idem.EngineOptions{}, merchantFromAuth,
		idemgrpc.ForMethods("/payments.v1.Payments/Charge"))
	if err != nil {
		log.Fatal(err)
	}
	srv := grpc.NewServer(grpc.ChainUnaryInterceptor(auth, ic.UnaryServerInterceptor()))

	srv.Stop()
}

// docs/adapters.md's interceptor: its options. (Compiled, not run.)
func ExampleNewInterceptor_options() {
	store, done := dbtest.ExampleStore()
	defer done()
	merchantFromAuth := func(ctx context.Context) (string, error) { return "merchant_42", nil }
	var auth grpc.UnaryServerInterceptor

	ic, err := idemgrpc.NewInterceptor(store, idem.EngineOptions{}, merchantFromAuth, // the scope: required
		idemgrpc.ForMethods("/payments.v1.Payments/Charge"), // or WithMatcher; default: every unary method
		idemgrpc.WithMetadata("x-charge-id"))                // replayed metadata; default: none
	if err != nil {
		log.Fatal(err)
	}
	srv := grpc.NewServer(grpc.ChainUnaryInterceptor(auth, ic.UnaryServerInterceptor()))

	srv.Stop()
}
