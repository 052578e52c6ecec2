package main

import (
	"context"
	"net/http"
	"net/http/httptest"
	"sync/atomic"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/idemgo/idem"
	"github.com/idemgo/idem/idemdriver"
)

// An at-most-once charge whose provider timed out is held UNKNOWN; an
// operator's resolution that records a result without a charge id (a
// mistyped --result) is never booked: 500, no payment. Regression: such a
// result was booked with an empty provider_charge_id, and a second payment
// of the same amount was answered with the first.
func TestRecordedChargeWithoutIDIsNotBooked(t *testing.T) {
	t.Parallel()
	provider := &timingOutProvider{}
	s := atMostOnceServer(t, provider)
	body := `{"amount":1000,"currency":"JPY","customer":"cus_42"}`
	require.Equal(t, http.StatusConflict, s.postJSON("acme", "k1", body).status)

	d := s.store.Idem()
	key := "k1"
	rec, err := d.Get(t.Context(), idemdriver.GetParams{Scope: "acme", Key: key})
	require.NoError(t, err)
	require.Equal(t, idemdriver.StateUnknown, rec.State)
	result, err := idem.EncodeStepResult(map[string]string{"charge": "ch_typo"}) // not a Charge's field
	require.NoError(t, err)
	require.NoError(t, d.(idemdriver.Stepper).ResolveStep(t.Context(), idemdriver.ResolveStepParams{
		StepParams: idemdriver.StepParams{Scope: "acme", Key: key, CreatedAt: rec.CreatedAt, FencingToken: rec.FencingToken, Name: RelayStep},
		Applied:    true, Result: result, By: "ops", Why: "test", Retention: idem.DefaultRetention}))

	r := s.postJSON("acme", "k1", body)
	require.Equal(t, http.StatusInternalServerError, r.status, "%s", r.body)
	require.Zero(t, s.balance("acme").Payments, "nothing booked")
	require.EqualValues(t, 1, provider.calls.Load())
}

// answeringProvider answers every charge with its status and body, as a
// provider, or a gateway in front of it, does.
type answeringProvider struct {
	calls atomic.Int32
	err   *ProviderError
}

func (p *answeringProvider) Charge(context.Context, ChargeRequest) (Charge, error) {
	p.calls.Add(1)
	return Charge{}, p.err
}

// With the charge declared at-most-once, only an answer that says nothing
// was charged clears the step's start (the retry charges again): a
// refusal, or the provider's own 503 problem. A gateway's 502, which
// carries no problem of the provider's (its upstream may have charged and
// the answer been cut), holds the record UNKNOWN: the provider is never
// called again. Regression: every non-2xx answer cleared the start, and a
// fresh user's gateway got two charges for one payment.
func TestAtMostOnceChargeClearedOnlyWhenNotCharged(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name    string
		err     *ProviderError
		calls   int32
		unknown bool
	}{
		{"gateway 502", &ProviderError{Status: http.StatusBadGateway}, 1, true},
		{"provider 503", &ProviderError{Status: http.StatusServiceUnavailable, Type: "unavailable", Detail: "nothing was charged"}, 2, false},
		{"declined 402", &ProviderError{Status: http.StatusPaymentRequired, Type: "card-declined"}, 2, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			provider := &answeringProvider{err: tc.err}
			s := atMostOnceServer(t, provider)
			body := `{"amount":1000,"currency":"JPY","customer":"cus_42"}`
			first := s.postJSON("acme", "k1", body)
			s.postJSON("acme", "k1", body)
			require.Equal(t, tc.calls, provider.calls.Load(), "provider calls")
			rec, err := s.store.Idem().Get(t.Context(), idemdriver.GetParams{Scope: "acme", Key: "k1"})
			require.NoError(t, err)
			require.Equal(t, tc.unknown, rec.State == idemdriver.StateUnknown, "state %s; first answer %d %s", rec.State, first.status, first.body)
		})
	}
}

// atMostOnceServer serves paymentsd's API with the charge declared
// at-most-once, on a fresh SQLite store, through provider.
func atMostOnceServer(t *testing.T, provider Provider) *testServer {
	t.Helper()
	store := newSQLiteStore(t)
	h, err := newHandler(handlerConfig{Store: store, Provider: provider, Logger: discardLogger(), AtMostOnceCharge: true})
	require.NoError(t, err)
	srv := httptest.NewServer(h)
	t.Cleanup(srv.Close)
	return &testServer{t: t, url: srv.URL, store: store}
}
