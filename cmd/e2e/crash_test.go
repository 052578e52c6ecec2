package e2e

import (
	"context"
	"fmt"
	"net/http"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/idemgo/idem"
)

// merchant makes the crash tests' payments.
const merchant = "acme"

// forEachWorld runs f as a parallel subtest per target (forEachTarget), in
// a new world whose fakepsp gets pspArgs, with a fresh paymentsd database
// db and its inspector.
func forEachWorld(t *testing.T, pspArgs []string, f func(t *testing.T, w *world, db string, ins *inspector), extra ...target) {
	forEachTarget(t, func(t *testing.T, tgt target) {
		w := newWorld(t, tgt, pspArgs...)
		db := tgt.newDB(t)
		f(t, w, db, inspect(t, db))
	}, extra...)
}

// body is a payment of amount JPY.
func body(amount int64) string {
	return fmt.Sprintf(`{"amount":%d,"currency":"JPY","customer":"cus_42"}`, amount)
}

// TestCrashAfterChargeTakeover: paymentsd dies (SIGKILL) after the provider
// charged and before the payment was written. Restarted, it answers a retry
// 409 while the dead owner's lease runs, then takes the key over; the charge
// is an idem step whose result was recorded before the crash, so the
// takeover books it without calling the provider: one charge, one payment,
// one ledger entry.
func TestCrashAfterChargeTakeover(t *testing.T) {
	t.Parallel()
	const key, amount, lease = "order-crash-1", 1000, 3 // lease in seconds
	forEachWorld(t, nil, func(t *testing.T, w *world, db string, ins *inspector) {
		pd := w.paymentsd("paymentsd", db, "--lease", fmt.Sprintf("%ds", lease), "--crash-after-charge", "1")

		r, err := pay(context.Background(), pd.url(), merchant, key, body(amount))
		requireNoAnswer(t, r, err)
		requireCrashed(t, pd, "after-charge")

		// The provider charged; the ledger holds nothing; the key is still
		// PROCESSING under the dead process's lease.
		require.EqualValues(t, 1, chargesOf(t, w.psp, merchant))
		require.Empty(t, ins.ledger(t, merchant))
		rec := ins.record(t, merchant, key)
		require.Equal(t, record{found: true, state: "PROCESSING", fencingToken: 1, attempts: 1}, rec)

		pd.restart(w.paymentsdArgs(db, "--lease", fmt.Sprintf("%ds", lease))...)
		first, err := pay(context.Background(), pd.url(), merchant, key, body(amount))
		require.NoError(t, err)
		require.Equal(t, http.StatusConflict, first.status, "a retry before the lease ends: %s", first)
		require.Equal(t, idem.ProblemTypeBase+"request-in-flight", first.problemType())
		require.GreaterOrEqual(t, first.retryAfter(), 1)
		require.LessOrEqual(t, first.retryAfter(), lease, "Retry-After is at most the lease left")

		attempts, done := retryUntilDone(t, pd.url(), merchant, key, amount)
		for _, a := range attempts[:len(attempts)-1] {
			require.NoError(t, a.err)
			require.Equal(t, http.StatusConflict, a.resp.status, "only 409s until the takeover: %s", a.resp)
			require.LessOrEqual(t, a.resp.retryAfter(), lease)
		}
		require.False(t, done.replayed(), "the takeover ran the handler again")

		// The provider was called once, with the key idem derived from
		// (merchant, key, created_at, "charge") and the relay secret; the
		// takeover read the charge from the step's recorded result.
		w.requireTakenOver(pd, ins, pd.url(), merchant, key, amount, done)
	})
}

