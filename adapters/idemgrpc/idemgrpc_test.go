package idemgrpc_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	"github.com/idemgo/idem"
	"github.com/idemgo/idem/adapters/idemgrpc"
	"github.com/idemgo/idem/idemsqlite"
	"github.com/idemgo/idem/internal/adaptertest"
	"github.com/idemgo/idem/seal"
)

func TestInterceptor(t *testing.T) { onStores(t, testInterceptor) }

func testInterceptor(t *testing.T, store func(*testing.T) idem.Store) {
	ctx := context.Background()

	t.Run("Replay", func(t *testing.T) {
		// The replay: the same bytes, the allow-listed header and trailer
		// metadata (a -bin one too), idempotent-replayed: true.
		s := &service{}
		s.answer = func(ctx context.Context, n int64, req proto.Message) (proto.Message, error) {
			require.NoError(t, grpc.SetHeader(ctx, metadata.Pairs("x-charge-id", "ch_1", "x-not-listed", "a")))
			require.NoError(t, grpc.SetTrailer(ctx, metadata.Pairs("x-ledger-bin", "\x00\xffledger", "x-trace", "t1")))
			return chargeList(n, amountOf(req)), nil
		}
		s.serve(t, store(t), idem.EngineOptions{}, idemgrpc.WithMetadata("X-Charge-Id", "x-ledger-bin"))
		first := s.call(ctx, charge, "k", 1000, nil)
		require.NoError(t, first.err)
		require.False(t, first.replayed)
		require.Equal(t, []string{"a"}, first.header.Get("x-not-listed"))
		require.Equal(t, []string{"t1"}, first.trailer.Get("x-trace"))
		replay := s.call(ctx, charge, "k", 1000, nil)
		require.NoError(t, replay.err)
		require.True(t, replay.replayed)
		require.Equal(t, first.raw, replay.raw, "the response's bytes")
		require.True(t, proto.Equal(first.msg, replay.msg))
		require.Equal(t, []string{"ch_1"}, replay.header.Get("x-charge-id"))
		require.Equal(t, []string{"\x00\xffledger"}, replay.trailer.Get("x-ledger-bin"))
		require.Empty(t, replay.header.Get("x-not-listed"))
		require.Empty(t, replay.trailer.Get("x-trace"))
		require.EqualValues(t, 1, s.runs.Load())
	})

	t.Run("ConcurrentDuplicatesWait", func(t *testing.T) {
		// 16 concurrent calls, one key, waiting on (the default): one run,
		// every other caller gets the replay.
		s := (&service{}).serve(t, store(t), idem.EngineOptions{})
		results := storm(s, 16, "storm")
		require.EqualValues(t, 1, s.runs.Load())
		replays := 0
		for _, r := range results {
			require.NoError(t, r.err)
			require.Equal(t, results[0].raw, r.raw)
			if r.replayed {
				replays++
			}
		}
		require.Equal(t, 15, replays)
	})

	t.Run("ConcurrentDuplicatesNoWait", func(t *testing.T) {
		// Waiting off: one run; the others get the replay or Unavailable
		// with RetryInfo and the pushback.
		s := (&service{}).serve(t, store(t), idem.EngineOptions{}, idemgrpc.WithWait(0))
		results := storm(s, 16, "storm")
		require.EqualValues(t, 1, s.runs.Load())
		for _, r := range results {
			if r.err != nil {
				st := requireCode(t, r, codes.Unavailable)
				require.GreaterOrEqual(t, retryDelay(st), int64(1000))
				require.Equal(t, "REQUEST_IN_FLIGHT", r.reason)
				require.Equal(t, "false", r.newKeySafe)
				require.NotEmpty(t, r.pushback)
				continue
			}
			require.Equal(t, chargeList(1, 1000).AsSlice(), r.msg.AsSlice())
		}
	})

	t.Run("InFlight", func(t *testing.T) {
		// A duplicate while the first call runs, waiting off: Unavailable,
		// trailers-only (no header), with the pushback InFlightRetryAfter
		// (1 s), not the lease left.
		s := &service{hold: make(chan struct{}), enter: make(chan struct{}, 1)}
		s.serve(t, store(t), idem.EngineOptions{}, idemgrpc.WithWait(0))
		release := sync.OnceFunc(func() { close(s.hold) })
		t.Cleanup(release)
		done := make(chan result, 1)
		go func() { done <- s.call(ctx, charge, "held", 1000, nil) }()
		<-s.enter
		dup := s.call(ctx, charge, "held", 1000, nil)
		st := requireCode(t, dup, codes.Unavailable)
		require.Equal(t, "1000", dup.pushback)
		require.EqualValues(t, 1000, retryDelay(st))
		require.Equal(t, []string{idem.ProblemTypeBase + "request-in-flight"}, dup.trailer.Get("idem-problem-type"))
		require.Empty(t, dup.header, "a retryable answer is trailers-only")
		release()
		require.NoError(t, (<-done).err)
		require.EqualValues(t, 1, s.runs.Load())
	})

	t.Run("WaitGetsReplay", func(t *testing.T) {
		// Waiting on: a duplicate waits for the owner and gets its replay.
		s := &service{hold: make(chan struct{}), enter: make(chan struct{}, 1)}
		s.serve(t, store(t), idem.EngineOptions{})
		release := sync.OnceFunc(func() { close(s.hold) })
		t.Cleanup(release)
		done := make(chan result, 1)
		go func() { done <- s.call(ctx, charge, "held", 1000, nil) }()
		<-s.enter
		dup := make(chan result, 1)
		go func() { dup <- s.call(ctx, charge, "held", 1000, nil) }()
		for s.ic.Engine().Waiters() == 0 {
			time.Sleep(time.Millisecond) // until the duplicate waits; no threshold
		}
		release()
		owner, waiter := <-done, <-dup
		require.NoError(t, owner.err)
		require.NoError(t, waiter.err)
		require.True(t, waiter.replayed)
		require.Equal(t, owner.raw, waiter.raw)
		require.EqualValues(t, 1, s.runs.Load())
	})

	t.Run("KeyReused", func(t *testing.T) {
		// Another request, or another method, with the key:
		// FailedPrecondition, the handler not run.
		s := (&service{}).serve(t, store(t), idem.EngineOptions{})
		require.NoError(t, s.call(ctx, charge, "k", 1000, nil).err)
		// new_key_safe: false for the same method (perhaps this call,
		// changed), true for another method (the key is another call's).
		for safe, r := range map[string]result{"false": s.call(ctx, charge, "k", 9999, nil), "true": s.call(ctx, refund, "k", 1000, nil)} {
			requireCode(t, r, codes.FailedPrecondition)
			require.Equal(t, "KEY_REUSED", r.reason)
			require.Equal(t, safe, r.newKeySafe)
			require.Equal(t, []string{idem.ProblemTypeBase + "key-reused"}, r.trailer.Get("idem-problem-type"))
			require.Empty(t, r.pushback)
		}
		require.EqualValues(t, 1, s.runs.Load())
	})

	t.Run("BadKey", func(t *testing.T) {
		s := (&service{}).serve(t, store(t), idem.EngineOptions{})
		r := s.call(ctx, charge, "not a key", 1000, nil) // spaces
		requireCode(t, r, codes.InvalidArgument)
		require.Equal(t, "INVALID_KEY", r.reason)
		require.Equal(t, "true", r.newKeySafe, "this key could never be claimed")
		r = s.call(metadata.AppendToOutgoingContext(ctx, idemgrpc.MetadataKey, "a"), charge, "b", 1000, nil) // two values
		requireCode(t, r, codes.InvalidArgument)
		require.Equal(t, "false", r.newKeySafe, "two keys, as from a client adding one on each retry: the first may have run")
		r = s.call(ctx, charge, "", 1000, nil)
		st := requireCode(t, r, codes.InvalidArgument)
		require.Equal(t, "MISSING_KEY", r.reason)
		require.Equal(t, "true", r.newKeySafe)
		require.Contains(t, st.Message(), "idempotency-key metadata")
		require.NotContains(t, st.Message(), "field", "no key field is configured")
		require.Zero(t, s.runs.Load())
	})

	t.Run("KeyOptionalAndMethods", func(t *testing.T) {
		// Without a key, WithKeyOptional passes the call through; a method
		// ForMethods does not name passes through with a key too.
		s := (&service{}).serve(t, store(t), idem.EngineOptions{}, idemgrpc.WithKeyOptional(), idemgrpc.ForMethods(charge))
		s.answer = func(ctx context.Context, n int64, req proto.Message) (proto.Message, error) {
			return chargeList(n, amountOf(req)), nil
		}
		// The handler asserts it runs inside an execution: unprotected
		// calls answer FailedPrecondition.
		requireCode(t, s.call(ctx, charge, "", 1000, nil), codes.FailedPrecondition)
		requireCode(t, s.call(ctx, refund, "k", 1000, nil), codes.FailedPrecondition)
		require.NoError(t, s.call(ctx, charge, "k", 1000, nil).err)
		require.EqualValues(t, 3, s.runs.Load())
	})

	t.Run("MissingScope", func(t *testing.T) {
		ic, err := idemgrpc.NewInterceptor(store(t), idem.EngineOptions{}, func(context.Context) (string, error) { return "", errors.New("no credentials") })
		require.NoError(t, err)
		s := &service{}
		s.listen(t, grpc.UnaryInterceptor(ic.UnaryServerInterceptor()))
		r := s.call(ctx, charge, "k", 1000, nil)
		requireCode(t, r, codes.Unauthenticated)
		require.Equal(t, "MISSING_SCOPE", r.reason)
		require.Equal(t, "false", r.newKeySafe)
		require.Zero(t, s.runs.Load())
	})

	t.Run("HandlerErrorRecorded", func(t *testing.T) {
		// An outcome code (InvalidArgument) is recorded and replayed with
		// its message, details and metadata.
		s := &service{}
		s.answer = func(ctx context.Context, _ int64, _ proto.Message) (proto.Message, error) {
			require.NoError(t, grpc.SetTrailer(ctx, metadata.Pairs("x-charge-id", "none")))
			st, err := status.New(codes.InvalidArgument, "amount below the minimum").WithDetails(&errdetails.BadRequest{
				FieldViolations: []*errdetails.BadRequest_FieldViolation{{Field: "amount", Description: "at least 50"}}})
			require.NoError(t, err)
			return nil, st.Err()
		}
		s.serve(t, store(t), idem.EngineOptions{}, idemgrpc.WithMetadata("x-charge-id"))
		var sts []*status.Status
		for i := range 2 {
			r := s.call(ctx, charge, "k", 1, nil)
			sts = append(sts, requireCode(t, r, codes.InvalidArgument))
			require.Equal(t, i == 1, r.replayed, "call %d", i+1)
			require.Equal(t, []string{"none"}, r.trailer.Get("x-charge-id"))
		}
		require.True(t, proto.Equal(sts[0].Proto(), sts[1].Proto()), "code, message and details")
		require.EqualValues(t, 1, s.runs.Load())
	})

	t.Run("HandlerErrorRunsAgain", func(t *testing.T) {
		// Unavailable and a plain Go error (Unknown) are FAILED: the
		// retry runs again.
		for _, fail := range []error{status.Error(codes.Unavailable, "provider down"), errors.New("db down"), status.Error(codes.Aborted, "conflict")} {
			s := &service{}
			s.answer = func(_ context.Context, n int64, req proto.Message) (proto.Message, error) {
				if n == 1 {
					return nil, fail
				}
				return chargeList(n, amountOf(req)), nil
			}
			s.serve(t, store(t), idem.EngineOptions{})
			requireCode(t, s.call(ctx, charge, "k", 1000, nil), status.Code(fail))
			r := s.call(ctx, charge, "k", 1000, nil)
			require.NoError(t, r.err)
			require.False(t, r.replayed)
			require.Equal(t, 2.0, r.msg.AsSlice()[0])
			require.EqualValues(t, 2, s.runs.Load())
		}
	})

	t.Run("OutcomePolicy", func(t *testing.T) {
		// A policy that records Unavailable replays it; one that releases
		// NotFound runs the retry again as new.
		policy := func(c codes.Code) idem.Outcome {
			switch c {
			case codes.Unavailable:
				return idem.Succeeded
			case codes.NotFound:
				return idem.Released
			}
			return idemgrpc.DefaultOutcome(c)
		}
		s := &service{}
		s.answer = func(_ context.Context, n int64, req proto.Message) (proto.Message, error) {
			if amountOf(req) == 404 {
				return nil, status.Error(codes.NotFound, "no such account")
			}
			return nil, status.Error(codes.Unavailable, "provider down")
		}
		s.serve(t, store(t), idem.EngineOptions{}, idemgrpc.WithOutcome(policy))
		requireCode(t, s.call(ctx, charge, "u", 1000, nil), codes.Unavailable)
		r := s.call(ctx, charge, "u", 1000, nil)
		requireCode(t, r, codes.Unavailable)
		require.True(t, r.replayed)
		require.EqualValues(t, 1, s.runs.Load())
		for range 2 {
			r := s.call(ctx, charge, "n", 404, nil)
			requireCode(t, r, codes.NotFound)
			require.False(t, r.replayed)
		}
		require.EqualValues(t, 3, s.runs.Load())
	})

	t.Run("Panic", func(t *testing.T) {
		// A panic is recorded FAILED and raised again, for the recovery
		// interceptor outside idemgrpc: the retry runs again.
		s := &service{}
		s.answer = func(_ context.Context, n int64, req proto.Message) (proto.Message, error) {
			if n == 1 {
				panic("boom")
			}
			return chargeList(n, amountOf(req)), nil
		}
		ic, err := idemgrpc.NewInterceptor(store(t), idem.EngineOptions{}, func(context.Context) (string, error) { return adaptertest.Scope, nil })
		require.NoError(t, err)
		recovery := func(ctx context.Context, req any, _ *grpc.UnaryServerInfo, h grpc.UnaryHandler) (resp any, err error) {
			defer func() {
				if p := recover(); p != nil {
					err = status.Errorf(codes.Internal, "panic: %v", p)
				}
			}()
			return h(ctx, req)
		}
		s.listen(t, grpc.ChainUnaryInterceptor(recovery, ic.UnaryServerInterceptor()))
		requireCode(t, s.call(ctx, charge, "k", 1000, nil), codes.Internal)
		require.NoError(t, s.call(ctx, charge, "k", 1000, nil).err)
		require.EqualValues(t, 2, s.runs.Load())
	})

	t.Run("ResponseNotStored", func(t *testing.T) {
		// A response over MaxResponseBytes reaches the first caller; the
		// retry gets AlreadyExists, and the handler does not run again.
		s := (&service{}).serve(t, store(t), idem.EngineOptions{Response: idem.ResponseOptions{MaxBytes: 8}})
		require.NoError(t, s.call(ctx, charge, "k", 1000, nil).err)
		r := s.call(ctx, charge, "k", 1000, nil)
		requireCode(t, r, codes.AlreadyExists)
		require.Equal(t, "RESPONSE_NOT_STORED", r.reason)
		require.EqualValues(t, 1, s.runs.Load())
	})

	t.Run("Deadline", func(t *testing.T) {
		// The handler runs detached from the client's deadline: the client
		// gives up, the execution is recorded, and the retry replays it.
		s := &service{hold: make(chan struct{}), enter: make(chan struct{}, 1)}
		s.serve(t, store(t), idem.EngineOptions{})
		cctx, cancel := context.WithCancel(ctx)
		done := make(chan result, 1)
		go func() { done <- s.call(cctx, charge, "k", 1000, nil) }()
		<-s.enter
		cancel()
		requireCode(t, <-done, codes.Canceled)
		close(s.hold)
		r := s.call(ctx, charge, "k", 1000, nil) // waits for the owner if it still runs
		require.NoError(t, r.err)
		require.True(t, r.replayed)
		require.EqualValues(t, 1, s.runs.Load())
	})
}

