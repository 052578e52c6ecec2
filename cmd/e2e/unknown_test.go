package e2e

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/idemgo/idem"
)

// TestAtMostOnceChargeHeldUnknown: a provider without idempotency
// (fakepsp --idempotency=false) and the charge declared at-most-once
// (paymentsd --at-most-once-charge). paymentsd dies after the provider
// charged and before the charge step's result was recorded. Restarted, it
// answers 20 s of client retries with 409 only (request-in-flight while the
// dead owner's lease runs, then outcome-unknown, without Retry-After) and
// never calls the provider again: one charge. `idem resolve --applied` with
// the charge the provider made ends it: the next retry books that charge
// without calling the provider, and the one after replays it. On the
// partitioned table too, where the UNKNOWN record moves to the far-future
// partition and back.
func TestAtMostOnceChargeHeldUnknown(t *testing.T) {
	t.Parallel()
	const key, amount = "order-amo-1", 5000
	forEachWorld(t, []string{"--idempotency=false"}, func(t *testing.T, w *world, db string, ins *inspector) {
		args := []string{"--lease", "2s", "--at-most-once-charge"}
		pd := w.paymentsd("paymentsd", db, append(args, "--crash-in-charge", "1")...)
		r, err := pay(context.Background(), pd.url(), merchant, key, body(amount))
		requireNoAnswer(t, r, err)
		requireCrashed(t, pd, "in-charge")
		var chargeID string
		for _, l := range pd.logLines() {
			if l["point"] == "in-charge" {
				chargeID, _ = l["charge"].(string)
			}
		}
		require.NotEmpty(t, chargeID, "the crash line names the provider's charge")
		require.EqualValues(t, 1, chargesOf(t, w.psp, merchant))

		pd.restart(w.paymentsdArgs(db, args...)...)
		var kinds []string
		for end := time.Now().Add(20 * time.Second); time.Now().Before(end); time.Sleep(500 * time.Millisecond) {
			a, err := pay(context.Background(), pd.url(), merchant, key, body(amount))
			require.NoError(t, err)
			require.Equal(t, http.StatusConflict, a.status, "only 409s: %s", a)
			kind := a.problemType()
			if kind == idem.ProblemTypeBase+"outcome-unknown" {
				require.Empty(t, a.header.Get("Retry-After"), "retrying does not help: %s", a)
			} else {
				require.Equal(t, idem.ProblemTypeBase+"request-in-flight", kind, "%s", a)
				require.NotContains(t, kinds, idem.ProblemTypeBase+"outcome-unknown", "never in flight again once unknown")
			}
			kinds = append(kinds, kind)
		}
		require.Equal(t, idem.ProblemTypeBase+"outcome-unknown", kinds[len(kinds)-1], "held once the dead owner's lease ran out: %v", kinds)
		require.EqualValues(t, 1, chargesOf(t, w.psp, merchant), "the provider was never called again")
		require.Equal(t, "UNKNOWN", ins.record(t, merchant, key).state)
		require.Empty(t, ins.ledger(t, merchant))
		require.Equal(t, 1, pd.waitLogged(t, 1, "idem: the record's outcome cannot be known; it is held UNKNOWN for an operator (idem resolve)"))
		require.Regexp(t, `(?m)^idem_unknown_records(\{[^}]*\})? 1$`, metrics(t, pd), "the gauge an alert reads")

		out := idemCLI(t, "--database-url", db, "resolve", "--scope", merchant, "--key", key, "--applied",
			"--result", fmt.Sprintf(`{"ID":%q}`, chargeID), "--by", "ops@example.com", "--why", "the provider's dashboard shows the charge", "--retention", "24h")
		require.Contains(t, out, "applied")
		done, err := pay(context.Background(), pd.url(), merchant, key, body(amount))
		require.NoError(t, err)
		require.Equal(t, http.StatusCreated, done.status, "%s", done)
		require.Equal(t, 1, pd.logged("charged", "charge", chargeID, "provider_called", false), "booked without calling the provider")
		ledger := ins.ledger(t, merchant)
		require.Len(t, ledger, 1)
		require.Equal(t, chargeID, ledger[0].chargeID)
		require.EqualValues(t, 1, chargesOf(t, w.psp, merchant))
		again, err := pay(context.Background(), pd.url(), merchant, key, body(amount))
		require.NoError(t, err)
		require.True(t, again.replayed())
		require.Equal(t, done.body, again.body)
	}, partitioned)
}

// metrics is p's GET /metrics.
func metrics(t *testing.T, p *proc) string {
	t.Helper()
	resp, err := http.Get(p.url() + "/metrics")
	require.NoError(t, err)
	defer func() { _ = resp.Body.Close() }()
	b, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	return string(b)
}