// TestStalledOwnerFencedOut: replica A stalls after the charge for longer
// than its lease, with its lease renewal paused (--stall-after-charge: a
// stop-the-world pause); replica B, on the same database and provider,
// takes the key over and records the payment. When A resumes and writes,
// idem's fencing token refuses its completion: its caller gets 409 and its
// writes roll back. One charge, one payment.
func TestStalledOwnerFencedOut(t *testing.T) {
	t.Parallel()
	const key, amount = "order-stall-1", 2000
	forEachWorld(t, nil, func(t *testing.T, w *world, db string, ins *inspector) {
		a := w.paymentsd("paymentsd-a", db, "--lease", "2s", "--stall-after-charge", "8s")
		b := w.paymentsd("paymentsd-b", db, "--lease", "2s")

		answerA := payInBackground(a.url(), merchant, key, amount)
		require.Eventually(t, func() bool { return a.logged("fault injected: stalling after the charge, renewing no lease") == 1 },
			30*time.Second, 10*time.Millisecond)

		attempts, done := retryUntilDone(t, b.url(), merchant, key, amount)
		require.False(t, done.replayed(), "B took the key over and ran the handler")
		require.Greater(t, len(attempts), 1, "B waited for A's lease to run out")
		require.Equal(t, http.StatusConflict, attempts[0].resp.status)
		select {
		case <-answerA:
			t.Fatal("A answered before B had taken over: the stall was too short for this machine")
		default:
		}

		ra := <-answerA
		require.NoError(t, ra.err)
		requireNotRecorded(t, a, ra.resp)
		require.True(t, a.running(), "A is slow, not dead")

		w.requireTakenOver(b, ins, a.url(), merchant, key, amount, done, "the key's result is B's, on A too")
	})
}

// TestFrozenOwnerFencedOut is the stalled owner with a real pause: replica A
// is stopped with SIGSTOP while its charge is in flight at the provider (the
// provider takes 1.5 s), so nothing of it runs, its heartbeat included. B
// takes the key over once A's lease has run out and records the payment;
// A, continued with SIGCONT, is fenced out. One charge, one payment.
func TestFrozenOwnerFencedOut(t *testing.T) {
	t.Parallel()
	const key, amount = "order-frozen-1", 3000
	forEachWorld(t, []string{"--latency", "1500ms"}, func(t *testing.T, w *world, db string, ins *inspector) {
		a := w.paymentsd("paymentsd-a", db, "--lease", "2s")
		b := w.paymentsd("paymentsd-b", db, "--lease", "2s")

		answerA := payInBackground(a.url(), merchant, key, amount)
		// A has committed its charge step's start marker, so its charge is on
		// its way to the provider and it holds no write lock (on SQLite, a
		// process frozen inside a write stops every other writer): freeze it.
		require.Eventually(t, func() bool { return ins.stepStarted(t, merchant, key, "charge") }, 30*time.Second, 5*time.Millisecond)
		a.signal(syscall.SIGSTOP)

		attempts, done := retryUntilDone(t, b.url(), merchant, key, amount)
		require.False(t, done.replayed(), "B took the key over")
		require.Equal(t, http.StatusConflict, attempts[0].resp.status, "A's lease held at first: %s", attempts[0].resp)

		a.signal(syscall.SIGCONT)
		ra := <-answerA
		require.NoError(t, ra.err)
		requireNotRecorded(t, a, ra.resp)

		w.requireOneCharge(b, ins, merchant, amount)
		rec := ins.record(t, merchant, key)
		require.Equal(t, "SUCCEEDED", rec.state)
		require.GreaterOrEqual(t, rec.fencingToken, int64(2))
		for _, r := range pspRequests(t, w.psp, ins.relayKey(t, merchant, key), 1) {
			require.Contains(t, []int{201, 409}, r.status, "every charge request carried the relayed key")
		}
	})
}

// payInBackground sends one payment in a goroutine; the channel gets its
// answer.
func payInBackground(url, merchant, key string, amount int64) <-chan attempt {
	answer := make(chan attempt, 1)
	go func() {
		r, err := pay(context.Background(), url, merchant, key, body(amount))
		answer <- attempt{resp: r, err: err, at: time.Now()}
	}()
	return answer
}

// retryUntilDone retries the payment on url for up to a minute until it is
// answered other than 409 (payUntilDone), requires that it was, and returns
// every attempt and the last answer.
func retryUntilDone(t *testing.T, url, merchant, key string, amount int64) ([]attempt, response) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	attempts, err := payUntilDone(ctx, url, merchant, key, body(amount))
	require.NoError(t, err)
	return attempts, attempts[len(attempts)-1].resp
}

