package main

import (
	"context"
	"errors"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"github.com/stripe/stripe-go/v82"

	"github.com/idemgo/idem"
)

// stripeServer is paymentsd on httptest, counting the requests that reach
// POST /v1/payment_intents, with a stripe-go client pointed at it.
type stripeServer struct {
	*testServer
	provider *FakeProvider
	posts    atomic.Int64
}

// startStripeServer serves paymentsd on store, with a fake provider taking
// latency per charge.
func startStripeServer(t *testing.T, store Store, latency time.Duration) *stripeServer {
	t.Helper()
	provider := NewFakeProvider(latency)
	h, err := newHandler(handlerConfig{Store: store, Provider: provider, Logger: discardLogger()})
	require.NoError(t, err)
	s := &stripeServer{provider: provider}
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method == http.MethodPost && r.URL.Path == "/v1/payment_intents" {
			s.posts.Add(1)
		}
		h.ServeHTTP(w, r)
	}))
	t.Cleanup(srv.Close)
	s.testServer = &testServer{t: t, url: srv.URL, store: store, provider: provider}
	return s
}

// client is stripe-go v82 itself, its API backend pointed at the server,
// authenticating as merchant, with at most retries automatic retries.
func (s *stripeServer) client(merchant string, retries int64) *stripe.Client {
	backend := stripe.GetBackendWithConfig(stripe.APIBackend, &stripe.BackendConfig{
		URL:               stripe.String(s.url),
		MaxNetworkRetries: stripe.Int64(retries),
		EnableTelemetry:   stripe.Bool(false),
		LeveledLogger:     &stripe.LeveledLogger{Level: stripe.LevelNull},
	})
	return stripe.NewClient("sk_test_"+merchant, stripe.WithBackends(&stripe.Backends{
		API: backend, Connect: backend, Uploads: backend, MeterEvents: backend,
	}))
}

func piParams(key string, amount int64) *stripe.PaymentIntentCreateParams {
	p := &stripe.PaymentIntentCreateParams{
		Amount:   stripe.Int64(amount),
		Currency: stripe.String(string(stripe.CurrencyEUR)),
		Customer: stripe.String("cus_42"),
	}
	p.SetIdempotencyKey(key)
	p.AddMetadata("order_id", "6735")
	return p
}

// TestStripeGoConcurrentCallsOneKey: 20 stripe-go calls at once with one
// Idempotency-Key all succeed with the same PaymentIntent, one charge and
// one payment row; the 19 that meet the first one in flight are answered
// 429 lock_timeout, which stripe-go retries until the replay.
func TestStripeGoConcurrentCallsOneKey(t *testing.T) {
	t.Parallel()
	for name, open := range map[string]func(*testing.T) Store{"sqlite": newSQLiteStore, "postgres": newPGTestStore} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			s := startStripeServer(t, open(t), 300*time.Millisecond)
			// stripe-go sleeps 0.5, 1, 2.5, 5, 5, ... s between retries.
			sc := s.client("acme", 8)
			const calls = 20
			var (
				wg   sync.WaitGroup
				pis  [calls]*stripe.PaymentIntent
				errs [calls]error
			)
			for i := range calls {
				wg.Add(1)
				go func() {
					defer wg.Done()
					pis[i], errs[i] = sc.V1PaymentIntents.Create(context.Background(), piParams("order-6735", 1999))
				}()
			}
			wg.Wait()
			for i := range calls {
				require.NoError(t, errs[i], "call %d", i)
				pi := pis[i]
				assert.Equal(t, pis[0].ID, pi.ID, "call %d", i)
				assert.True(t, strings.HasPrefix(pi.ID, "pi_"), pi.ID)
				assert.Equal(t, int64(1999), pi.Amount)
				assert.Equal(t, int64(1999), pi.AmountReceived)
				assert.Equal(t, stripe.CurrencyEUR, pi.Currency)
				assert.Equal(t, stripe.PaymentIntentStatusSucceeded, pi.Status)
				require.NotNil(t, pi.Customer)
				assert.Equal(t, "cus_42", pi.Customer.ID)
				assert.Equal(t, map[string]string{"order_id": "6735"}, pi.Metadata)
				assert.Equal(t, "order-6735", pi.LastResponse.IdempotencyKey, "call %d", i)
				_, err := http.ParseTime(pi.LastResponse.Header.Get(idem.HeaderKeyExpires))
				assert.NoError(t, err, "call %d: %s", i, idem.HeaderKeyExpires)
			}
			assert.Equal(t, 1, s.provider.Charges(), "charges")
			assert.Equal(t, int64(1), s.balance("acme").Payments, "payment rows")
			// Every call was answered by the first execution's replay, some
			// after 429s: more requests than calls shows the retries ran.
			assert.Greater(t, s.posts.Load(), int64(calls), "stripe-go retried no 429 lock_timeout")
		})
	}
}

