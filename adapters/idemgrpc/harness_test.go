package idemgrpc_test

import (
	"context"
	"net"
	"sync/atomic"
	"testing"

	"github.com/stretchr/testify/require"
	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/emptypb"
	"google.golang.org/protobuf/types/known/structpb"

	"github.com/idemgo/idem"
	"github.com/idemgo/idem/adapters/idemgrpc"
	"github.com/idemgo/idem/internal/adaptertest"
)

// The test service, without generated code: a hand-written ServiceDesc
// whose requests are google.protobuf.Struct (or the message newRequest
// makes) and whose responses are google.protobuf.ListValue, a message
// without map fields (so its bytes are fixed: see the package
// documentation).
const (
	serviceName = "payments.v1.Payments"
	charge      = "/" + serviceName + "/Charge"
	refund      = "/" + serviceName + "/Refund"
)

// service counts its handler's runs; its answer is the test's to choose.
type service struct {
	runs     atomic.Int64 // handler runs
	attempts atomic.Int64 // calls that reached the server (before idem)
	// enter, when set, receives one value per run before hold.
	enter chan struct{}
	// hold, when set, is waited for (closed) by every run.
	hold chan struct{}
	// answer decides run n's answer (default: chargeList(n, amount)).
	answer func(ctx context.Context, n int64, req proto.Message) (proto.Message, error)
	// newRequest makes the request message (default: a Struct).
	newRequest func() proto.Message
	// finished, when set, receives one value per call that reached the
	// server, once the interceptors have answered it.
	finished chan struct{}

	ic   *idemgrpc.Interceptor
	conn *grpc.ClientConn
}

// amountOf is the request's amount: a Struct's "amount" or a dynamic
// message's amount field.
func amountOf(req proto.Message) float64 {
	if s, ok := req.(*structpb.Struct); ok {
		return s.GetFields()["amount"].GetNumberValue()
	}
	r := req.ProtoReflect()
	return float64(r.Get(r.Descriptor().Fields().ByName("amount")).Int())
}

// chargeList is the default response of run n.
func chargeList(n int64, amount float64) *structpb.ListValue {
	l, err := structpb.NewList([]any{float64(n), amount, "ch_" + string(rune('0'+n%10)), true, []any{"nested", 1.5}})
	if err != nil {
		panic(err)
	}
	return l
}

func (s *service) handle(ctx context.Context, req proto.Message) (proto.Message, error) {
	n := s.runs.Add(1)
	if _, ok := idem.ExecutionFromContext(ctx); !ok {
		return nil, status.Error(codes.FailedPrecondition, "the handler ran outside idem's execution")
	}
	if s.enter != nil {
		s.enter <- struct{}{}
	}
	if s.hold != nil {
		<-s.hold
	}
	if s.answer != nil {
		return s.answer(ctx, n, req)
	}
	return chargeList(n, amountOf(req)), nil
}

func (s *service) desc() *grpc.ServiceDesc {
	method := func(name string) grpc.MethodDesc {
		full := "/" + serviceName + "/" + name
		return grpc.MethodDesc{MethodName: name, Handler: func(_ any, ctx context.Context, dec func(any) error, icpt grpc.UnaryServerInterceptor) (any, error) {
			var in proto.Message = &structpb.Struct{}
			if s.newRequest != nil {
				in = s.newRequest()
			}
			if err := dec(in); err != nil {
				return nil, err
			}
			h := func(ctx context.Context, req any) (any, error) { return s.handle(ctx, req.(proto.Message)) }
			if icpt == nil {
				return h(ctx, in)
			}
			return icpt(ctx, in, &grpc.UnaryServerInfo{Server: s, FullMethod: full}, h)
		}}
	}
	return &grpc.ServiceDesc{ServiceName: serviceName, HandlerType: (*any)(nil),
		Methods: []grpc.MethodDesc{method("Charge"), method("Refund")}}
}

// onStores runs test, in parallel, on each store of the suite: SQLite, and
// PostgreSQL through TEST_DATABASE_URL.
func onStores(t *testing.T, test func(t *testing.T, store func(*testing.T) idem.Store)) {
	for name, store := range adaptertest.Stores {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			test(t, store)
		})
	}
}

