package e2e

import (
	"context"
	"fmt"
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
	require.Regexp(t, `(?m)^idem_completer_executions_total\{[^}]*idem_completer_result="finished"[^}]*\} 1$`, metrics(t, pd))
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

// TestCompleterAbandonedPayments: payments each sent once and never
// retried, by a paymentsd that kills itself at every crash point of a
// payment, a tenth of the time at each (SIGKILL; started again after
// each), through a provider that withholds a quarter of its answers (504). Then paymentsd is killed once more at a
// random moment and started without faults: within 40 s every charge the
// provider made is booked exactly once (ledger = provider charges, each
// payment recording its own charge), and no record is left PROCESSING. On
// the partitioned table too.
func TestCompleterAbandonedPayments(t *testing.T) {
	t.Parallel()
	const payments = 12
	forEachWorld(t, []string{"--timeout-rate", "0.25", "--hang", "10m"}, func(t *testing.T, w *world, db string, ins *inspector) {
		faulty := append(append([]string(nil), completerArgs...), "--psp-timeout", "1s",
			"--crash-before-charge", "0.1", "--crash-in-charge", "0.1", "--crash-after-charge", "0.1",
			"--crash-after-write", "0.1", "--crash-after-commit", "0.1")
		pd := w.paymentsd("paymentsd", db, faulty...)
		crashes := 0
		for i := range payments {
			_, err := pay(context.Background(), pd.url(), merchant, fmt.Sprintf("abandoned-%d", i), body(int64(1000+i)))
			if err != nil { // it died under the request: started again; the client never retries
				crashes++
				pd.waitExit(30 * time.Second)
				pd.restart(w.paymentsdArgs(db, faulty...)...)
			}
		}
		if pd.running() {
			pd.kill9() // a completer's re-drive may be under way: one more crash
		}
		pd.waitExit(30 * time.Second)
		pd.restart(w.paymentsdArgs(db, append(completerArgs, "--psp-timeout", "1s")...)...)
		t.Logf("%d crashes while paying", crashes)

		var charges int64
		var ledger []ledgerRow
		require.Eventually(t, func() bool {
			charges, ledger = chargesOf(t, w.psp, merchant), ins.ledger(t, merchant)
			return int64(len(ledger)) == charges && ins.processing(t) == 0
		}, 40*time.Second, 200*time.Millisecond, "every charge booked, nothing left PROCESSING")
		require.Positive(t, charges, "the provider charged")
		seen := map[string]bool{}
		for _, row := range ledger {
			require.Equal(t, 1, row.entries, "one ledger entry for %s", row.id)
			require.False(t, seen[row.chargeID], "charge %s booked twice", row.chargeID)
			seen[row.chargeID] = true
		}
		t.Logf("%d of %d payments charged and booked", charges, payments)
	}, partitioned)
}

// processing counts the records left PROCESSING.
func (i *inspector) processing(t *testing.T) int {
	t.Helper()
	var n int
	require.NoError(t, i.db.QueryRow(`SELECT COUNT(*) FROM idem_keys WHERE state = 'PROCESSING'`).Scan(&n))
	return n
}
