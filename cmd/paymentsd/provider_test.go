package main

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/idemgo/idem"
	"github.com/idemgo/idem/idemdriver"
)

// pspStub is an httptest payment provider whose answers the test scripts.
type pspStub struct {
	mu       sync.Mutex
	requests []*http.Request
	bodies   []map[string]any
	answer   func(w http.ResponseWriter, r *http.Request, n int)
}

func startPSP(t *testing.T, answer func(w http.ResponseWriter, r *http.Request, n int)) (*pspStub, string) {
	t.Helper()
	s := &pspStub{answer: answer}
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		var body map[string]any
		_ = json.Unmarshal(b, &body)
		s.mu.Lock()
		s.requests = append(s.requests, r)
		s.bodies = append(s.bodies, body)
		n := len(s.requests)
		s.mu.Unlock()
		s.answer(w, r, n)
	}))
	t.Cleanup(srv.Close)
	return s, srv.URL
}

func created(w http.ResponseWriter, id string, replayed bool) {
	w.Header().Set("Content-Type", "application/json")
	if replayed {
		w.Header().Set(idem.HeaderReplayed, "true")
	}
	w.WriteHeader(http.StatusCreated)
	_, _ = w.Write([]byte(`{"id":"` + id + `","amount":1000}`))
}

func TestHTTPProviderCharge(t *testing.T) {
	t.Parallel()
	psp, url := startPSP(t, func(w http.ResponseWriter, r *http.Request, n int) { created(w, "ch_1", n > 1) })
	p := NewHTTPProvider(url+"/", time.Second)
	req := ChargeRequest{IdempotencyKey: "idr1_abc", Merchant: "acme", Amount: 1000, Currency: "JPY", Customer: "cus_42", Description: "Order"}

	ch, err := p.Charge(context.Background(), req)
	require.NoError(t, err)
	require.Equal(t, Charge{ID: "ch_1"}, ch)
	ch, err = p.Charge(context.Background(), req)
	require.NoError(t, err)
	require.Equal(t, Charge{ID: "ch_1", Replayed: true}, ch)

	r := psp.requests[0]
	require.Equal(t, "/v1/charges", r.URL.Path)
	require.Equal(t, "Bearer sk_test_acme", r.Header.Get("Authorization"))
	require.Equal(t, "idr1_abc", r.Header.Get(idem.HeaderKey))
	require.Equal(t, "application/json", r.Header.Get("Content-Type"))
	require.Equal(t, map[string]any{"amount": 1000.0, "currency": "JPY", "customer": "cus_42", "description": "Order"}, psp.bodies[0])

	// No key, no charge: it could not be retried safely.
	_, err = p.Charge(context.Background(), ChargeRequest{Merchant: "acme", Amount: 1, Currency: "JPY", Customer: "c"})
	require.Error(t, err)
	require.Len(t, psp.requests, 2)
}

func TestHTTPProviderErrors(t *testing.T) {
	t.Parallel()
	release := make(chan struct{})
	_, url := startPSP(t, func(w http.ResponseWriter, r *http.Request, n int) {
		switch r.Header.Get(idem.HeaderKey) {
		case "busy":
			w.Header().Set("Retry-After", "3")
			idem.ProblemFor(idem.ErrInFlight, "in flight").Write(w)
		case "down":
			http.Error(w, "down", http.StatusServiceUnavailable)
		case "garbage":
			w.WriteHeader(http.StatusCreated)
			_, _ = w.Write([]byte(`{"id":42}`))
		case "hang":
			<-release
		}
	})
	t.Cleanup(func() { close(release) }) // before the server's Close, which waits for handlers
	p := NewHTTPProvider(url, 300*time.Millisecond)
	charge := func(key string) error {
		_, err := p.Charge(context.Background(), ChargeRequest{IdempotencyKey: key, Merchant: "acme", Amount: 1, Currency: "JPY", Customer: "c"})
		return err
	}

	err := charge("busy")
	var pe *ProviderError
	require.ErrorAs(t, err, &pe)
	require.ErrorIs(t, err, ErrProviderUnavailable)
	require.Equal(t, http.StatusConflict, pe.Status)
	require.Equal(t, idem.ProblemTypeBase+"request-in-flight", pe.Type)
	require.Equal(t, 3*time.Second, pe.RetryAfter)

	require.ErrorAs(t, charge("down"), &pe)
	require.Equal(t, http.StatusServiceUnavailable, pe.Status)
	require.ErrorIs(t, charge("garbage"), ErrProviderUnavailable)

	err = charge("hang")
	require.ErrorIs(t, err, ErrProviderTimeout)
	require.NotErrorIs(t, err, ErrProviderUnavailable)

	_, err = NewHTTPProvider("http://127.0.0.1:1", time.Second).Charge(context.Background(),
		ChargeRequest{IdempotencyKey: "k", Merchant: "acme", Amount: 1, Currency: "JPY", Customer: "c"})
	require.ErrorIs(t, err, ErrProviderUnavailable, "connection refused: the provider was not reached")
}

