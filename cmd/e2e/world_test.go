package e2e

import (
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/idemgo/idem"
)

// relaySecret is paymentsd's --relay-secret in every test, passed the way
// the README recommends: in the environment.
const relaySecret = "e2e-relay-secret"

// relayStep is paymentsd's step name for the charge (paymentsd.RelayStep).
const relayStep = "charge"

// relayKey is the key paymentsd must relay to the provider for (merchant,
// key): the core's derivation, computed independently of paymentsd from the
// record's created_at as the database holds it.
func (i *inspector) relayKey(t *testing.T, merchant, key string) string {
	t.Helper()
	return idem.DeriveKey([]byte(relaySecret), merchant, key, i.createdAt(t, merchant, key), relayStep)
}

// world is one provider (fakepsp, on its own database) and the paymentsd
// processes that charge through it.
type world struct {
	t            *testing.T
	tgt          target
	psp          *proc
	paymentsdBin string
}

// newWorld starts fakepsp on a fresh database of tgt's kind with pspArgs.
func newWorld(t *testing.T, tgt target, pspArgs ...string) *world {
	t.Helper()
	pd, fp := binaries(t)
	psp := startProc(t, "fakepsp", fp, append([]string{"--database-url", tgt.newProviderDB(t)}, pspArgs...))
	return &world{t: t, tgt: tgt, psp: psp, paymentsdBin: pd}
}

// paymentsdArgs are the arguments of a paymentsd on databaseURL charging
// through the world's provider, without its completer, followed by extra.
func (w *world) paymentsdArgs(databaseURL string, extra ...string) []string {
	// The completer is off unless a test turns it on (extra's --completer
	// comes later and wins): the tests of a client's retries must not race
	// with it.
	return append([]string{"--database-url", databaseURL, "--psp-url", w.psp.url(), "--completer=false"}, extra...)
}

// paymentsd starts a paymentsd (see paymentsdArgs).
func (w *world) paymentsd(name, databaseURL string, extra ...string) *proc {
	w.t.Helper()
	return startProc(w.t, name, w.paymentsdBin, w.paymentsdArgs(databaseURL, extra...),
		"PAYMENTSD_RELAY_SECRET="+relaySecret)
}

// requireCrashed checks that p's current generation died of SIGKILL after
// logging the injected crash at point.
func requireCrashed(t *testing.T, p *proc, point string) {
	t.Helper()
	state := p.waitExit(30 * time.Second)
	require.True(t, killedBySIGKILL(state), "%s: %v", p.Name, state)
	require.Equal(t, 1, p.logged("fault injected: crashing now (SIGKILL)", "point", point), "the crash line of %s", point)
}

// requireNoAnswer checks that a request got no HTTP answer at all (the
// server died under it).
func requireNoAnswer(t *testing.T, r response, err error) {
	t.Helper()
	require.Error(t, err, "expected no answer, got %s", r)
	require.False(t, strings.Contains(err.Error(), "Client.Timeout"), "the server died; it did not hang: %v", err)
}

// requireOneCharge checks the books of one logical payment of amount:
// the provider made one charge, paymentsd holds one payment with one ledger
// entry, recording that charge, and its API says the same.
func (w *world) requireOneCharge(pd *proc, ins *inspector, merchant string, amount int64) ledgerRow {
	t := w.t
	t.Helper()
	st := stats(t, w.psp)
	require.EqualValues(t, 1, st.Merchants[merchant].Charges, "charges at the provider")
	require.Equal(t, map[string]int64{"JPY": amount}, st.Merchants[merchant].Amount)

	rows := ins.ledger(t, merchant)
	require.Len(t, rows, 1, "payments in the database")
	require.Equal(t, 1, rows[0].entries, "ledger entries of the payment")
	require.Equal(t, amount, rows[0].amount)
	require.Equal(t, 1, ins.ledgerEntries(t, merchant))
	var ch struct {
		ID     string `json:"id"`
		Amount int64  `json:"amount"`
	}
	getJSON(t, w.psp.url(), merchant, "/v1/charges/"+rows[0].chargeID, &ch)
	require.Equal(t, amount, ch.Amount, "the payment records the provider's charge")

	var b balance
	getJSON(t, pd.url(), merchant, "/v1/balance", &b)
	require.Equal(t, balance{Merchant: merchant, Payments: 1, Totals: map[string]int64{"JPY": amount}}, b)
	var l paymentList
	getJSON(t, pd.url(), merchant, "/v1/payments?limit=100", &l)
	require.Len(t, l.Data, 1)
	require.Equal(t, rows[0].id, l.Data[0].ID)
	return rows[0]
}
