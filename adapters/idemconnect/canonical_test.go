package idemconnect_test

import (
	"context"
	"net/http"
	"net/http/httptest"
	"sync"
	"sync/atomic"
	"testing"

	"connectrpc.com/connect"
	"github.com/stretchr/testify/require"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protodesc"
	"google.golang.org/protobuf/reflect/protoregistry"
	"google.golang.org/protobuf/types/descriptorpb"
	"google.golang.org/protobuf/types/known/structpb"

	"github.com/idemgo/idem"
	"github.com/idemgo/idem/adapters/idemconnect"
	"github.com/idemgo/idem/internal/adaptertest"
)

// mapsProcedure is a method whose request is a google.protobuf.Struct (a
// map), registered in protoregistry.GlobalFiles as generated code would.
const mapsProcedure = "/idemconnect.test.v1.Maps/Charge"

var registerMaps = sync.OnceValue(func() error {
	fd, err := protodesc.NewFile(&descriptorpb.FileDescriptorProto{
		Name:       proto.String("idemconnect_test/maps.proto"),
		Package:    proto.String("idemconnect.test.v1"),
		Dependency: []string{"google/protobuf/struct.proto"},
		Syntax:     proto.String("proto3"),
		Service: []*descriptorpb.ServiceDescriptorProto{{Name: proto.String("Maps"), Method: []*descriptorpb.MethodDescriptorProto{{
			Name: proto.String("Charge"), InputType: proto.String(".google.protobuf.Struct"), OutputType: proto.String(".google.protobuf.Struct"),
		}}}},
	}, protoregistry.GlobalFiles)
	if err != nil {
		return err
	}
	return protoregistry.GlobalFiles.RegisterFile(fd)
})

// Regression (a fresh user's try): connect-go's proto codec writes a map's
// entries in random order, so an identical retry of a message with a map
// was refused failed_precondition (key reused, new_key_safe false) 8 times
// in 10: the client could neither get its result nor use a new key. Sent
// gzip-compressed, it was refused too.
func TestProtoRetryOfAMapIsOneMessage(t *testing.T) {
	t.Parallel()
	require.NoError(t, registerMaps())
	mw, err := idem.NewMiddleware(adaptertest.SQLite(t), idem.Options{Scope: func(*http.Request) (string, error) { return adaptertest.Scope, nil }})
	require.NoError(t, err)
	var runs atomic.Int64
	mux := http.NewServeMux()
	mux.Handle(mapsProcedure, connect.NewUnaryHandler(mapsProcedure, func(_ context.Context, req *connect.Request[structpb.Struct]) (*connect.Response[structpb.Struct], error) {
		out, err := structpb.NewStruct(map[string]any{"charge": float64(runs.Add(1)), "amount": req.Msg.GetFields()["amount"].GetNumberValue()})
		return connect.NewResponse(out), err
	}))
	srv := httptest.NewServer(idemconnect.Handler(mw, mux))
	t.Cleanup(srv.Close)

	charge := func(t *testing.T, key string, amount float64, opts ...connect.ClientOption) (*connect.Response[structpb.Struct], error) {
		msg, err := structpb.NewStruct(map[string]any{"amount": amount, "currency": "EUR", "customer": "cus_42",
			"a": 1.0, "b": 2.0, "c": 3.0, "d": 4.0, "e": 5.0})
		require.NoError(t, err)
		req := connect.NewRequest(msg)
		req.Header().Set(idem.HeaderKey, key)
		return connect.NewClient[structpb.Struct, structpb.Struct](srv.Client(), srv.URL+mapsProcedure, opts...).CallUnary(t.Context(), req)
	}
	for _, tc := range []struct {
		name, key string
		opts      []connect.ClientOption
	}{
		{"proto", "order-1", nil},
		{"proto, gzip", "order-1", []connect.ClientOption{connect.WithSendGzip()}}, // the same message, so the same record
		{"protojson, gzip", "order-2", []connect.ClientOption{connect.WithProtoJSON(), connect.WithSendGzip()}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			before := runs.Load()
			for i := range 10 {
				res, err := charge(t, tc.key, 1000, tc.opts...)
				require.NoError(t, err, "call %d", i)
				require.Equal(t, 1000.0, res.Msg.GetFields()["amount"].GetNumberValue())
				if i > 0 || tc.key == "order-1" && before > 0 {
					require.Equal(t, "true", res.Header().Get(idem.HeaderReplayed), "call %d", i)
				}
			}
			require.LessOrEqual(t, runs.Load()-before, int64(1), "one run for the key")
		})
	}
	require.EqualValues(t, 2, runs.Load())

	_, err = charge(t, "order-1", 2000)
	requireCode(t, err, connect.CodeFailedPrecondition) // another message: key reused
	require.EqualValues(t, 2, runs.Load())
}
