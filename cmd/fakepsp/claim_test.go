package main

import (
	"log/slog"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/idemgo/idem"
	"github.com/idemgo/idem/cmd/internal/demotest"
)

// slowClaims is a Store whose claims take 300 ms and report the
// cancellation of their context although made (demotest.SlowClaims).
type slowClaims struct{ Store }

func (s slowClaims) Idem() idem.Store {
	return demotest.SlowClaims(s.Store.Idem(), 300*time.Millisecond)
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
