//go:build idemfaults

package main

import (
	"context"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/idemgo/idem"
)

func TestMaybeCrash(t *testing.T) {
	t.Parallel()
	var kills atomic.Int32
	rolls := []float64{0.1, 0.5, 0.9}
	f := &faults{
		crash: map[string]float64{crashAfterCharge: 0.5},
		log:   discardLogger(),
		roll:  func() float64 { r := rolls[0]; rolls = rolls[1:]; return r },
		kill:  func() { kills.Add(1) },
	}
	for range 3 {
		f.maybeCrash(context.Background(), crashAfterCharge)
	}
	require.EqualValues(t, 1, kills.Load(), "0.1 crashes, 0.5 and 0.9 do not")
	f.maybeCrash(context.Background(), crashBeforeCharge) // not configured: no roll
	require.Len(t, rolls, 0)
	require.EqualValues(t, 1, kills.Load())

	var none *faults
	none.maybeCrash(context.Background(), crashAfterCharge)
	none.stall(context.Background())
	require.False(t, none.enabled())
	require.True(t, f.enabled())
}

// abortingFaults crash at point by aborting the request (net/http drops the
// connection without a response), as close as a test can get to SIGKILL in
// process. Only meaningful for the points outside the handler: inside, idem
// would see a panic and record FAILED, which a dead process never does.
func abortingFaults(point string) *faults {
	return &faults{crash: map[string]float64{point: 1}, log: discardLogger(),
		kill: func() { panic(http.ErrAbortHandler) }}
}

// TestCrashPointsAroundIdem runs the crash points that surround idem in
// process: the client gets no response, and the ledger is what
// docs/crash-semantics.md says. The e2e package runs every point with real
// processes and SIGKILL.
func TestCrashPointsAroundIdem(t *testing.T) {
	t.Parallel()
	cases := []struct {
		point    string
		payments int64 // in the ledger after the crash
		replayed bool  // the retry's answer is a replay
	}{
		{crashBeforeClaim, 0, false},
		{crashAfterCommit, 1, true},
		{crashOnReplay, 1, true},
	}
	for _, tc := range cases {
		t.Run(tc.point, func(t *testing.T) {
			t.Parallel()
			store := newSQLiteStore(t)
			provider := NewFakeProvider(0)
			crashing, err := newHandler(handlerConfig{Store: store, Provider: provider, Logger: discardLogger(), Faults: abortingFaults(tc.point)})
			require.NoError(t, err)
			srv := httptest.NewServer(crashing)
			t.Cleanup(srv.Close)
			s := &testServer{t: t, url: srv.URL, store: store}
			healthy := startServer(t, store, provider)

			if tc.point == crashOnReplay {
				require.Equal(t, http.StatusCreated, healthy.postJSON("acme", "c-1", paymentBody).status)
			}
			req, err := http.NewRequest(http.MethodPost, s.url+"/v1/payments", strings.NewReader(paymentBody))
			require.NoError(t, err)
			req.Header.Set("Authorization", auth("acme"))
			req.Header.Set("Idempotency-Key", "c-1")
			req.Header.Set("Content-Type", "application/json")
			resp, err := http.DefaultClient.Do(req)
			if err == nil {
				resp.Body.Close()
			}
			require.Error(t, err, "the crash leaves the client without a response")
			require.EqualValues(t, tc.payments, healthy.balance("acme").Payments)

			r := healthy.postJSON("acme", "c-1", paymentBody)
			require.Equal(t, http.StatusCreated, r.status, "body: %s", r.body)
			require.Equal(t, tc.replayed, r.header.Get(idem.HeaderReplayed) == "true")
			require.EqualValues(t, 1, healthy.balance("acme").Payments)
			require.Equal(t, 1, provider.Calls())
		})
	}
}

func TestStalledOwnerIsFencedOut(t *testing.T) {
	t.Parallel()
	inEachWriteMode(t, func(t *testing.T, mode WriteMode) { testStalledOwnerIsFencedOut(t, newSQLiteStore(t), mode) })
}