// warnings counts the log records at WARN and above.
type warnings struct {
	n    atomic.Int64
	msgs sync.Map
}

func (w *warnings) Enabled(context.Context, slog.Level) bool { return true }
func (w *warnings) Handle(_ context.Context, r slog.Record) error {
	if r.Level >= slog.LevelWarn {
		w.n.Add(1)
		w.msgs.Store(r.Message, true)
	}
	return nil
}
func (w *warnings) WithAttrs([]slog.Attr) slog.Handler { return w }
func (w *warnings) WithGroup(string) slog.Handler      { return w }

// An owner whose client went away (its deadline passed) before the handler
// answered logs no warning: the metadata it cannot send is no fault. Its
// retry replays the outcome.
func TestClientGoneNoWarning(t *testing.T) { onStores(t, testClientGoneNoWarning) }

func testClientGoneNoWarning(t *testing.T, store func(*testing.T) idem.Store) {
	logs := &warnings{}
	s := &service{hold: make(chan struct{}), enter: make(chan struct{}, 1), finished: make(chan struct{}, 1)}
	s.answer = func(ctx context.Context, n int64, req proto.Message) (proto.Message, error) {
		require.NoError(t, grpc.SetHeader(ctx, metadata.Pairs("x-charge-id", "ch_1")))
		require.NoError(t, grpc.SetTrailer(ctx, metadata.Pairs("x-ledger", "l1")))
		return chargeList(n, amountOf(req)), nil
	}
	s.serve(t, store(t), idem.EngineOptions{Logger: slog.New(logs)}, idemgrpc.WithMetadata("x-charge-id"))
	ctx := context.Background()
	// The client's deadline is shorter than the handler, which holds until
	// the client has given up.
	short, cancel := context.WithTimeout(ctx, 200*time.Millisecond)
	defer cancel()
	done := make(chan result, 1)
	go func() { done <- s.call(short, charge, "gone", 1000, nil) }()
	<-s.enter
	requireCode(t, <-done, codes.DeadlineExceeded)
	close(s.hold)
	<-s.finished // the owner's call answered, on a stream already done
	var msgs []any
	logs.msgs.Range(func(k, _ any) bool { msgs = append(msgs, k); return true })
	require.Zero(t, logs.n.Load(), "warnings: %v", msgs)
	r := s.call(ctx, charge, "gone", 1000, nil)
	require.NoError(t, r.err)
	require.True(t, r.replayed)
	<-s.finished
	require.EqualValues(t, 1, s.runs.Load())
}