// TestProviderTimeoutIsRetried: the provider charges but answers too late. The
// payment answers 504 provider-timeout, idem records FAILED, and the retry
// asks again with the same relayed key; the provider's replay of its charge
// is recorded once.
func TestProviderTimeoutIsRetried(t *testing.T) {
	t.Parallel()
	release := make(chan struct{})
	var charges sync.Map // relay key -> charge id
	var made atomic.Int32
	psp, url := startPSP(t, func(w http.ResponseWriter, r *http.Request, n int) {
		id, loaded := charges.LoadOrStore(r.Header.Get(idem.HeaderKey), "ch_"+r.Header.Get(idem.HeaderKey)[5:15])
		if !loaded {
			made.Add(1)
			<-release // charged, never answers in time
			return
		}
		created(w, id.(string), true)
	})
	t.Cleanup(func() { close(release) }) // before the server's Close, which waits for handlers
	store := newSQLiteStore(t)
	h, err := newHandler(handlerConfig{Store: store, Provider: NewHTTPProvider(url, 300*time.Millisecond),
		Logger: discardLogger(), RelaySecret: []byte("s3cret")})
	require.NoError(t, err)
	srv := httptest.NewServer(h)
	t.Cleanup(srv.Close)
	s := &testServer{t: t, url: srv.URL, store: store}

	r := s.postJSON("acme", "t-1", paymentBody)
	require.Equal(t, http.StatusGatewayTimeout, r.status, "body: %s", r.body)
	require.Equal(t, ProblemTypeBase+problemProviderTimeout, r.problem(t)["type"])
	require.Equal(t, "1", r.header.Get("Retry-After"))
	require.EqualValues(t, 0, s.balance("acme").Payments)

	r = s.postJSON("acme", "t-1", paymentBody)
	require.Equal(t, http.StatusCreated, r.status, "body: %s", r.body)
	require.Empty(t, r.header.Get(idem.HeaderReplayed), "504 was recorded FAILED: the handler ran again")
	require.EqualValues(t, 1, s.balance("acme").Payments)
	require.EqualValues(t, 1, made.Load())

	require.Len(t, psp.requests, 2)
	rec, err := store.Idem().Get(t.Context(), idemdriver.GetParams{Scope: "acme", Key: "t-1"})
	require.NoError(t, err)
	want := idem.DeriveKey([]byte("s3cret"), "acme", "t-1", rec.CreatedAt, RelayStep)
	for _, req := range psp.requests {
		require.Equal(t, want, req.Header.Get(idem.HeaderKey))
	}
}

// TestProviderBusyIsRetried: the provider answers 409 (its own execution of
// the key is in flight): 502 with Retry-After 1 (not the provider's lease
// left), retryable.
func TestProviderBusyIsRetried(t *testing.T) {
	t.Parallel()
	_, url := startPSP(t, func(w http.ResponseWriter, r *http.Request, n int) {
		if n == 1 {
			pr := idem.ProblemFor(idem.ErrInFlight, "in flight")
			pr.RetryAfter = 2 * time.Second
			pr.Write(w)
			return
		}
		created(w, "ch_busy", true)
	})
	s := startServer(t, newSQLiteStore(t), NewHTTPProvider(url, time.Second))
	r := s.postJSON("acme", "b-1", paymentBody)
	require.Equal(t, http.StatusBadGateway, r.status)
	require.Equal(t, ProblemTypeBase+problemProviderError, r.problem(t)["type"])
	require.Equal(t, "1", r.header.Get("Retry-After"))
	require.Equal(t, http.StatusCreated, s.postJSON("acme", "b-1", paymentBody).status)
	require.EqualValues(t, 1, s.balance("acme").Payments)
}

func TestChargeRecordedOnce(t *testing.T) {
	t.Parallel()
	inEachWriteMode(t, func(t *testing.T, mode WriteMode) {
		onEachDatabase(t, func(t *testing.T, store Store) { testChargeRecordedOnce(t, store, mode) })
	})
}

// testChargeRecordedOnce: two executions (two keys) that get the same charge
// from the provider book one payment: the second finds the first's row by
// the provider's charge id and answers with it.
func testChargeRecordedOnce(t *testing.T, store Store, mode WriteMode) {
	provider := &sameCharge{}
	h, err := newHandler(handlerConfig{Store: store, Provider: provider, Logger: discardLogger(), WriteMode: mode})
	require.NoError(t, err)
	srv := httptest.NewServer(h)
	t.Cleanup(srv.Close)
	s := &testServer{t: t, url: srv.URL, store: store}

	first := s.postJSON("acme", "one-1", paymentBody)
	require.Equal(t, http.StatusCreated, first.status, "body: %s", first.body)
	second := s.postJSON("acme", "one-2", paymentBody)
	require.Equal(t, http.StatusCreated, second.status, "body: %s", second.body)
	require.Equal(t, first.body, second.body, "the same payment, read back")
	require.EqualValues(t, 1, s.balance("acme").Payments)

	// The same charge for another payment is refused, not booked.
	r := s.postJSON("acme", "one-3", `{"amount":5,"currency":"USD","customer":"x"}`)
	require.Equal(t, http.StatusInternalServerError, r.status, "body: %s", r.body)
	require.EqualValues(t, 1, s.balance("acme").Payments)
}

// sameCharge is a provider that answers every charge with the same id.
type sameCharge struct{}

func (sameCharge) Charge(context.Context, ChargeRequest) (Charge, error) {
	return Charge{ID: "ch_same"}, nil
}

func TestFakeProviderReplays(t *testing.T) {
	t.Parallel()
	p := NewFakeProvider(0)
	a, err := p.Charge(context.Background(), ChargeRequest{IdempotencyKey: "k"})
	require.NoError(t, err)
	b, err := p.Charge(context.Background(), ChargeRequest{IdempotencyKey: "k"})
	require.NoError(t, err)
	require.False(t, a.Replayed)
	require.True(t, b.Replayed)
	require.Equal(t, a.ID, b.ID)
	require.Equal(t, 1, p.Charges())
	require.Equal(t, 2, p.Calls())
	require.False(t, errors.Is(ErrProviderTimeout, ErrProviderUnavailable))
}
