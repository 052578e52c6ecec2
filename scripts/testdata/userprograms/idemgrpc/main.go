// A new user's program on idemgrpc and the core: SQLite, a gRPC method
// protected by the interceptor, a retry replayed (scripts/release-check;
// shared/user.go, whose HTTP helpers it does not use).
package main

import (
	"context"
	"fmt"
	"log"
	"net"
	"os"
	"path/filepath"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/metadata"
	"google.golang.org/protobuf/types/known/structpb"

	"github.com/idemgo/idem"
	"github.com/idemgo/idem/adapters/idemgrpc"
	"github.com/idemgo/idem/idemsqlite"
)

const method = "/payments.v1.Payments/Charge"

func main() {
	ctx := context.Background()
	dir, err := os.MkdirTemp("", "idem-user-grpc-")
	if err != nil {
		log.Fatal(err)
	}
	defer func() { _ = os.RemoveAll(dir) }()
	store, err := idemsqlite.Open(ctx, filepath.Join(dir, "idem.db"))
	if err != nil {
		log.Fatal(err)
	}
	defer func() { _ = store.Close() }()
	if err := store.Migrate(ctx); err != nil {
		log.Fatal(err)
	}
	ic, err := idemgrpc.NewInterceptor(store, idem.EngineOptions{}, func(context.Context) (string, error) { return idem.SingleTenantScope, nil })
	if err != nil {
		log.Fatal(err)
	}

	srv := grpc.NewServer(grpc.UnaryInterceptor(ic.UnaryServerInterceptor()))
	srv.RegisterService(&grpc.ServiceDesc{ServiceName: "payments.v1.Payments", HandlerType: (*any)(nil),
		Methods: []grpc.MethodDesc{{MethodName: "Charge", Handler: func(_ any, ctx context.Context, dec func(any) error, icpt grpc.UnaryServerInterceptor) (any, error) {
			in := &structpb.Struct{}
			if err := dec(in); err != nil {
				return nil, err
			}
			return icpt(ctx, in, &grpc.UnaryServerInfo{FullMethod: method}, func(context.Context, any) (any, error) {
				charges++
				return structpb.NewStruct(map[string]any{"charge": charges})
			})
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
	req, err := structpb.NewStruct(map[string]any{"amount": 1000})
	if err != nil {
		log.Fatal(err)
	}
	for range 2 {
		var header metadata.MD
		res := &structpb.Struct{}
		if err := conn.Invoke(metadata.AppendToOutgoingContext(ctx, idemgrpc.MetadataKey, "order-1001"), method, req, res, grpc.Header(&header)); err != nil {
			log.Fatal(err)
		}
		replayed := ""
		if v := header.Get(idemgrpc.MetadataReplayed); len(v) > 0 {
			replayed = v[0]
		}
		fmt.Printf("charge=%v replayed=%q\n", res.Fields["charge"].GetNumberValue(), replayed)
	}
	fmt.Println("charges:", charges)
}