// storm makes n concurrent calls with key and returns what each got.
func storm(s *service, n int, key string) []result {
	results := make([]result, n)
	start := make(chan struct{})
	var wg sync.WaitGroup
	for i := range n {
		wg.Go(func() {
			<-start
			results[i] = s.call(context.Background(), charge, key, 1000, nil)
		})
	}
	close(start)
	wg.Wait()
	return results
}

func TestNewRefuses(t *testing.T) {
	t.Parallel()
	store := adaptertest.SQLite(t)
	scope := func(context.Context) (string, error) { return "s", nil }
	for _, tc := range []struct {
		name  string
		scope idemgrpc.ScopeFunc
		opts  []idemgrpc.Option
	}{
		{"no scope", nil, nil},
		{"grpc metadata", scope, []idemgrpc.Option{idemgrpc.WithMetadata("grpc-status")}},
		{"the marker", scope, []idemgrpc.Option{idemgrpc.WithMetadata("Idempotent-Replayed")}},
		{"not a name", scope, []idemgrpc.Option{idemgrpc.WithMetadata("x charge")}},
		{"negative wait", scope, []idemgrpc.Option{idemgrpc.WithWait(-time.Second)}},
		{"nil policy", scope, []idemgrpc.Option{idemgrpc.WithOutcome(nil)}},
	} {
		_, err := idemgrpc.NewInterceptor(store, idem.EngineOptions{}, tc.scope, tc.opts...)
		require.Error(t, err, tc.name)
	}
	_, err := idemgrpc.NewInterceptor(nil, idem.EngineOptions{}, scope)
	require.ErrorContains(t, err, "Store")
}

