package idemconnect_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"connectrpc.com/connect"
	"github.com/stretchr/testify/require"
	"google.golang.org/genproto/googleapis/rpc/errdetails"

	"github.com/idemgo/idem"
	"github.com/idemgo/idem/adapters/idemconnect"
	"github.com/idemgo/idem/internal/adaptertest"
)

// jsonCodec is a Connect codec for plain Go structs (no generated code),
// under the name "json": the client sends Content-Type application/json.
type jsonCodec struct{}

func (jsonCodec) Name() string                    { return "json" }
func (jsonCodec) Marshal(v any) ([]byte, error)   { return json.Marshal(v) }
func (jsonCodec) Unmarshal(b []byte, v any) error { return json.Unmarshal(b, v) }

type ChargeRequest struct {
	Amount int64 `json:"amount"`
}

type ChargeResponse struct {
	Charge int64 `json:"charge"`
	Amount int64 `json:"amount"`
}

const procedure = "/payments.v1.PaymentService/Charge"

// service is a Connect server behind idemconnect.Handler; charge's runs are
// counted, and its answer is the test's to choose.
type service struct {
	runs  atomic.Int64
	hold  chan struct{} // when set, charge waits for it to close
	enter chan struct{} // when set, charge sends on it first
	// answer decides charge's result for run n (default: a charge).
	answer func(n int64, req *ChargeRequest) (*ChargeResponse, error)
	// meta, when set, sets the response's headers and trailers of run n.
	meta func(n int64, header, trailer http.Header)
	// slow makes charge's work outlast a deadline of its context shorter
	// than a minute (idem's own MaxExecution is longer): it waits for the
	// deadline and fails deadline_exceeded.
	slow bool
	// uncertain makes charge run an at-most-once step (idem.AtMostOnce)
	// whose call ends uncertain: the record becomes UNKNOWN.
	uncertain bool
	url       string
}

func newService(t *testing.T, store idem.Store, cfg func(*idem.Options), handlerOpts ...connect.HandlerOption) *service {
	t.Helper()
	s := &service{}
	c := idem.Options{Scope: func(*http.Request) (string, error) { return adaptertest.Scope, nil }}
	if cfg != nil {
		cfg(&c)
	}
	mw, err := idem.NewMiddleware(store, c)
	require.NoError(t, err)
	h := connect.NewUnaryHandler(procedure, func(ctx context.Context, req *connect.Request[ChargeRequest]) (*connect.Response[ChargeResponse], error) {
		n := s.runs.Add(1)
		if _, ok := idem.ExecutionFromContext(ctx); !ok {
			return nil, connect.NewError(connect.CodeInternal, errors.New("the handler ran outside idem's handler"))
		}
		if s.enter != nil {
			s.enter <- struct{}{}
		}
		if dl, ok := ctx.Deadline(); s.slow && ok && time.Until(dl) < time.Minute {
			<-ctx.Done() // the work outlasts a deadline this short
			return nil, connect.NewError(connect.CodeDeadlineExceeded, ctx.Err())
		}
		if s.hold != nil {
			<-s.hold
		}
		if s.uncertain {
			_, err := idem.Step(ctx, "transfer", func(context.Context) (int64, error) {
				return 0, errors.New("the bank did not answer")
			}, idem.AtMostOnce())
			return nil, connect.NewError(connect.CodeUnavailable, err)
		}
		res := connect.NewResponse(&ChargeResponse{Charge: n, Amount: req.Msg.Amount})
		if s.answer != nil {
			msg, err := s.answer(n, req.Msg)
			if err != nil {
				return nil, err
			}
			res = connect.NewResponse(msg)
		}
		if s.meta != nil {
			s.meta(n, res.Header(), res.Trailer())
		}
		return res, nil
	}, append([]connect.HandlerOption{connect.WithCodec(jsonCodec{})}, handlerOpts...)...)
	mux := http.NewServeMux()
	mux.Handle(procedure, h)
	srv := httptest.NewServer(idemconnect.Handler(mw, mux))
	t.Cleanup(srv.Close)
	s.url = srv.URL
	return s
}

// call makes one unary call with key (none when empty).
func (s *service) call(key string, amount int64) (*connect.Response[ChargeResponse], error) {
	return s.callCtx(context.Background(), key, amount)
}

// callCtx is call under ctx (its deadline is sent as Connect-Timeout-Ms).
func (s *service) callCtx(ctx context.Context, key string, amount int64) (*connect.Response[ChargeResponse], error) {
	client := connect.NewClient[ChargeRequest, ChargeResponse](http.DefaultClient, s.url+procedure, connect.WithCodec(jsonCodec{}))
	req := connect.NewRequest(&ChargeRequest{Amount: amount})
	if key != "" {
		req.Header().Set(idem.HeaderKey, key)
	}
	return client.CallUnary(ctx, req)
}

