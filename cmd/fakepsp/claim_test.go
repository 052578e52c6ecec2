package main

import (
	"context"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/idemgo/idem"
	"github.com/idemgo/idem/idemdriver"
)

// slowClaims is a Store whose claim statement takes a while, and, like a
// database driver whose query is cancelled after the server committed it,
// reports the cancellation of its context even though the claim was made.
type slowClaims struct {
	Store
}

func (s slowClaims) Idem() idem.Store { return slowClaimDriver{s.Store.Idem()} }

type slowClaimDriver struct{ idem.Store }

func (d slowClaimDriver) Claim(ctx context.Context, p idemdriver.ClaimParams) (idemdriver.ClaimResult, error) {
	time.Sleep(300 * time.Millisecond)
	res, err := d.Store.Claim(context.WithoutCancel(ctx), p)
	if ctx.Err() != nil {
		return res, ctx.Err() // committed, yet reported cancelled
	}
	return res, err
}

// TestClientHangUpDuringClaim: the client hangs up while idem's claim
// statement runs. idem's claim does not hang on the client's context (it no longer needs
// the KeepClaiming wrapper the services once had), so the
// charge is made and recorded, and the retry gets it at once; without it,
// the key would stay claimed by nobody, answering 409 for a whole lease.
func TestClientHangUpDuringClaim(t *testing.T) {
	t.Parallel()
	h, err := newHandler(handlerConfig{Store: slowClaims{newSQLiteStore(t)}, Logger: slog.New(slog.DiscardHandler)})
	require.NoError(t, err)
	srv := httptest.NewServer(h)
	t.Cleanup(srv.Close)
	p := &testPSP{t: t, url: srv.URL}
	headers := []string{"Authorization", "Bearer sk_test_acme", "Idempotency-Key", "hang-1", "Content-Type", "application/json"}

	_, err = p.do(&http.Client{Timeout: 100 * time.Millisecond}, http.MethodPost, "/v1/charges", chargeBody, headers...)
	require.Error(t, err, "the client gave up during the claim")
	require.Eventually(t, func() bool { return p.stats().Charges == 1 }, 10*time.Second, 20*time.Millisecond,
		"the claim went on, and so did the charge")

	r, err := p.do(http.DefaultClient, http.MethodPost, "/v1/charges", chargeBody, headers...)
	require.NoError(t, err)
	require.Equal(t, http.StatusCreated, r.status, "not a 409 for the whole lease: %s", r.body)
	require.Equal(t, "true", r.header.Get(idem.HeaderReplayed))
	require.EqualValues(t, 1, p.stats().Charges)
}