// The deprecated New still builds an interceptor from an idem.EngineConfig
// (its Store included), and still refuses what NewInterceptor refuses.
func TestDeprecatedNew(t *testing.T) {
	scope := func(context.Context) (string, error) { return adaptertest.Scope, nil }
	//lint:ignore SA1019 the deprecated constructor is what this test checks
	ic, err := idemgrpc.New(idem.EngineConfig{Store: adaptertest.SQLite(t), LeaseDuration: 5 * time.Second}, scope)
	require.NoError(t, err)
	require.NotNil(t, ic)
	//lint:ignore SA1019 the deprecated constructor is what this test checks
	_, err = idemgrpc.New(idem.EngineConfig{Store: adaptertest.SQLite(t), LeaseDuration: time.Millisecond}, scope)
	require.ErrorContains(t, err, "Lease.Duration 1ms is below 1s")
}

// A damaged record answers Internal with its problem, and the handler never
// runs again: the response columns emptied (response-missing), a sealed
// response altered (seal-broken), a response type this binary does not
// link (response-missing).
func TestDamagedRecord(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	for _, tc := range []struct {
		name, reason string
		sealed       bool
		damage       string
	}{
		{"emptied", "RESPONSE_MISSING", false, `UPDATE idem_keys SET response_status = NULL, response_headers = NULL, response_body = NULL`},
		{"sealed", "SEAL_BROKEN", true, `UPDATE idem_keys SET response_body = CAST(zeroblob(length(response_body)) AS BLOB)`},
		{"unknown type", "RESPONSE_MISSING", false, `UPDATE idem_keys SET response_headers = replace(response_headers, 'google.protobuf.ListValue', 'payments.v9.Gone')`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			store := adaptertest.SQLite(t)
			var cfg idem.EngineOptions
			if tc.sealed {
				cfg.Sealing.Keys = []seal.Key{{ID: "k1", Secret: bytes.Repeat([]byte{7}, 32)}}
			}
			s := (&service{}).serve(t, store, cfg)
			require.NoError(t, s.call(ctx, charge, "k", 1000, nil).err)
			res, err := store.(*idemsqlite.Driver).DB().ExecContext(ctx, tc.damage)
			require.NoError(t, err)
			n, err := res.RowsAffected()
			require.NoError(t, err)
			require.EqualValues(t, 1, n)
			for range 2 {
				r := s.call(ctx, charge, "k", 1000, nil)
				requireCode(t, r, codes.Internal)
				require.Equal(t, tc.reason, r.reason)
				require.Empty(t, r.pushback)
			}
			require.EqualValues(t, 1, s.runs.Load())
		})
	}
}

