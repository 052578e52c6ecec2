package idemgrpc_test

import (
	"context"
	"sync"
	"testing"

	"github.com/stretchr/testify/require"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	"github.com/idemgo/idem"
	"github.com/idemgo/idem/adapters/idemgrpc"
)

// retryPolicy is a service config whose retry policy (gRFC A6) retries
// UNAVAILABLE up to 5 attempts, the most grpc-go allows.
const retryPolicy = `{"methodConfig": [{
	"name": [{"service": "payments.v1.Payments"}],
	"retryPolicy": {"maxAttempts": 5, "initialBackoff": "0.01s", "maxBackoff": "0.1s",
		"backoffMultiplier": 2, "retryableStatusCodes": ["UNAVAILABLE"]}}]}`

func TestGRPCRetryPolicy(t *testing.T) { onStores(t, testRetryPolicy) }

func testRetryPolicy(t *testing.T, store func(*testing.T) idem.Store) {
	t.Run("InFlightThenReplay", func(t *testing.T) {
		// 8 clients call with one key while the first execution runs;
		// waiting off, each first attempt of the others gets Unavailable
		// with the pushback, and grpc-go's retry policy sends the call again
		// with the same metadata. The first in-flight answer releases the
		// execution: the retries get its replay. One run.
		s := &service{hold: make(chan struct{}), enter: make(chan struct{}, 1)}
		release := sync.OnceFunc(func() { close(s.hold) })
		t.Cleanup(release)
		var inFlight sync.WaitGroup
		inFlight.Add(1)
		seen := sync.OnceFunc(inFlight.Done)
		cfg := idem.EngineOptions{Observer: idem.ObserverFunc(func(_ context.Context, e idem.Event) {
			if e.Kind == idem.EventInFlight {
				seen()
			}
		})}
		s.serve(t, store(t), cfg, idemgrpc.WithWait(0))
		retrying := &service{conn: dialT(t, s.conn.Target(), grpc.WithDefaultServiceConfig(retryPolicy))}

		owner := make(chan result, 1)
		go func() { owner <- s.call(context.Background(), charge, "pay-1", 1000, nil) }()
		<-s.enter
		const n = 8
		results := make([]result, n)
		var wg sync.WaitGroup
		for i := range n {
			wg.Go(func() { results[i] = retrying.call(context.Background(), charge, "pay-1", 1000, nil) })
		}
		inFlight.Wait()
		release()
		wg.Wait()
		first := <-owner
		require.NoError(t, first.err)
		for _, r := range results {
			require.NoError(t, r.err)
			require.True(t, r.replayed)
			require.Equal(t, first.raw, r.raw)
		}
		require.EqualValues(t, 1, s.runs.Load())
		require.Greater(t, s.attempts.Load(), int64(1+n), "grpc-go retried the in-flight answers")
	})

	t.Run("FailedRunsAgain", func(t *testing.T) {
		// The handler's own Unavailable is recorded FAILED: grpc-go's
		// retry runs it again, and the call succeeds on its second run.
		s := &service{}
		s.answer = func(_ context.Context, n int64, req proto.Message) (proto.Message, error) {
			if n == 1 {
				return nil, status.Error(codes.Unavailable, "provider down")
			}
			return chargeList(n, amountOf(req)), nil
		}
		s.serve(t, store(t), idem.EngineOptions{})
		retrying := &service{conn: dialT(t, s.conn.Target(), grpc.WithDefaultServiceConfig(retryPolicy))}
		r := retrying.call(context.Background(), charge, "pay-2", 1000, nil)
		require.NoError(t, r.err)
		require.False(t, r.replayed)
		require.EqualValues(t, 2, s.runs.Load())
		require.EqualValues(t, 2, s.attempts.Load())
	})
}