// TestStripeGoKeyReusedIsATypedErrorNotRetried: the key sent again with
// another amount is Stripe's 400 idempotency_error, which stripe-go gives
// as a typed *stripe.Error and does not retry (one request reaches the
// server), although it may retry up to 3 times.
func TestStripeGoKeyReusedIsATypedErrorNotRetried(t *testing.T) {
	t.Parallel()
	s := startStripeServer(t, newSQLiteStore(t), 0)
	sc := s.client("acme", 3)
	first, err := sc.V1PaymentIntents.Create(context.Background(), piParams("order-1", 1000))
	require.NoError(t, err)
	require.Equal(t, int64(1), s.posts.Load())

	_, err = sc.V1PaymentIntents.Create(context.Background(), piParams("order-1", 2000))
	var se *stripe.Error
	require.ErrorAs(t, err, &se)
	assert.Equal(t, stripe.ErrorTypeIdempotency, se.Type)
	assert.Equal(t, http.StatusBadRequest, se.HTTPStatusCode)
	assert.NotEmpty(t, se.Msg)
	var typed *stripe.IdempotencyError
	assert.True(t, errors.As(se.Err, &typed), "se.Err is %T", se.Err)
	assert.Equal(t, "order-1", se.LastResponse.IdempotencyKey)
	assert.Equal(t, int64(2), s.posts.Load(), "stripe-go retried the idempotency error")

	// The key still replays its first PaymentIntent.
	again, err := sc.V1PaymentIntents.Create(context.Background(), piParams("order-1", 1000))
	require.NoError(t, err)
	assert.Equal(t, first.ID, again.ID)
	assert.Equal(t, "true", again.LastResponse.Header.Get("Idempotent-Replayed"))
	assert.Equal(t, 1, s.provider.Charges())
}

// TestStripeGoInvalidRequestNotRetriedNorRecorded: a validation failure is
// Stripe's invalid_request_error naming the parameter, not retried, and not
// recorded under the key (as Stripe does): the corrected request with the
// same key runs.
func TestStripeGoInvalidRequestNotRetriedNorRecorded(t *testing.T) {
	t.Parallel()
	s := startStripeServer(t, newSQLiteStore(t), 0)
	sc := s.client("acme", 3)
	p := piParams("order-2", 1000)
	p.Currency = stripe.String("xyz")
	_, err := sc.V1PaymentIntents.Create(context.Background(), p)
	var se *stripe.Error
	require.ErrorAs(t, err, &se)
	assert.Equal(t, stripe.ErrorTypeInvalidRequest, se.Type)
	assert.Equal(t, "currency", se.Param)
	assert.Equal(t, http.StatusBadRequest, se.HTTPStatusCode)
	assert.Equal(t, int64(1), s.posts.Load(), "stripe-go retried the invalid request")

	p.Amount = nil
	p.Currency = stripe.String("eur")
	_, err = sc.V1PaymentIntents.Create(context.Background(), p)
	require.ErrorAs(t, err, &se)
	assert.Equal(t, stripe.ErrorCodeParameterMissing, se.Code)
	assert.Equal(t, "amount", se.Param)

	pi, err := sc.V1PaymentIntents.Create(context.Background(), piParams("order-2", 1000))
	require.NoError(t, err, "the key kept the validation failure")
	assert.Equal(t, stripe.PaymentIntentStatusSucceeded, pi.Status)
	assert.Equal(t, 1, s.provider.Charges())
}

// gatedProvider holds every charge until gate is closed.
type gatedProvider struct {
	*FakeProvider
	entered chan struct{}
	gate    chan struct{}
}

func (p gatedProvider) Charge(ctx context.Context, req ChargeRequest) (Charge, error) {
	p.entered <- struct{}{}
	<-p.gate
	return p.FakeProvider.Charge(ctx, req)
}