// The store down: Unavailable with RetryInfo and the pushback, and the
// handler does not run unprotected.
func TestStoreDown(t *testing.T) {
	t.Parallel()
	store := adaptertest.SQLite(t)
	s := (&service{}).serve(t, store, idem.EngineOptions{})
	require.NoError(t, store.(*idemsqlite.Driver).Close())
	r := s.call(context.Background(), charge, "k", 1000, nil)
	st := requireCode(t, r, codes.Unavailable)
	require.Equal(t, "STORE_UNAVAILABLE", r.reason)
	require.Equal(t, "1000", r.pushback)
	require.EqualValues(t, 1000, retryDelay(st))
	require.Zero(t, s.runs.Load())
}

// grpc-go's health service behind the interceptor: with the methods
// selected (ForMethods, as README and docs/adapters.md show), Check passes
// through; with every unary method protected (no matcher), it answers
// InvalidArgument missing-key, the trap the documentation warns of.
func TestHealthCheck(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	for _, tc := range []struct {
		name string
		opts []idemgrpc.Option
		code codes.Code
	}{
		{"ForMethods", []idemgrpc.Option{idemgrpc.ForMethods(charge)}, codes.OK},
		{"every method", nil, codes.InvalidArgument},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			ic, err := idemgrpc.NewInterceptor(adaptertest.SQLite(t), idem.EngineOptions{}, func(context.Context) (string, error) { return adaptertest.Scope, nil }, tc.opts...)
			require.NoError(t, err)
			lis, err := net.Listen("tcp", "127.0.0.1:0")
			require.NoError(t, err)
			srv := grpc.NewServer(grpc.UnaryInterceptor(ic.UnaryServerInterceptor()))
			healthpb.RegisterHealthServer(srv, health.NewServer())
			go func() { _ = srv.Serve(lis) }()
			t.Cleanup(srv.Stop)
			res, err := healthpb.NewHealthClient(dialT(t, lis.Addr().String())).Check(ctx, &healthpb.HealthCheckRequest{})
			require.Equal(t, tc.code, status.Code(err), "%v", err)
			if tc.code == codes.OK {
				require.Equal(t, healthpb.HealthCheckResponse_SERVING, res.GetStatus())
			}
		})
	}
}

