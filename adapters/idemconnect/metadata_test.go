package idemconnect_test

import (
	"context"
	"errors"
	"net/http"
	"net/http/httptrace"
	"testing"
	"time"

	"connectrpc.com/connect"
	"github.com/stretchr/testify/require"

	"github.com/idemgo/idem"
	"github.com/idemgo/idem/adapters/idemconnect"
	"github.com/idemgo/idem/internal/adaptertest"
)

// replayMetadata is the allow-list of the metadata tests: the charge's
// header, trailer and decline metadata.
func replayMetadata(c *idem.Options) {
	c.Replay.Headers = idemconnect.ReplayHeaders("X-Charge-Id", "X-Ledger-Version", "X-Decline-Code")
}

func TestMetadataReplayed(t *testing.T) {
	// A replay carries the response headers and trailers the first call
	// sent (on the allow-list), and not the ones off it.
	s := newService(t, adaptertest.SQLite(t), replayMetadata)
	s.meta = func(n int64, h, tr http.Header) {
		h.Set("X-Charge-Id", "ch_1")
		h.Set("X-Not-Listed", "dropped")
		tr.Set("X-Ledger-Version", "v7")
	}
	first, err := s.call("k", 1000)
	require.NoError(t, err)
	replay, err := s.call("k", 1000)
	require.NoError(t, err)
	require.Equal(t, "true", replay.Header().Get(idem.HeaderReplayed))
	for _, r := range []*connect.Response[ChargeResponse]{first, replay} {
		require.Equal(t, "ch_1", r.Header().Get("X-Charge-Id"))
		require.Equal(t, "v7", r.Trailer().Get("X-Ledger-Version"))
	}
	require.Equal(t, "dropped", first.Header().Get("X-Not-Listed"))
	require.Empty(t, replay.Header().Get("X-Not-Listed"), "off the allow-list")
	require.Equal(t, *first.Msg, *replay.Msg)
	require.EqualValues(t, 1, s.runs.Load())
}

func TestErrorMetadataReplayed(t *testing.T) {
	// A recorded error (invalid_argument, 400) is replayed with its
	// metadata, and with the headers and trailers set on the response.
	s := newService(t, adaptertest.SQLite(t), replayMetadata)
	s.answer = func(int64, *ChargeRequest) (*ChargeResponse, error) {
		cerr := connect.NewError(connect.CodeInvalidArgument, errors.New("card declined"))
		cerr.Meta().Set("X-Decline-Code", "insufficient_funds")
		return nil, cerr
	}
	for i := range 2 {
		_, err := s.call("k", 1000)
		cerr := requireCode(t, err, connect.CodeInvalidArgument)
		require.Equal(t, "card declined", cerr.Message())
		require.Equal(t, i == 1, cerr.Meta().Get(idem.HeaderReplayed) == "true", "call %d", i+1)
		require.Equal(t, "insufficient_funds", cerr.Meta().Get("X-Decline-Code"), "call %d", i+1)
	}
	require.EqualValues(t, 1, s.runs.Load())
}

func TestClientDeadlineDoesNotReachTheExecution(t *testing.T) {
	// A client with a short timeout (Connect-Timeout-Ms) gives up; the
	// execution goes on, detached from it as on net/http, and is recorded:
	// the handler runs once, and the retry gets its result.
	recorded := make(chan idem.Event, 4)
	s := newService(t, adaptertest.SQLite(t), func(c *idem.Options) {
		c.Engine.Observer = idem.ObserverFunc(func(_ context.Context, e idem.Event) { recorded <- e })
	})
	s.hold = make(chan struct{})
	s.slow = true
	ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
	defer cancel()
	_, err := s.callCtx(ctx, "k", 1000)
	requireCode(t, err, connect.CodeDeadlineExceeded) // the client's own deadline
	close(s.hold)
	e := <-recorded
	require.Equal(t, idem.EventExecuted, e.Kind)
	require.Equal(t, idem.Succeeded, e.Outcome, "the execution was not cut short by the client's deadline")
	res, err := s.call("k", 1000)
	require.NoError(t, err)
	require.Equal(t, "true", res.Header().Get(idem.HeaderReplayed))
	require.Equal(t, ChargeResponse{Charge: 1, Amount: 1000}, *res.Msg)
	require.EqualValues(t, 1, s.runs.Load())
}

func TestPanicWithoutRecoveryRunsOnce(t *testing.T) {
	// No connect.WithRecover: the adapter answers the panic internal (500)
	// itself, after idem recorded it FAILED. Were the connection dropped,
	// Go's http.Transport would resend the keyed call on a reused connection
	// and the handler would run twice for one call. The retry with the same
	// key runs again, as FAILED allows.
	for name, value := range map[string]any{"Value": adaptertest.PanicValue, "ErrAbortHandler": http.ErrAbortHandler} {
		t.Run(name, func(t *testing.T) {
			s := newService(t, adaptertest.SQLite(t), nil)
			s.answer = func(n int64, req *ChargeRequest) (*ChargeResponse, error) {
				if req.Amount == 13 {
					panic(value)
				}
				return &ChargeResponse{Charge: n, Amount: req.Amount}, nil
			}
			tr := &http.Transport{}
			t.Cleanup(tr.CloseIdleConnections)
			client := connect.NewClient[ChargeRequest, ChargeResponse](&http.Client{Transport: tr}, s.url+procedure, connect.WithCodec(jsonCodec{}))
			call := func(ctx context.Context, key string, amount int64) error {
				req := connect.NewRequest(&ChargeRequest{Amount: amount})
				req.Header().Set(idem.HeaderKey, key)
				_, err := client.CallUnary(ctx, req)
				return err
			}
			require.NoError(t, call(context.Background(), "warm", 1)) // a keep-alive connection to reuse
			var reused []bool
			trace := httptrace.WithClientTrace(context.Background(), &httptrace.ClientTrace{GotConn: func(i httptrace.GotConnInfo) { reused = append(reused, i.Reused) }})
			err := call(trace, "k", 13)
			require.True(t, reused[0], "the call went out on the warmed connection")
			require.EqualValues(t, 2, s.runs.Load(), "one call, one execution (after the warm-up's)")
			requireCode(t, err, connect.CodeInternal)
			requireCode(t, call(context.Background(), "k", 13), connect.CodeInternal)
			require.EqualValues(t, 3, s.runs.Load(), "FAILED: the retry runs again")
		})
	}
}

func TestUnknownProcedureDoesNotBurnTheKey(t *testing.T) {
	// A call of a procedure the mux does not route (a client on a stale
	// schema) is the mux's 404, not recorded: the corrected call with the
	// same key runs.
	s := newService(t, adaptertest.SQLite(t), nil)
	stale := connect.NewClient[ChargeRequest, ChargeResponse](http.DefaultClient, s.url+"/payments.v1.PaymentService/Chargee", connect.WithCodec(jsonCodec{}))
	req := connect.NewRequest(&ChargeRequest{Amount: 1000})
	req.Header().Set(idem.HeaderKey, "k")
	_, err := stale.CallUnary(context.Background(), req)
	requireCode(t, err, connect.CodeUnimplemented)
	res, err := s.call("k", 1000)
	require.NoError(t, err)
	require.Empty(t, res.Header().Get(idem.HeaderReplayed))
	require.Equal(t, ChargeResponse{Charge: 1, Amount: 1000}, *res.Msg)
	require.EqualValues(t, 1, s.runs.Load())
}
