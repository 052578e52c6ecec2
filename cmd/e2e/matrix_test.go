package e2e

import (
	"context"
	"net/http"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// crashCase is one row of docs/crash-semantics.md: where the process dies,
// and what the books hold after the crash and after the retries.
type crashCase struct {
	point string // paymentsd's --crash-<point>
	// After the crash, before any retry:
	record         string // idem's record: "" (none), PROCESSING, SUCCEEDED
	chargesAfter   int64  // charges at the provider
	paymentsClaim  int    // payments in the ledger, --write-mode claim
	paymentsSepar  int    // payments in the ledger, --write-mode separate
	retryReplayed  bool   // the retry that succeeds is a replay
	finalToken     int64  // idem's fencing token at the end (2: one takeover)
	providerCalls  int    // charge requests the provider received (a takeover past the charge books its recorded step)
	replayFirstPay bool   // a first successful POST precedes the crashing one
}

var crashCases = []crashCase{
	{point: "before-claim", record: "", chargesAfter: 0, paymentsClaim: 0, paymentsSepar: 0, retryReplayed: false, finalToken: 1, providerCalls: 1},
	{point: "before-charge", record: "PROCESSING", chargesAfter: 0, paymentsClaim: 0, paymentsSepar: 0, retryReplayed: false, finalToken: 2, providerCalls: 1},
	{point: "in-charge", record: "PROCESSING", chargesAfter: 1, paymentsClaim: 0, paymentsSepar: 0, retryReplayed: false, finalToken: 2, providerCalls: 2},
	{point: "after-charge", record: "PROCESSING", chargesAfter: 1, paymentsClaim: 0, paymentsSepar: 0, retryReplayed: false, finalToken: 2, providerCalls: 1},
	{point: "after-write", record: "PROCESSING", chargesAfter: 1, paymentsClaim: 0, paymentsSepar: 1, retryReplayed: false, finalToken: 2, providerCalls: 1},
	{point: "after-commit", record: "SUCCEEDED", chargesAfter: 1, paymentsClaim: 1, paymentsSepar: 1, retryReplayed: true, finalToken: 1, providerCalls: 1},
	{point: "on-replay", record: "SUCCEEDED", chargesAfter: 1, paymentsClaim: 1, paymentsSepar: 1, retryReplayed: true, finalToken: 1, providerCalls: 1, replayFirstPay: true},
}

// TestCrashPoints kills paymentsd (SIGKILL, self-inflicted) at every crash
// point of a POST /v1/payments, in both write modes, restarts it without
// the fault, and retries until the payment succeeds. After the crash the
// client has no answer and the books hold what the table says; at the end,
// always: one charge at the provider, one payment, one ledger entry. Each
// subtest is a row of docs/crash-semantics.md.
func TestCrashPoints(t *testing.T) {
	t.Parallel()
	forEachTarget(t, func(t *testing.T, tgt target) {
		w := newWorld(t, tgt)
		for _, mode := range []string{"claim", "separate"} {
			for _, tc := range crashCases {
				t.Run(mode+"/"+tc.point, func(t *testing.T) {
					t.Parallel()
					testCrashPoint(t, w, mode, tc)
				})
			}
		}
	})
}

func testCrashPoint(t *testing.T, w *world, mode string, tc crashCase) {
	// Each row has its own merchant at the shared provider, and its own
	// paymentsd database.
	merchant := "m_" + mode + "_" + tc.point
	const (
		key    = "order-1"
		amount = 1500
	)
	db := w.tgt.newDB(t)
	ins := inspect(t, db)
	args := []string{"--lease", "1s", "--write-mode", mode}
	pd := startProc(t, "paymentsd", w.paymentsdBin,
		w.paymentsdArgs(db, append(args, "--crash-"+tc.point, "1")...), "PAYMENTSD_RELAY_SECRET="+relaySecret)
	// The world's t is the parent test; this process belongs to the subtest.
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()

	var first response
	if tc.replayFirstPay {
		var err error
		first, err = pay(ctx, pd.url(), merchant, key, body(amount))
		require.NoError(t, err)
		require.Equal(t, http.StatusCreated, first.status, "%s", first)
	}
	r, err := pay(ctx, pd.url(), merchant, key, body(amount))
	requireNoAnswer(t, r, err)
	requireCrashed(t, pd, tc.point)

	// The books right after the crash.
	rec := ins.record(t, merchant, key)
	require.Equal(t, tc.record != "", rec.found, "idem's record exists")
	if rec.found {
		require.Equal(t, tc.record, rec.state)
		require.EqualValues(t, 1, rec.fencingToken)
	}
	require.Equal(t, tc.chargesAfter, chargesOf(t, w.psp, merchant), "charges after the crash")
	wantPayments := tc.paymentsClaim
	if mode == "separate" {
		wantPayments = tc.paymentsSepar
	}
	after := ins.ledger(t, merchant)
	require.Len(t, after, wantPayments, "payments after the crash")

	pd.restart(w.paymentsdArgs(db, args...)...)
	attempts, err := payUntilDone(ctx, pd.url(), merchant, key, body(amount))
	require.NoError(t, err)
	for _, a := range attempts[:len(attempts)-1] {
		require.NoError(t, a.err)
		require.Equal(t, http.StatusConflict, a.resp.status, "only 409s while the dead owner's lease runs: %s", a.resp)
	}
	done := attempts[len(attempts)-1].resp
	require.Equal(t, tc.retryReplayed, done.replayed(), "%s", done)
	if tc.replayFirstPay {
		require.Equal(t, first.body, done.body)
	}

	row := w.requireOneCharge(pd, ins, merchant, amount)
	if len(after) == 1 {
		require.Equal(t, after[0].id, row.id, "the payment written before the crash is the one kept")
	}
	final := ins.record(t, merchant, key)
	require.Equal(t, record{found: true, state: "SUCCEEDED", fencingToken: tc.finalToken, attempts: int(tc.finalToken)}, final)
	reqs := pspRequests(t, w.psp, ins.relayKey(t, merchant, key), tc.providerCalls)
	require.Len(t, reqs, tc.providerCalls, "charge requests at the provider")
	for i, r := range reqs {
		require.Equal(t, pspRequest{201, i > 0}, r, "the first charges, the others are the provider's replays")
	}
}