// An at-most-once step whose call ends uncertain holds the record UNKNOWN:
// FailedPrecondition outcome-unknown, without RetryInfo or pushback, to the
// call that made it so and to every retry; the handler does not run again.
func TestOutcomeUnknown(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	store := adaptertest.SQLite(t)
	s := &service{answer: func(ctx context.Context, _ int64, _ proto.Message) (proto.Message, error) {
		_, err := idem.Step(ctx, "transfer", func(context.Context) (string, error) {
			return "", errors.New("the bank did not answer")
		}, idem.AtMostOnce())
		return nil, status.Error(codes.Unavailable, err.Error())
	}}
	s.serve(t, store, idem.EngineOptions{})
	for range 3 {
		r := s.call(ctx, charge, "k", 1000, nil)
		st := requireCode(t, r, codes.FailedPrecondition)
		require.Equal(t, "OUTCOME_UNKNOWN", r.reason)
		require.Empty(t, r.pushback)
		require.EqualValues(t, -1, retryDelay(st), "no RetryInfo")
	}
	require.EqualValues(t, 1, s.runs.Load())
}

// A handler that returns idem.ErrStepUnreconciled (an at-most-once step's
// earlier start the callee cannot tell about yet) is answered Unavailable
// with RetryInfo and the pushback, whatever its own error's code: the
// record is FAILED and the retry asks again. Regression: the client got
// Unknown with idem's internal text, which grpc-go's retry policy does not
// retry. The step ran once.
// A handler that ignores the error is answered the same: its success
// would tell the client it is done while the record is FAILED (a fresh
// user's HTTP handler did that).
func TestStepUnreconciledIsUnavailable(t *testing.T) {
	t.Parallel()
	for _, ignore := range []bool{false, true} {
		t.Run(fmt.Sprintf("ignored=%v", ignore), func(t *testing.T) {
			t.Parallel()
			ctx := context.Background()
			var transfers, asked atomic.Int32
			s := &service{answer: func(ctx context.Context, n int64, req proto.Message) (proto.Message, error) {
				_, err := idem.Step(ctx, "transfer", func(context.Context) (string, error) {
					transfers.Add(1)
					return "", errors.New("the bank did not answer")
				}, idem.AtMostOnce(), idem.Reconcile(func(context.Context, string) (string, error) {
					asked.Add(1)
					return "", errors.New("the bank cannot tell yet")
				}))
				if ignore {
					return chargeList(n, amountOf(req)), nil
				}
				return nil, err
			}}
			s.serve(t, adaptertest.SQLite(t), idem.EngineOptions{})
			first := s.call(ctx, charge, "k", 1000, nil) // the transfer, its answer lost: held
			if ignore {
				requireCode(t, first, codes.Unavailable)
			}
			for range 2 {
				r := s.call(ctx, charge, "k", 1000, nil)
				st := requireCode(t, r, codes.Unavailable)
				require.Equal(t, "STEP_UNRECONCILED", r.reason)
				require.Equal(t, "1000", r.pushback)
				require.EqualValues(t, 1000, retryDelay(st))
			}
			require.EqualValues(t, 1, transfers.Load(), "never made twice")
			require.EqualValues(t, 2, asked.Load())
		})
	}
}