// TestStripeInFlightIsLockTimeout: a request meeting its key in flight gets
// Stripe's 429 lock_timeout with Stripe-Should-Retry: true and idem's
// Retry-After, in Stripe's error body; once the first is done, the same
// request is its replay.
func TestStripeInFlightIsLockTimeout(t *testing.T) {
	t.Parallel()
	provider := gatedProvider{NewFakeProvider(0), make(chan struct{}, 1), make(chan struct{})}
	h, err := newHandler(handlerConfig{Store: newSQLiteStore(t), Provider: provider, Logger: discardLogger()})
	require.NoError(t, err)
	srv := httptest.NewServer(h)
	t.Cleanup(srv.Close)
	s := &testServer{t: t, url: srv.URL}
	post := func() response {
		return s.do(http.MethodPost, "/v1/payment_intents", url.Values{"amount": {"1000"}, "currency": {"eur"}, "customer": {"c"}}.Encode(),
			"Authorization", auth("acme"), "Idempotency-Key", "order-3", "Content-Type", mediaForm)
	}
	first := make(chan response, 1)
	go func() { first <- post() }()
	<-provider.entered // the first request's handler runs, holding the key

	r := post()
	require.Equal(t, http.StatusTooManyRequests, r.status, "body: %s", r.body)
	var body struct{ Error stripeErrorBody }
	r.json(t, &body)
	assert.Equal(t, "invalid_request_error", body.Error.Type)
	assert.Equal(t, "lock_timeout", body.Error.Code)
	assert.NotEmpty(t, body.Error.Message)
	assert.Equal(t, "true", r.header.Get("Stripe-Should-Retry"))
	assert.NotEmpty(t, r.header.Get("Retry-After"))
	assert.Equal(t, "order-3", r.header.Get("Idempotency-Key"))

	close(provider.gate)
	r1 := <-first
	require.Equal(t, http.StatusOK, r1.status, "body: %s", r1.body)
	r2 := post()
	require.Equal(t, http.StatusOK, r2.status, "body: %s", r2.body)
	assert.Equal(t, "true", r2.header.Get(idem.HeaderReplayed))
	assert.Equal(t, string(r1.body), string(r2.body))
	assert.Equal(t, 1, provider.Charges())
}

// TestStripeAnswerForIdemProblems: every kind of idem's problems maps to a
// Stripe error with the documented status, type and Stripe-Should-Retry.
func TestStripeAnswerForIdemProblems(t *testing.T) {
	for _, tc := range []struct {
		kind   error
		status int
		typ    string
		retry  bool
	}{
		{idem.ErrInFlight, 429, "invalid_request_error", true},
		{idem.ErrLeaseLost, 429, "invalid_request_error", true},
		{idem.ErrKeyReused, 400, "idempotency_error", false},
		{idem.ErrOutcomeUnknown, 409, "api_error", false},
		{idem.ErrMissingKey, 400, "invalid_request_error", false},
		{idem.ErrInvalidKey, 400, "invalid_request_error", false},
		{idem.ErrMissingScope, 401, "invalid_request_error", false},
		{idem.ErrRequestTooLarge, 413, "invalid_request_error", false},
		{idem.ErrResponseNotStored, 410, "invalid_request_error", false},
		{idem.ErrStoreUnavailable, 503, "api_error", true},
		{idem.ErrTxAborted, 500, "api_error", true},
		{idem.ErrResponseMissing, 500, "api_error", false},
		{idem.ErrScopeUnstorable, 500, "api_error", false},
	} {
		p := idem.ProblemFor(tc.kind, "why")
		p.RetryAfter = 1500 * time.Millisecond
		a := stripeAnswerFor(p)
		assert.Equal(t, tc.status, a.status, "%v", tc.kind)
		assert.Equal(t, tc.typ, a.body.Type, "%v", tc.kind)
		assert.Equal(t, tc.retry, a.shouldRetry, "%v", tc.kind)
		assert.Equal(t, "why", a.body.Message, "%v", tc.kind)
		if tc.retry && tc.kind != idem.ErrTxAborted {
			assert.Equal(t, "2", a.retryAfter, "%v: Retry-After rounded up", tc.kind)
		} else {
			assert.Empty(t, a.retryAfter, "%v", tc.kind)
		}
	}
}