// requireCode asserts err is a Connect error with code, and returns it.
func requireCode(t *testing.T, err error, code connect.Code) *connect.Error {
	t.Helper()
	var cerr *connect.Error
	require.ErrorAs(t, err, &cerr)
	require.Equal(t, code, cerr.Code(), "error: %v", err)
	return cerr
}

// failOnce is a service answer: run 1 fails with a Connect error of code and
// message, later runs charge.
func failOnce(code connect.Code, message string) func(int64, *ChargeRequest) (*ChargeResponse, error) {
	return func(n int64, req *ChargeRequest) (*ChargeResponse, error) {
		if n == 1 {
			return nil, connect.NewError(code, errors.New(message))
		}
		return &ChargeResponse{Charge: n, Amount: req.Amount}, nil
	}
}

// requireRetryRuns checks that the first call of "k" fails with code, and
// that its retry runs the handler again and charges.
func requireRetryRuns(t *testing.T, s *service, code connect.Code) {
	t.Helper()
	_, err := s.call("k", 1000)
	requireCode(t, err, code)
	res, err := s.call("k", 1000)
	require.NoError(t, err)
	require.EqualValues(t, 2, res.Msg.Charge)
	require.EqualValues(t, 2, s.runs.Load())
}

// retryDelay returns the RetryInfo detail's delay in whole seconds, -1
// without one.
func retryDelay(t *testing.T, cerr *connect.Error) int64 {
	t.Helper()
	for _, d := range cerr.Details() {
		v, err := d.Value()
		require.NoError(t, err)
		if ri, ok := v.(*errdetails.RetryInfo); ok {
			return ri.GetRetryDelay().GetSeconds()
		}
	}
	return -1
}

func TestConnect(t *testing.T) {
	for name, store := range adaptertest.Stores {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			testConnect(t, store)
		})
	}
}

