package e2e

import (
	"context"
	"net/http"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// completerArgs turn paymentsd's completer on, finishing an abandoned
// payment 1 s after it was last touched, with a lease of 2 s.
var completerArgs = []string{"--lease", "2s", "--completer", "--completer-grace", "1s"}

// requireBookedWithoutClient waits (at most 40 s) until the ledger holds
// merchant's one payment, then checks the books (one charge, one payment)
// and that the client's late retry replays it.
func requireBookedWithoutClient(t *testing.T, w *world, pd *proc, ins *inspector, key string, amount int64) {
	t.Helper()
	start := time.Now()
	require.Eventually(t, func() bool { return len(ins.ledger(t, merchant)) == 1 }, 40*time.Second, 100*time.Millisecond,
		"the completer books the payment without its client")
	t.Logf("booked %s after the restart", time.Since(start).Round(100*time.Millisecond))
	w.requireOneCharge(pd, ins, merchant, amount)
	require.Equal(t, 1, pd.waitLogged(t, 1, "idem: completer: re-drove an abandoned execution", "status", 201))
	late, err := pay(context.Background(), pd.url(), merchant, key, body(amount))
	require.NoError(t, err)
	require.Equal(t, http.StatusCreated, late.status, "%s", late)
	require.True(t, late.replayed(), "the late retry gets the completer's outcome")
}

// TestCompleterAfterCrash: paymentsd dies after the provider charged, is
// started again, and the client never retries: its completer re-drives the
// payment from the request kept at the charge, books the recorded charge
// without calling the provider, and the client's late retry gets the
// replay.
func TestCompleterAfterCrash(t *testing.T) {
	t.Parallel()
	const key, amount = "order-abandoned-1", 6000
	forEachWorld(t, nil, func(t *testing.T, w *world, db string, ins *inspector) {
		pd := w.paymentsd("paymentsd", db, append(completerArgs, "--crash-after-charge", "1")...)
		r, err := pay(context.Background(), pd.url(), merchant, key, body(amount))
		requireNoAnswer(t, r, err)
		requireCrashed(t, pd, "after-charge")
		require.EqualValues(t, 1, chargesOf(t, w.psp, merchant))
		pd.restart(w.paymentsdArgs(db, completerArgs...)...)
		requireBookedWithoutClient(t, w, pd, ins, key, amount)
		require.Equal(t, 1, pd.logged("charged", "provider_called", false), "the recorded charge, booked")
	})
}

// TestCompleterAfterProviderTimeout: the provider charged but its answer
// came too late (504, the record FAILED with the charge step started); the
// client never retries. The completer re-drives it: the step runs again
// under the same relayed key, the provider answers with its charge, and the
// payment is booked once.
func TestCompleterAfterProviderTimeout(t *testing.T) {
	t.Parallel()
	const key, amount = "order-abandoned-2", 7000
	forEachWorld(t, []string{"--timeout-rate", "1", "--hang", "10m"}, func(t *testing.T, w *world, db string, ins *inspector) {
		pd := w.paymentsd("paymentsd", db, append(completerArgs, "--psp-timeout", "1s")...)
		r, err := pay(context.Background(), pd.url(), merchant, key, body(amount))
		require.NoError(t, err)
		require.Equal(t, http.StatusGatewayTimeout, r.status, "%s", r)
		requireBookedWithoutClient(t, w, pd, ins, key, amount)
	})
}
