package main

import (
	"net/http"
	"net/http/httptest"
	"strings"
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
