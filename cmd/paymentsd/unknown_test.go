package main

import (
	"net/http"
	"net/http/httptest"
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
	store := newSQLiteStore(t)
	provider := &timingOutProvider{}
	h, err := newHandler(handlerConfig{Store: store, Provider: provider, Logger: discardLogger(), AtMostOnceCharge: true})
	require.NoError(t, err)
	srv := httptest.NewServer(h)
	t.Cleanup(srv.Close)
	s := &testServer{t: t, url: srv.URL, store: store}
	body := `{"amount":1000,"currency":"JPY","customer":"cus_42"}`
	require.Equal(t, http.StatusConflict, s.postJSON("acme", "k1", body).status)

	d := store.Idem()
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