// TestStripeFormValidation: the body's problems are Stripe's
// invalid_request_error naming the parameter; nothing is charged.
func TestStripeFormValidation(t *testing.T) {
	t.Parallel()
	s := startStripeServer(t, newSQLiteStore(t), 0)
	long := strings.Repeat("k", MaxMetadataKeyLength+1)
	for i, tc := range []struct {
		contentType, body, code, param string
	}{
		{mediaJSON, `{"amount":1000,"currency":"eur","customer":"c"}`, "", ""},
		{mediaForm, "currency=eur&customer=c", "parameter_missing", "amount"},
		{mediaForm, "amount=12.5&currency=eur&customer=c", "parameter_invalid_integer", "amount"},
		{mediaForm, "amount=1000&currency=eur&customer=c&shipping=x", "parameter_unknown", "shipping"},
		{mediaForm, "amount=1000&currency=eur&customer=c&confirm=false", "", "confirm"},
		{mediaForm, "amount=1000&currency=eur&customer=c&metadata[" + long + "]=v", "", "metadata[" + long + "]"},
		{mediaForm, "amount=1000&currency=eur&customer=c&metadata[a]=1&metadata[a]=2", "", "metadata[a]"},
	} {
		r := s.do(http.MethodPost, "/v1/payment_intents", tc.body, "Authorization", auth("acme"),
			"Idempotency-Key", "k"+string(rune('a'+i)), "Content-Type", tc.contentType)
		require.Equal(t, http.StatusBadRequest, r.status, "%s: %s", tc.body, r.body)
		var body struct{ Error stripeErrorBody }
		r.json(t, &body)
		assert.Equal(t, "invalid_request_error", body.Error.Type, tc.body)
		assert.Equal(t, tc.code, body.Error.Code, tc.body)
		assert.Equal(t, tc.param, body.Error.Param, tc.body)
		assert.NotEmpty(t, body.Error.Message, tc.body)
		assert.Equal(t, "false", r.header.Get("Stripe-Should-Retry"), tc.body)
	}
	// metadata= (Stripe's empty metadata) and confirm=true are accepted.
	r := s.do(http.MethodPost, "/v1/payment_intents", "amount=1000&currency=eur&customer=c&metadata=&confirm=true",
		"Authorization", auth("acme"), "Idempotency-Key", "ok", "Content-Type", mediaForm)
	require.Equal(t, http.StatusOK, r.status, "body: %s", r.body)
	var pi paymentIntentJSON
	r.json(t, &pi)
	assert.Equal(t, map[string]string{}, pi.Metadata)
	assert.Equal(t, 1, s.provider.Charges())
}

// timingOutProvider charges and never answers in time.
type timingOutProvider struct{ calls atomic.Int32 }

func (p *timingOutProvider) Charge(context.Context, ChargeRequest) (Charge, error) {
	p.calls.Add(1)
	return Charge{}, ErrProviderTimeout
}

// TestStripeGoOutcomeUnknownNotRetried: with the charge declared
// at-most-once, a provider timeout holds the PaymentIntent UNKNOWN: 409
// api_error outcome_unknown with Stripe-Should-Retry: false, which
// stripe-go obeys (one POST per call); the provider is called once.
func TestStripeGoOutcomeUnknownNotRetried(t *testing.T) {
	t.Parallel()
	provider := &timingOutProvider{}
	h, err := newHandler(handlerConfig{Store: newSQLiteStore(t), Provider: provider, Logger: discardLogger(), AtMostOnceCharge: true})
	require.NoError(t, err)
	s := &stripeServer{}
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method == http.MethodPost && r.URL.Path == "/v1/payment_intents" {
			s.posts.Add(1)
		}
		h.ServeHTTP(w, r)
	}))
	t.Cleanup(srv.Close)
	s.testServer = &testServer{t: t, url: srv.URL}
	sc := s.client("acme", 3)
	for call := int64(1); call <= 2; call++ {
		_, err := sc.V1PaymentIntents.Create(context.Background(), piParams("order-1", 1000))
		var se *stripe.Error
		require.ErrorAs(t, err, &se)
		assert.Equal(t, http.StatusConflict, se.HTTPStatusCode)
		assert.Equal(t, stripe.ErrorCode("outcome_unknown"), se.Code)
		assert.Equal(t, "false", se.LastResponse.Header.Get("Stripe-Should-Retry"))
		assert.Equal(t, call, s.posts.Load(), "stripe-go did not retry")
	}
	assert.EqualValues(t, 1, provider.calls.Load(), "never charged again")
}