// serve starts s on a loopback TCP listener behind the interceptor made of
// store, cfg and opts, every call in adaptertest.Scope,
// after an interceptor that counts the attempts, and returns s.
func (s *service) serve(t *testing.T, store idem.Store, cfg idem.EngineOptions, opts ...idemgrpc.Option) *service {
	t.Helper()
	ic, err := idemgrpc.NewInterceptor(store, cfg, func(context.Context) (string, error) { return adaptertest.Scope, nil }, opts...)
	require.NoError(t, err)
	t.Cleanup(func() { _ = ic.Engine().Close() }) // its listener, before the store closes
	s.ic = ic
	count := func(ctx context.Context, req any, _ *grpc.UnaryServerInfo, h grpc.UnaryHandler) (any, error) {
		s.attempts.Add(1)
		if s.finished != nil {
			defer func() { s.finished <- struct{}{} }()
		}
		return h(ctx, req)
	}
	s.listen(t, grpc.ChainUnaryInterceptor(count, ic.UnaryServerInterceptor()))
	return s
}

// listen serves s with the server options on a loopback listener and
// connects s.conn to it (with the dial options).
func (s *service) listen(t *testing.T, opt grpc.ServerOption, dial ...grpc.DialOption) {
	t.Helper()
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	srv := grpc.NewServer(opt)
	srv.RegisterService(s.desc(), s)
	go func() { _ = srv.Serve(lis) }()
	t.Cleanup(srv.Stop)
	s.conn = dialT(t, lis.Addr().String(), dial...)
}

func dialT(t *testing.T, addr string, opts ...grpc.DialOption) *grpc.ClientConn {
	t.Helper()
	conn, err := grpc.NewClient(addr, append([]grpc.DialOption{grpc.WithTransportCredentials(insecure.NewCredentials())}, opts...)...)
	require.NoError(t, err)
	t.Cleanup(func() { _ = conn.Close() })
	return conn
}

// result is one call as the client saw it.
type result struct {
	msg              *structpb.ListValue
	raw              []byte // the response's bytes as received
	header, trailer  metadata.MD
	err              error
	replayed         bool
	pushback, reason string
	newKeySafe       string // ErrorInfo's new_key_safe
}

// call makes one call of method with key (none when empty) and the request
// msg (a Struct {"amount": amount} when nil).
func (s *service) call(ctx context.Context, method, key string, amount float64, msg proto.Message) result {
	if msg == nil {
		req, err := structpb.NewStruct(map[string]any{"amount": amount})
		if err != nil {
			panic(err)
		}
		msg = req
	}
	if key != "" {
		ctx = metadata.AppendToOutgoingContext(ctx, idemgrpc.MetadataKey, key)
	}
	var r result
	// Empty keeps every field of the response as unknown fields: the
	// bytes as they came.
	raw := &emptypb.Empty{}
	r.err = s.conn.Invoke(ctx, method, msg, raw, grpc.Header(&r.header), grpc.Trailer(&r.trailer))
	if r.err == nil {
		r.raw = raw.ProtoReflect().GetUnknown()
		r.msg = &structpb.ListValue{}
		if err := proto.Unmarshal(r.raw, r.msg); err != nil {
			panic(err)
		}
	}
	r.replayed = first(r.header.Get(idemgrpc.MetadataReplayed)) == "true"
	r.pushback = first(r.trailer.Get("grpc-retry-pushback-ms"))
	for _, d := range status.Convert(r.err).Details() {
		if info, ok := d.(*errdetails.ErrorInfo); ok {
			r.reason, r.newKeySafe = info.GetReason(), info.GetMetadata()["new_key_safe"]
		}
	}
	return r
}

func first(v []string) string {
	if len(v) == 0 {
		return ""
	}
	return v[0]
}

// requireCode asserts r failed with code.
func requireCode(t *testing.T, r result, code codes.Code) *status.Status {
	t.Helper()
	require.Error(t, r.err)
	st := status.Convert(r.err)
	require.Equal(t, code, st.Code(), "error: %v", r.err)
	return st
}

// retryDelay is the RetryInfo detail's delay, -1 without one.
func retryDelay(st *status.Status) int64 {
	for _, d := range st.Details() {
		if ri, ok := d.(*errdetails.RetryInfo); ok {
			return ri.GetRetryDelay().AsDuration().Milliseconds()
		}
	}
	return -1
}