// requireTakenOver checks a key taken over once and completed by owner: the
// provider was called once, by the first execution, and the takeover booked
// its charge from the charge step's recorded result; one charge
// (requireOneCharge); the record SUCCEEDED under fencing token 2 after 2
// attempts; and a retry on replayURL replays done's body.
func (w *world) requireTakenOver(owner *proc, ins *inspector, replayURL, merchant, key string, amount int64, done response, msgAndArgs ...any) {
	t := w.t
	t.Helper()
	// One call: the takeover found the charge step's result recorded.
	require.Equal(t, []pspRequest{{201, false}}, pspRequests(t, w.psp, ins.relayKey(t, merchant, key), 1))
	require.Equal(t, 1, owner.logged("charged", "attempt", 2, "provider_called", false),
		"the takeover booked the recorded charge without calling the provider")
	w.requireOneCharge(owner, ins, merchant, amount)
	require.Equal(t, record{found: true, state: "SUCCEEDED", fencingToken: 2, attempts: 2}, ins.record(t, merchant, key))
	again, err := pay(context.Background(), replayURL, merchant, key, body(amount))
	require.NoError(t, err)
	require.True(t, again.replayed())
	require.Equal(t, done.body, again.body, msgAndArgs...)
}

// requireNotRecorded checks the answer of a stalled or frozen owner whose
// key was taken over: its outcome was not recorded. Normally that is 409
// request-in-flight (its renewal found the lease lost, or its completion was
// refused by the fencing token). When its first renewal after the pause
// fails outright instead of finding the lease lost (on SQLite it waits
// behind its own transaction's write lock; under load it can outlast its
// lease/3 budget), idem gives up on the store and answers 503
// store-unavailable; accepted only with idem's log line saying so. Either
// way the caller is told to retry, and gets the new owner's result.
func requireNotRecorded(t *testing.T, owner *proc, r response) {
	t.Helper()
	switch r.status {
	case http.StatusConflict:
		require.Equal(t, idem.ProblemTypeBase+"request-in-flight", r.problemType(), "%s", r)
		require.Positive(t, owner.waitLogged(t, 1, "idem: lease lost")+owner.logged("idem: completion fenced out"),
			"idem fenced %s out", owner.Name)
	case http.StatusServiceUnavailable:
		require.Equal(t, idem.ProblemTypeBase+"store-unavailable", r.problemType(), "%s", r)
		require.Equal(t, 1, owner.waitLogged(t, 1, "idem: lease not renewed for a whole lease; giving up"), "why %s answered 503", owner.Name)
	default:
		t.Fatalf("%s's outcome must not be recorded: %s", owner.Name, r)
	}
}

// TestProviderTimeoutRetried: the provider charges and records, but its
// answer never comes in time (fakepsp --timeout-rate 1). paymentsd answers
// 504; idem records FAILED (retryable); the retry reaches the provider with
// the same relayed key and gets the charge's replay: exactly one charge.
func TestProviderTimeoutRetried(t *testing.T) {
	t.Parallel()
	const key, amount = "order-timeout-1", 4000
	forEachWorld(t, []string{"--timeout-rate", "1", "--hang", "10m"}, func(t *testing.T, w *world, db string, ins *inspector) {
		pd := w.paymentsd("paymentsd", db, "--psp-timeout", "1s")

		r, err := pay(context.Background(), pd.url(), merchant, key, body(amount))
		require.NoError(t, err)
		require.Equal(t, http.StatusGatewayTimeout, r.status, "%s", r)
		require.Equal(t, "https://github.com/idemgo/idem/blob/main/cmd/paymentsd/README.md#provider-timeout", r.problemType())
		require.Equal(t, 1, r.retryAfter())

		require.EqualValues(t, 1, chargesOf(t, w.psp, merchant), "the provider charged, though nobody heard")
		require.Empty(t, ins.ledger(t, merchant))
		require.Equal(t, record{found: true, state: "FAILED", fencingToken: 1, attempts: 1}, ins.record(t, merchant, key))

		r, err = pay(context.Background(), pd.url(), merchant, key, body(amount))
		require.NoError(t, err)
		require.Equal(t, http.StatusCreated, r.status, "%s", r)
		require.False(t, r.replayed(), "FAILED runs again")

		// The withheld first answer is logged with status 0 (the client hung
		// up), the retry got the replay.
		reqs := pspRequests(t, w.psp, ins.relayKey(t, merchant, key), 2)
		require.Len(t, reqs, 2)
		require.Equal(t, pspRequest{201, true}, reqs[1])
		require.Equal(t, 1, w.psp.waitLogged(t, 1, "fault injected: charged and recorded; withholding the answer"))
		w.requireOneCharge(pd, ins, merchant, amount)
		require.Equal(t, record{found: true, state: "SUCCEEDED", fencingToken: 2, attempts: 2}, ins.record(t, merchant, key))
	})
}