func testConnect(t *testing.T, store func(*testing.T) idem.Store) {
	t.Run("Replay", func(t *testing.T) {
		s := newService(t, store(t), nil)
		first, err := s.call("k", 1000)
		require.NoError(t, err)
		require.Equal(t, ChargeResponse{Charge: 1, Amount: 1000}, *first.Msg)
		require.Empty(t, first.Header().Get(idem.HeaderReplayed))
		replay, err := s.call("k", 1000)
		require.NoError(t, err)
		require.Equal(t, *first.Msg, *replay.Msg)
		require.Equal(t, "true", replay.Header().Get(idem.HeaderReplayed))
		require.EqualValues(t, 1, s.runs.Load())
	})

	t.Run("ConcurrentDuplicates", func(t *testing.T) {
		// 16 concurrent calls, one key: one execution; the others get the
		// replay or unavailable with retry info.
		s := newService(t, store(t), nil)
		const n = 16
		var wg sync.WaitGroup
		start := make(chan struct{})
		msgs := make([]*ChargeResponse, n)
		errs := make([]error, n)
		for i := range n {
			wg.Go(func() {
				<-start
				res, err := s.call("storm", 1000)
				if err == nil {
					msgs[i] = res.Msg
				}
				errs[i] = err
			})
		}
		close(start)
		wg.Wait()
		require.EqualValues(t, 1, s.runs.Load())
		for i := range n {
			if errs[i] != nil {
				cerr := requireCode(t, errs[i], connect.CodeUnavailable)
				require.GreaterOrEqual(t, retryDelay(t, cerr), int64(1))
				continue
			}
			require.Equal(t, ChargeResponse{Charge: 1, Amount: 1000}, *msgs[i])
		}
	})

	t.Run("InFlight", func(t *testing.T) {
		// A duplicate while the first call runs: unavailable, RetryInfo and
		// Retry-After with the seconds left on the lease.
		s := newService(t, store(t), nil)
		s.hold, s.enter = make(chan struct{}), make(chan struct{}, 1)
		release := sync.OnceFunc(func() { close(s.hold) })
		t.Cleanup(release)
		done := make(chan error, 1)
		go func() { _, err := s.call("held", 1000); done <- err }()
		<-s.enter
		_, err := s.call("held", 1000)
		cerr := requireCode(t, err, connect.CodeUnavailable)
		delay := retryDelay(t, cerr)
		require.GreaterOrEqual(t, delay, int64(1))
		require.LessOrEqual(t, delay, int64(idem.DefaultLeaseDuration/1e9))
		require.Equal(t, fmt.Sprint(delay), cerr.Meta().Get("Retry-After"))
		require.Equal(t, idem.ProblemTypeBase+"request-in-flight", cerr.Meta().Get(idemconnect.HeaderProblemType))
		require.Equal(t, "false", cerr.Meta().Get(idemconnect.HeaderNewKeySafe))
		release()
		require.NoError(t, <-done)
		require.EqualValues(t, 1, s.runs.Load())
	})

	t.Run("KeyReused", func(t *testing.T) {
		s := newService(t, store(t), nil)
		_, err := s.call("k", 1000)
		require.NoError(t, err)
		_, err = s.call("k", 9999)
		cerr := requireCode(t, err, connect.CodeFailedPrecondition)
		require.Equal(t, "false", cerr.Meta().Get(idemconnect.HeaderNewKeySafe), "the same procedure, another request: perhaps this call, changed")
		require.EqualValues(t, 1, s.runs.Load())
	})

	t.Run("OutcomeUnknown", func(t *testing.T) {
		s := newService(t, store(t), nil)
		s.uncertain = true
		for range 3 {
			_, err := s.call("k", 1000)
			cerr := requireCode(t, err, connect.CodeFailedPrecondition)
			require.Equal(t, idem.ProblemTypeBase+"outcome-unknown", cerr.Meta().Get(idemconnect.HeaderProblemType))
			require.EqualValues(t, -1, retryDelay(t, cerr), "no RetryInfo: retrying does not help")
			require.Equal(t, "false", cerr.Meta().Get(idemconnect.HeaderNewKeySafe))
		}
		require.EqualValues(t, 1, s.runs.Load())
	})

	t.Run("BadKey", func(t *testing.T) {
		s := newService(t, store(t), nil)
		_, err := s.call("not a valid key", 1000) // spaces
		requireCode(t, err, connect.CodeInvalidArgument)
		_, err = s.call("", 1000)
		requireCode(t, err, connect.CodeInvalidArgument)
		require.EqualValues(t, 0, s.runs.Load())
	})

	t.Run("MissingScope", func(t *testing.T) {
		s := newService(t, store(t), func(c *idem.Options) {
			c.Scope = func(*http.Request) (string, error) { return "", errors.New("no credentials") }
		})
		_, err := s.call("k", 1000)
		requireCode(t, err, connect.CodeUnauthenticated)
		require.EqualValues(t, 0, s.runs.Load())
	})

	t.Run("HandlerErrorRecorded", func(t *testing.T) {
		// The handler's own Connect error (invalid_argument, HTTP 400) is an
		// outcome: recorded, replayed with its code and message.
		s := newService(t, store(t), nil)
		s.answer = func(int64, *ChargeRequest) (*ChargeResponse, error) {
			return nil, connect.NewError(connect.CodeInvalidArgument, errors.New("amount below the minimum"))
		}
		for i := range 2 {
			_, err := s.call("k", 1)
			cerr := requireCode(t, err, connect.CodeInvalidArgument)
			require.Equal(t, "amount below the minimum", cerr.Message())
			require.Equal(t, i == 1, cerr.Meta().Get(idem.HeaderReplayed) == "true", "call %d", i+1)
		}
		require.EqualValues(t, 1, s.runs.Load())
	})

	t.Run("HandlerErrorRetryable", func(t *testing.T) {
		// unavailable (503) is FAILED: the retry runs again, and succeeds.
		s := newService(t, store(t), nil)
		s.answer = failOnce(connect.CodeUnavailable, "provider down")
		requireRetryRuns(t, s, connect.CodeUnavailable)
	})

	t.Run("Aborted", func(t *testing.T) {
		// With idemconnect.Outcome, aborted (409) is FAILED: the retry runs.
		s := newService(t, store(t), func(c *idem.Options) { c.Engine.Response.Outcome = idemconnect.Outcome })
		s.answer = failOnce(connect.CodeAborted, "ledger version conflict")
		requireRetryRuns(t, s, connect.CodeAborted)
	})

	t.Run("PanicRecovered", func(t *testing.T) {
		// connect.WithRecover answers the panic as internal (500): FAILED,
		// the retry runs again instead of meeting "in flight".
		s := newService(t, store(t), nil, connect.WithRecover(func(context.Context, connect.Spec, http.Header, any) error {
			return connect.NewError(connect.CodeInternal, errors.New("handler panic"))
		}))
		s.answer = func(int64, *ChargeRequest) (*ChargeResponse, error) { panic("boom") }
		for range 2 {
			_, err := s.call("k", 1000)
			requireCode(t, err, connect.CodeInternal)
		}
		require.EqualValues(t, 2, s.runs.Load())
	})
}