// testStalledOwnerIsFencedOut: replica A stalls after the charge (handler
// and lease renewal paused, as in a stop-the-world pause) past its 1 s
// lease; replica B, on the same database and provider, takes the key over
// and records the payment with A's charge, recorded as the charge step's
// result (idem.Step) before the stall. When A
// resumes and writes, its completion is fenced out: its caller gets 409 and
// its writes do not commit.
func testStalledOwnerIsFencedOut(t *testing.T, store Store, mode WriteMode) {
	provider := NewFakeProvider(0)
	newReplicaLogging := func(log *slog.Logger, f *faults) *testServer {
		h, err := newHandler(handlerConfig{Store: store, Provider: provider, Logger: log,
			Lease: time.Second, WriteMode: mode, Faults: f})
		require.NoError(t, err)
		srv := httptest.NewServer(h)
		t.Cleanup(srv.Close)
		return &testServer{t: t, url: srv.URL, store: store}
	}
	newReplica := func(f *faults) *testServer { return newReplicaLogging(discardLogger(), f) }
	logA, readLogA := tempLog(t)
	logger := slog.New(slog.NewJSONHandler(logA, nil))
	a := newReplicaLogging(logger, &faults{stallAfterCharge: 4 * time.Second, log: logger})
	b := newReplica(nil)

	answerA := make(chan response, 1)
	go func() { answerA <- a.postJSON("acme", "stall-1", paymentBody) }()
	require.Eventually(t, func() bool { return provider.Calls() == 1 }, 10*time.Second, 5*time.Millisecond)

	var inFlight int
	var r response
	for {
		r = b.postJSON("acme", "stall-1", paymentBody)
		if r.status != http.StatusConflict {
			break
		}
		inFlight++
		secs, err := strconv.Atoi(r.header.Get("Retry-After"))
		require.NoError(t, err)
		require.True(t, secs >= 1 && secs <= 1, "Retry-After %d for a 1s lease", secs)
		time.Sleep(time.Duration(secs) * time.Second)
	}
	require.Equal(t, http.StatusCreated, r.status, "body: %s", r.body)
	require.Empty(t, r.header.Get(idem.HeaderReplayed), "B took the key over and ran the handler")
	require.Positive(t, inFlight, "B waited for A's lease to run out")

	// A's outcome is not recorded: 409 when its renewal finds the lease lost
	// or its completion is refused; 503 store-unavailable when its first
	// renewal after the pause fails outright (on SQLite it waits behind its
	// own transaction's write lock), which idem logs.
	ra := <-answerA
	switch ra.status {
	case http.StatusConflict:
		require.Equal(t, idem.ProblemTypeBase+"request-in-flight", ra.problem(t)["type"])
	case http.StatusServiceUnavailable:
		require.Equal(t, idem.ProblemTypeBase+"store-unavailable", ra.problem(t)["type"])
		require.Contains(t, readLogA(), "idem: lease not renewed for a whole lease; giving up")
	default:
		t.Fatalf("the stalled owner's outcome must not be recorded: %d %s", ra.status, ra.body)
	}

	require.Equal(t, 1, provider.Calls(), "B booked A's charge, recorded as the charge step's result, without asking the provider")
	require.Equal(t, 1, provider.Charges(), "one charge")
	require.EqualValues(t, 1, b.balance("acme").Payments)
	again := a.postJSON("acme", "stall-1", paymentBody)
	require.Equal(t, "true", again.header.Get(idem.HeaderReplayed))
	require.Equal(t, r.body, again.body, "the key's result is B's")
}

func TestStalledOwnerIsFencedOutPostgres(t *testing.T) {
	t.Parallel()
	testStalledOwnerIsFencedOut(t, newPGTestStore(t), WriteInClaim)
}

func TestStalledOwnerIsFencedOutMySQL(t *testing.T) {
	t.Parallel()
	testStalledOwnerIsFencedOut(t, newMySQLTestStore(t), WriteInClaim)
}

// The fault-injection flags (TestParseFlags has the others).
func TestParseFaultFlags(t *testing.T) {
	t.Parallel()
	o, err := parseFlags(nil, io.Discard, nil)
	require.NoError(t, err)
	require.Empty(t, o.faults.crash)
	require.Zero(t, o.faults.stallAfterCharge)
	require.Empty(t, o.faults.describe())
	require.Nil(t, o.faults.build(discardLogger()))

	o, err = parseFlags([]string{"--crash-after-charge", "1", "--crash-on-replay", "0.25", "--stall-after-charge", "3s"}, io.Discard, nil)
	require.NoError(t, err)
	require.Equal(t, map[string]float64{crashAfterCharge: 1, crashOnReplay: 0.25}, o.faults.crash)
	require.Equal(t, 3*time.Second, o.faults.stallAfterCharge)
	require.Equal(t, "crash-after-charge=1 crash-on-replay=0.25 stall-after-charge=3s", o.faults.describe())
	require.True(t, o.faults.build(discardLogger()).enabled())

	for _, bad := range [][]string{{"--crash-after-charge", "1.5"}, {"--crash-before-claim", "-0.1"},
		{"--crash-after-commit", "NaN"}, {"--stall-after-charge", "-1s"}} {
		_, err := parseFlags(bad, io.Discard, nil)
		require.Error(t, err, "%v", bad)
	}
}
