package main

import (
	"context"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/idemgo/idem"
	"github.com/idemgo/idem/idemdriver"
)

// slowClaims is a Store whose claim statement takes a while and, like a
// driver whose query is cancelled after the server committed it, reports
// the cancellation of its context even though the claim was made.
type slowClaims struct{ Store }

func (s slowClaims) Idem() idem.Store { return slowClaimDriver{s.Store.Idem()} }

type slowClaimDriver struct{ idem.Store }

func (d slowClaimDriver) Claim(ctx context.Context, p idemdriver.ClaimParams) (idemdriver.ClaimResult, error) {
	time.Sleep(300 * time.Millisecond)
	res, err := d.Store.Claim(context.WithoutCancel(ctx), p)
	if ctx.Err() != nil {
		return res, ctx.Err()
	}
	return res, err
}

// TestClientHangUpDuringClaim: the client hangs up while idem's claim
// statement runs. idem's claim does not hang on the client's context (it no longer needs
// the KeepClaiming wrapper the services once had), so the
// payment is made, and the retry gets it at once instead of 409 for a whole
// lease from a key claimed by nobody.
func TestClientHangUpDuringClaim(t *testing.T) {
	t.Parallel()
	store := slowClaims{newSQLiteStore(t)}
	provider := NewFakeProvider(0)
	h, err := newHandler(handlerConfig{Store: store, Provider: provider, Logger: discardLogger()})
	require.NoError(t, err)
	srv := httptest.NewServer(h)
	t.Cleanup(srv.Close)
	s := &testServer{t: t, url: srv.URL, store: store}

	req, err := http.NewRequest(http.MethodPost, s.url+"/v1/payments", strings.NewReader(paymentBody))
	require.NoError(t, err)
	req.Header.Set("Authorization", auth("acme"))
	req.Header.Set("Idempotency-Key", "hang-1")
	req.Header.Set("Content-Type", "application/json")
	_, err = (&http.Client{Timeout: 100 * time.Millisecond}).Do(req)
	require.Error(t, err, "the client gave up during the claim")
	require.Eventually(t, func() bool { return s.balance("acme").Payments == 1 }, 10*time.Second, 20*time.Millisecond)

	r := s.postJSON("acme", "hang-1", paymentBody)
	require.Equal(t, http.StatusCreated, r.status, "body: %s", r.body)
	require.Equal(t, "true", r.header.Get(idem.HeaderReplayed))
	require.Equal(t, 1, provider.Calls())
}
