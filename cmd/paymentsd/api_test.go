package main

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"net/http"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/idemgo/idem"
	"github.com/idemgo/idem/cmd/internal/service"
	"github.com/idemgo/idem/idemdriver"
)

const paymentBody = `{"amount":1000,"currency":"JPY","customer":"cus_42","description":"Order #1"}`

func TestCreatePayment(t *testing.T) {
	t.Parallel()
	s := startServer(t, newSQLiteStore(t), nil)

	r := s.postJSON("acme", "key-1", `{"amount":1000,"currency":"jpy","customer":"cus_42","description":"Order #1"}`)
	require.Equal(t, http.StatusCreated, r.status, "body: %s", r.body)
	require.Empty(t, r.header.Get(idem.HeaderReplayed))
	var p paymentJSON
	r.json(t, &p)
	require.Regexp(t, `^pay_[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$`, p.ID)
	require.Equal(t, "/v1/payments/"+p.ID, r.header.Get("Location"))
	require.EqualValues(t, 1000, p.Amount)
	require.Equal(t, "JPY", p.Currency, "currency is normalised to upper case")
	require.Equal(t, "cus_42", p.Customer)
	require.NotNil(t, p.Description)
	require.Equal(t, "Order #1", *p.Description)
	require.Equal(t, "succeeded", p.Status)
	created, err := time.Parse(time.RFC3339, p.CreatedAt)
	require.NoError(t, err)
	require.True(t, strings.HasSuffix(p.CreatedAt, "Z"), "created_at is UTC: %s", p.CreatedAt)
	require.WithinDuration(t, time.Now(), created, time.Hour) // the database clock, not a constant

	// The Location answers the same payment.
	got := s.get("acme", r.header.Get("Location"))
	require.Equal(t, http.StatusOK, got.status)
	require.JSONEq(t, string(r.body), string(got.body))

	// Without a description, it is null.
	r = s.postJSON("acme", "key-2", `{"amount":1,"currency":"USD","customer":"cus_42"}`)
	require.Equal(t, http.StatusCreated, r.status, "body: %s", r.body)
	require.Contains(t, string(r.body), `"description":null`)
}

func TestSamePostTwiceIsReplayed(t *testing.T) {
	t.Parallel()
	s := startServer(t, newSQLiteStore(t), nil)

	first := s.postJSON("acme", "order-1", paymentBody)
	require.Equal(t, http.StatusCreated, first.status, "body: %s", first.body)
	// Same request, members in another order and other whitespace: the
	// fingerprint canonicalizes JSON (RFC 8785), so it is the same request.
	second := s.postJSON("acme", "order-1", `{ "customer":"cus_42", "description":"Order #1", "currency":"JPY", "amount":1000 }`)
	require.Equal(t, http.StatusCreated, second.status, "body: %s", second.body)
	require.Equal(t, "true", second.header.Get(idem.HeaderReplayed))
	require.Equal(t, first.body, second.body, "the replay is byte-identical")
	require.Equal(t, first.header.Get("Location"), second.header.Get("Location"))

	b := s.balance("acme")
	require.EqualValues(t, 1, b.Payments)
	require.Equal(t, map[string]int64{"JPY": 1000}, b.Totals)
	require.Equal(t, 1, s.provider.(*FakeProvider).Calls(), "the provider is charged once")
}

func TestFormEncodedBody(t *testing.T) {
	t.Parallel()
	s := startServer(t, newSQLiteStore(t), nil)

	r := s.do(http.MethodPost, "/v1/payments", "amount=2500&currency=eur&customer=cus_7&description=Two+books",
		"Authorization", auth("acme"), "Idempotency-Key", "form-1", "Content-Type", "application/x-www-form-urlencoded")
	require.Equal(t, http.StatusCreated, r.status, "body: %s", r.body)
	var p paymentJSON
	r.json(t, &p)
	require.EqualValues(t, 2500, p.Amount)
	require.Equal(t, "EUR", p.Currency)
	require.Equal(t, "cus_7", p.Customer)
	require.Equal(t, "Two books", *p.Description)

	// Form fields obey the same rules.
	r = s.do(http.MethodPost, "/v1/payments", "amount=12.5&currency=EUR&customer=cus_7&extra=1",
		"Authorization", auth("acme"), "Idempotency-Key", "form-2", "Content-Type", "application/x-www-form-urlencoded; charset=utf-8")
	require.Equal(t, http.StatusBadRequest, r.status, "body: %s", r.body)
	require.Equal(t, []string{"amount", "extra"}, invalidParamNames(t, r.problem(t)))
}

func TestValidation(t *testing.T) {
	t.Parallel()
	s := startServer(t, newSQLiteStore(t), nil)

	cases := []struct {
		name   string
		body   string
		fields []string // invalid-params names; nil: a whole-body problem
	}{
		{"fractional amount", `{"amount":12.5,"currency":"USD","customer":"c"}`, []string{"amount"}},
		{"amount as string", `{"amount":"1000","currency":"USD","customer":"c"}`, []string{"amount"}},
		{"negative amount", `{"amount":-5,"currency":"USD","customer":"c"}`, []string{"amount"}},
		{"zero amount", `{"amount":0,"currency":"USD","customer":"c"}`, []string{"amount"}},
		{"fraction in exponent form", `{"amount":125e-1,"currency":"USD","customer":"c"}`, []string{"amount"}},
		{"amount too small for a double", `{"amount":1e-999999,"currency":"USD","customer":"c"}`, []string{"amount"}},
		{"amount too large for a double", `{"amount":1e999999,"currency":"USD","customer":"c"}`, []string{"amount"}},
		{"negative amount too large for a double", `{"amount":-1e999999,"currency":"USD","customer":"c"}`, []string{"amount"}},
		{"negative zero amount", `{"amount":-0.0,"currency":"USD","customer":"c"}`, []string{"amount"}},
		{"amount above 2^53", `{"amount":9007199254740993,"currency":"USD","customer":"c"}`, []string{"amount"}},
		{"amount beyond int64", `{"amount":99999999999999999999,"currency":"USD","customer":"c"}`, []string{"amount"}},
		{"null amount", `{"amount":null,"currency":"USD","customer":"c"}`, []string{"amount"}},
		{"missing amount", `{"currency":"USD","customer":"c"}`, []string{"amount"}},
		{"unknown currency", `{"amount":1,"currency":"XYZ","customer":"c"}`, []string{"currency"}},
		{"currency of 4 letters", `{"amount":1,"currency":"USDT","customer":"c"}`, []string{"currency"}},
		{"currency with digits", `{"amount":1,"currency":"US1","customer":"c"}`, []string{"currency"}},
		{"currency as number", `{"amount":1,"currency":840,"customer":"c"}`, []string{"currency"}},
		{"empty customer", `{"amount":1,"currency":"USD","customer":""}`, []string{"customer"}},
		{"blank customer", `{"amount":1,"currency":"USD","customer":"  "}`, []string{"customer"}},
		{"long customer", `{"amount":1,"currency":"USD","customer":"` + strings.Repeat("c", 256) + `"}`, []string{"customer"}},
		{"missing customer", `{"amount":1,"currency":"USD"}`, []string{"customer"}},
		{"long description", `{"amount":1,"currency":"USD","customer":"c","description":"` + strings.Repeat("d", 1001) + `"}`, []string{"description"}},
		{"description as number", `{"amount":1,"currency":"USD","customer":"c","description":5}`, []string{"description"}},
		{"unknown field", `{"amount":1,"currency":"USD","customer":"c","capture":true}`, []string{"capture"}},
		{"duplicate field", `{"amount":1,"amount":100000,"currency":"USD","customer":"c"}`, []string{"amount"}},
		{"everything wrong", `{"amount":0,"currency":"usd1","customer":"","foo":1}`, []string{"amount", "currency", "customer", "foo"}},
		{"not JSON", `amount=1`, nil},
		{"JSON array", `[{"amount":1}]`, nil},
		{"two objects", `{"amount":1,"currency":"USD","customer":"c"}{}`, nil},
		{"truncated JSON", `{"amount":1,`, nil},
		{"truncated value", `{"amount":1,"currency":"US`, nil},
	}
	// Details checked beyond the type: a body cut short says so, not the
	// decoder's bare "EOF".
	details := map[string]string{
		"truncated JSON":  "ends before the object is closed",
		"truncated value": "ends before the object is closed",
	}
	for i, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			r := s.postJSON("acme", fmt.Sprintf("invalid-%d", i), tc.body)
			require.Equal(t, http.StatusBadRequest, r.status, "body: %s", r.body)
			p := r.problem(t)
			require.Equal(t, ProblemTypeBase+service.ProblemInvalidRequest, p["type"])
			require.Contains(t, p["detail"], details[tc.name])
			if tc.fields == nil {
				require.NotContains(t, p, "invalid-params")
				return
			}
			require.Equal(t, tc.fields, invalidParamNames(t, p))
			require.Contains(t, p["detail"], tc.fields[0])
		})
	}

	// Boundaries that pass. An amount is a JSON number whose value is an
	// integer, however spelled (1e3, 1000.0), as RFC 8785 sees it.
	for i, body := range []string{
		`{"amount":9007199254740992,"currency":"USD","customer":"c"}`,
		`{"amount":1e3,"currency":"USD","customer":"c"}`,
		`{"amount":1000.0,"currency":"USD","customer":"c"}`,
		`{"amount":1.5E1,"currency":"USD","customer":"c"}`,
		`{"amount":1,"currency":"usd","customer":"` + strings.Repeat("c", 255) + `","description":"` + strings.Repeat("é", 1000) + `"}`,
		`{"amount":1,"currency":"Usd","customer":"c","description":null}`,
	} {
		r := s.postJSON("acme", fmt.Sprintf("valid-%d", i), body)
		require.Equal(t, http.StatusCreated, r.status, "body %s: %s", body, r.body)
	}
	require.EqualValues(t, 6, s.balance("acme").Payments, "no invalid request wrote a payment")
}

func TestUnsupportedMediaType(t *testing.T) {
	t.Parallel()
	s := startServer(t, newSQLiteStore(t), nil)
	for i, ct := range []string{"", "text/plain", "multipart/form-data; boundary=x", "application/json; charset=latin1"} {
		headers := []string{"Authorization", auth("acme"), "Idempotency-Key", fmt.Sprintf("media-%d", i)}
		if ct != "" {
			headers = append(headers, "Content-Type", ct)
		}
		r := s.do(http.MethodPost, "/v1/payments", paymentBody, headers...)
		require.Equal(t, http.StatusUnsupportedMediaType, r.status, "Content-Type %q: %s", ct, r.body)
		require.Equal(t, ProblemTypeBase+service.ProblemUnsupportedMedia, r.problem(t)["type"])
	}
}

func TestMissingIdempotencyKey(t *testing.T) {
	t.Parallel()
	s := startServer(t, newSQLiteStore(t), nil)
	r := s.do(http.MethodPost, "/v1/payments", paymentBody, "Authorization", auth("acme"), "Content-Type", "application/json")
	require.Equal(t, http.StatusBadRequest, r.status)
	require.Equal(t, idem.ProblemTypeBase+"missing-key", r.problem(t)["type"])
	require.EqualValues(t, 0, s.balance("acme").Payments)
}

func TestUnauthorized(t *testing.T) {
	t.Parallel()
	s := startServer(t, newSQLiteStore(t), nil)
	cases := map[string][]string{
		"missing header":        nil,
		"wrong scheme":          {"Basic c2tfdGVzdF9hY21lOg=="},
		"no token":              {"Bearer"},
		"not a test key":        {"Bearer sk_live_acme"},
		"empty merchant":        {"Bearer sk_test_"},
		"merchant with a dot":   {"Bearer sk_test_ac.me"},
		"merchant with a space": {"Bearer sk_test_ac me"},
		"merchant non-ASCII":    {"Bearer sk_test_acmé"},
		"merchant too long":     {"Bearer sk_test_" + strings.Repeat("m", 65)},
		"two headers":           {"Bearer sk_test_acme", "Bearer sk_test_other"},
	}
	requests := []struct{ method, path string }{
		{http.MethodPost, "/v1/payments"},
		{http.MethodGet, "/v1/payments"},
		{http.MethodGet, "/v1/payments/pay_x"},
		{http.MethodGet, "/v1/balance"},
	}
	for name, values := range cases {
		for _, rq := range requests {
			headers := []string{"Idempotency-Key", "auth-key", "Content-Type", "application/json"}
			for _, v := range values {
				headers = append(headers, "Authorization", v)
			}
			r := s.do(rq.method, rq.path, paymentBody, headers...)
			require.Equal(t, http.StatusUnauthorized, r.status, "%s, %s %s: %s", name, rq.method, rq.path, r.body)
			require.Equal(t, ProblemTypeBase+service.ProblemUnauthorized, r.problem(t)["type"])
			require.True(t, strings.HasPrefix(r.header.Get("WWW-Authenticate"), "Bearer "))
		}
	}
	// The longest merchant and the case-insensitive scheme pass.
	long := strings.Repeat("m", 64)
	r := s.do(http.MethodGet, "/v1/balance", "", "Authorization", "bearer "+service.APIKeyPrefix+long)
	require.Equal(t, http.StatusOK, r.status, "body: %s", r.body)

	// Unauthenticated requests never reached the store.
	var n int
	require.NoError(t, s.store.(*sqlStore).SQL.QueryRow(`SELECT COUNT(*) FROM idem_keys`).Scan(&n))
	require.Zero(t, n)
}

func TestChangedBodySameKey(t *testing.T) {
	t.Parallel()
	s := startServer(t, newSQLiteStore(t), nil)
	require.Equal(t, http.StatusCreated, s.postJSON("acme", "k", paymentBody).status)
	r := s.postJSON("acme", "k", `{"amount":1001,"currency":"JPY","customer":"cus_42","description":"Order #1"}`)
	require.Equal(t, http.StatusUnprocessableEntity, r.status, "body: %s", r.body)
	require.Equal(t, idem.ProblemTypeBase+"key-reused", r.problem(t)["type"])
	require.EqualValues(t, 1, s.balance("acme").Payments)
}

func TestKeysAreScopedByMerchant(t *testing.T) {
	t.Parallel()
	s := startServer(t, newSQLiteStore(t), nil)
	a := s.postJSON("acme", "shared-key", paymentBody)
	b := s.postJSON("globex", "shared-key", paymentBody)
	require.Equal(t, http.StatusCreated, a.status)
	require.Equal(t, http.StatusCreated, b.status)
	require.Empty(t, b.header.Get(idem.HeaderReplayed), "another merchant's key is another key")
	require.NotEqual(t, a.header.Get("Location"), b.header.Get("Location"))
}

func TestBalanceTotals(t *testing.T) {
	t.Parallel()
	s := startServer(t, newSQLiteStore(t), nil)
	for i, body := range []string{
		`{"amount":1000,"currency":"JPY","customer":"a"}`,
		`{"amount":500,"currency":"jpy","customer":"b"}`,
		`{"amount":1999,"currency":"USD","customer":"a"}`,
		`{"amount":1,"currency":"EUR","customer":"c"}`,
	} {
		require.Equal(t, http.StatusCreated, s.postJSON("acme", fmt.Sprintf("b-%d", i), body).status)
	}
	require.Equal(t, http.StatusCreated, s.postJSON("globex", "b-0", `{"amount":7,"currency":"GBP","customer":"z"}`).status)
	// A replay adds nothing.
	require.Equal(t, "true", s.postJSON("acme", "b-0", `{"amount":1000,"currency":"JPY","customer":"a"}`).header.Get(idem.HeaderReplayed))

	require.Equal(t, balanceJSON{Merchant: "acme", Payments: 4, Totals: map[string]int64{"JPY": 1500, "USD": 1999, "EUR": 1}}, s.balance("acme"))
	require.Equal(t, balanceJSON{Merchant: "globex", Payments: 1, Totals: map[string]int64{"GBP": 7}}, s.balance("globex"))
	require.Equal(t, balanceJSON{Merchant: "initech", Payments: 0, Totals: map[string]int64{}}, s.balance("initech"))
	require.JSONEq(t, `{"merchant":"initech","payments":0,"totals":{}}`, string(s.get("initech", "/v1/balance").body))
}

func TestGetAndListPayments(t *testing.T) {
	t.Parallel()
	s := startServer(t, newSQLiteStore(t), nil)
	var ids []string
	for i := range 12 {
		r := s.postJSON("acme", fmt.Sprintf("l-%d", i), fmt.Sprintf(`{"amount":%d,"currency":"JPY","customer":"c"}`, i+1))
		require.Equal(t, http.StatusCreated, r.status)
		var p paymentJSON
		r.json(t, &p)
		ids = append(ids, p.ID)
	}

	// Another merchant's payment is not found; neither is a made-up id.
	r := s.get("globex", "/v1/payments/"+ids[0])
	require.Equal(t, http.StatusNotFound, r.status)
	require.Equal(t, ProblemTypeBase+service.ProblemNotFound, r.problem(t)["type"])
	require.Equal(t, http.StatusNotFound, s.get("acme", "/v1/payments/pay_nope").status)

	type list struct {
		Data    []paymentJSON `json:"data"`
		HasMore bool          `json:"has_more"`
	}
	listIDs := func(l list) []string {
		var out []string
		for _, p := range l.Data {
			out = append(out, p.ID)
		}
		return out
	}
	newestFirst := func(n int) []string {
		var out []string
		for i := len(ids) - 1; i >= len(ids)-n; i-- {
			out = append(out, ids[i])
		}
		return out
	}

	var l list
	s.get("acme", "/v1/payments").json(t, &l)
	require.Equal(t, newestFirst(10), listIDs(l), "default limit 10, newest first")
	require.True(t, l.HasMore)

	l = list{}
	s.get("acme", "/v1/payments?limit=100").json(t, &l)
	require.Equal(t, newestFirst(12), listIDs(l))
	require.False(t, l.HasMore)

	l = list{}
	s.get("acme", "/v1/payments?limit=1").json(t, &l)
	require.Equal(t, newestFirst(1), listIDs(l))

	l = list{}
	s.get("globex", "/v1/payments").json(t, &l)
	require.NotNil(t, l.Data)
	require.Empty(t, l.Data)
	require.JSONEq(t, `{"data":[],"has_more":false}`, string(s.get("globex", "/v1/payments").body))

	for _, q := range []string{"limit=0", "limit=101", "limit=-1", "limit=abc", "limit=", "limit=1.5", "limit=1&limit=2"} {
		r := s.get("acme", "/v1/payments?"+q)
		require.Equal(t, http.StatusBadRequest, r.status, "%s: %s", q, r.body)
		require.Equal(t, []string{"limit"}, invalidParamNames(t, r.problem(t)))
	}
}

func TestRoutingProblems(t *testing.T) {
	t.Parallel()
	s := startServer(t, newSQLiteStore(t), nil)
	r := s.do(http.MethodDelete, "/v1/payments/pay_x", "", "Authorization", auth("acme"))
	require.Equal(t, http.StatusMethodNotAllowed, r.status)
	require.Equal(t, "GET, HEAD", r.header.Get("Allow"))
	r.problem(t)
	r = s.get("acme", "/v1/nothing")
	require.Equal(t, http.StatusNotFound, r.status)
	r.problem(t)
	r = s.do(http.MethodPost, "/healthz", "")
	require.Equal(t, http.StatusMethodNotAllowed, r.status)
	r.problem(t)
}

// flakyProvider fails its first failures calls, then charges through next.
type flakyProvider struct {
	next     *FakeProvider
	failures atomic.Int32
	relays   sync.Map // relay keys seen
}

func (p *flakyProvider) Charge(ctx context.Context, req ChargeRequest) (Charge, error) {
	p.relays.Store(req.IdempotencyKey, true)
	if p.failures.Add(-1) >= 0 {
		return Charge{}, ErrProviderUnavailable
	}
	return p.next.Charge(ctx, req)
}

func TestProviderErrorIsRetried(t *testing.T) {
	t.Parallel()
	provider := &flakyProvider{next: NewFakeProvider(0)}
	provider.failures.Store(1)
	store := newSQLiteStore(t)
	s := startServer(t, store, provider)

	r := s.postJSON("acme", "psp-1", paymentBody)
	require.Equal(t, http.StatusBadGateway, r.status)
	require.Equal(t, ProblemTypeBase+problemProviderError, r.problem(t)["type"])
	require.EqualValues(t, 0, s.balance("acme").Payments)

	// 502 was recorded FAILED: the same key runs again, and succeeds.
	r = s.postJSON("acme", "psp-1", paymentBody)
	require.Equal(t, http.StatusCreated, r.status, "body: %s", r.body)
	require.Empty(t, r.header.Get(idem.HeaderReplayed))
	require.EqualValues(t, 1, s.balance("acme").Payments)

	// Both attempts asked the provider with one relay key, not the raw key:
	// idem's derivation from (merchant, Idempotency-Key, the record's
	// created_at, "charge").
	var relays []string
	provider.relays.Range(func(k, _ any) bool { relays = append(relays, k.(string)); return true })
	require.Len(t, relays, 1)
	require.NotContains(t, relays[0], "psp-1")
	rec, err := store.Idem().Get(t.Context(), idemdriver.GetParams{Scope: "acme", Key: "psp-1"})
	require.NoError(t, err)
	require.Equal(t, idem.DeriveKey(nil, "acme", "psp-1", rec.CreatedAt, RelayStep), relays[0])
}

// failingWrites is a Store whose CreatePayment writes, then fails: the
// handler answers 500 after rows were written in the claim's transaction.
type failingWrites struct {
	Store
	fail atomic.Bool
}

func (s *failingWrites) CreatePayment(ctx context.Context, p NewPayment, mode WriteMode) (Payment, error) {
	got, err := s.Store.CreatePayment(ctx, p, mode)
	if err == nil && s.fail.Load() {
		return Payment{}, errors.New("disk on fire")
	}
	return got, err
}

func TestFailedWriteRollsBackAndRetryChargesOnce(t *testing.T) {
	t.Parallel()
	store := &failingWrites{Store: newSQLiteStore(t)}
	store.fail.Store(true)
	provider := NewFakeProvider(0)
	s := startServer(t, store, provider)

	r := s.postJSON("acme", "w-1", paymentBody)
	require.Equal(t, http.StatusInternalServerError, r.status)
	r.problem(t)
	require.EqualValues(t, 0, s.balance("acme").Payments, "the payment and ledger rows were rolled back")

	store.fail.Store(false)
	r = s.postJSON("acme", "w-1", paymentBody)
	require.Equal(t, http.StatusCreated, r.status, "body: %s", r.body)
	require.EqualValues(t, 1, s.balance("acme").Payments)
	// The charge is an idem step: its result was recorded before the write
	// failed, so the retry booked it without calling the provider again.
	require.Equal(t, 1, provider.Calls())
	require.Equal(t, 1, provider.Charges())
}

func TestHealthz(t *testing.T) {
	t.Parallel()
	store := newSQLiteStore(t)
	s := startServer(t, store, nil)
	r := s.do(http.MethodGet, "/healthz", "")
	require.Equal(t, http.StatusOK, r.status)
	require.JSONEq(t, `{"status":"ok"}`, string(r.body))

	require.NoError(t, store.Close())
	r = s.do(http.MethodGet, "/healthz", "")
	require.Equal(t, http.StatusServiceUnavailable, r.status)
	require.Equal(t, ProblemTypeBase+service.ProblemUnavailable, r.problem(t)["type"])
}

func TestPaymentFlow(t *testing.T) {
	t.Parallel()
	onEachDatabase(t, testPaymentFlow)
}

func TestConcurrentIdenticalPosts(t *testing.T) {
	t.Parallel()
	onEachDatabase(t, testConcurrentIdenticalPosts)
}

// testConcurrentIdenticalPosts races 20 identical POSTs on one key while the
// provider takes 300 ms: exactly one runs; every other answer is 409 with
// Retry-After or a replay of the one; none is a 5xx.
func testConcurrentIdenticalPosts(t *testing.T, store Store) {
	const racers = 20
	provider := NewFakeProvider(300 * time.Millisecond)
	s := startServer(t, store, provider)

	responses := make([]response, racers)
	var wg sync.WaitGroup
	start := make(chan struct{})
	for i := range racers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			<-start
			responses[i] = s.postJSON("acme", "race-1", paymentBody)
		}()
	}
	close(start)
	wg.Wait()

	var created, replayed, inFlight int
	var original []byte
	for _, r := range responses {
		require.Less(t, r.status, 500, "body: %s", r.body)
		switch {
		case r.status == http.StatusCreated && r.header.Get(idem.HeaderReplayed) == "":
			created++
			original = r.body
		case r.status == http.StatusCreated:
			replayed++
		case r.status == http.StatusConflict:
			inFlight++
			require.Equal(t, idem.ProblemTypeBase+"request-in-flight", r.problem(t)["type"])
			require.NotEmpty(t, r.header.Get("Retry-After"))
		default:
			t.Fatalf("unexpected answer %d: %s", r.status, r.body)
		}
	}
	require.Equal(t, 1, created, "exactly one request ran")
	require.Equal(t, racers, created+replayed+inFlight)
	for _, r := range responses {
		if r.status == http.StatusCreated {
			require.Equal(t, original, r.body)
		}
	}
	require.Equal(t, 1, provider.Calls())
	b := s.balance("acme")
	require.EqualValues(t, 1, b.Payments)
	require.Equal(t, map[string]int64{"JPY": 1000}, b.Totals)

	// After the race, the key replays.
	r := s.postJSON("acme", "race-1", paymentBody)
	require.Equal(t, http.StatusCreated, r.status)
	require.Equal(t, "true", r.header.Get(idem.HeaderReplayed))
	require.Equal(t, original, r.body)
}

// testPaymentFlow runs the API's main paths on store (a fresh database):
// payment, replay, reuse with another body, balance, reads, and a failed
// write that rolls back and is retried with one charge.
func testPaymentFlow(t *testing.T, store Store) {
	s := startServer(t, store, nil)

	first := s.postJSON("acme", "flow-1", paymentBody)
	require.Equal(t, http.StatusCreated, first.status, "body: %s", first.body)
	second := s.postJSON("acme", "flow-1", paymentBody)
	require.Equal(t, "true", second.header.Get(idem.HeaderReplayed))
	require.Equal(t, first.body, second.body)
	require.Equal(t, http.StatusUnprocessableEntity, s.postJSON("acme", "flow-1", `{"amount":2,"currency":"USD","customer":"x"}`).status)

	require.Equal(t, http.StatusCreated, s.postJSON("acme", "flow-2", `{"amount":5,"currency":"usd","customer":"x"}`).status)
	require.Equal(t, balanceJSON{Merchant: "acme", Payments: 2, Totals: map[string]int64{"JPY": 1000, "USD": 5}}, s.balance("acme"))
	require.Equal(t, balanceJSON{Merchant: "ACME", Payments: 0, Totals: map[string]int64{}}, s.balance("ACME"), "merchants compare byte by byte")

	got := s.get("acme", first.header.Get("Location"))
	require.Equal(t, http.StatusOK, got.status)
	require.JSONEq(t, string(first.body), string(got.body))
	require.Equal(t, http.StatusNotFound, s.get("globex", first.header.Get("Location")).status)
	require.Contains(t, string(s.get("acme", "/v1/payments?limit=1").body), `"has_more":true`)

	// A failed write rolls back, and the retry charges once.
	failing := &failingWrites{Store: store}
	failing.fail.Store(true)
	provider := NewFakeProvider(0)
	s2 := startServer(t, failing, provider)
	require.Equal(t, http.StatusInternalServerError, s2.postJSON("acme", "flow-3", paymentBody).status)
	require.EqualValues(t, 2, s2.balance("acme").Payments)
	failing.fail.Store(false)
	require.Equal(t, http.StatusCreated, s2.postJSON("acme", "flow-3", paymentBody).status)
	require.EqualValues(t, 3, s2.balance("acme").Payments)
	require.Equal(t, 1, provider.Charges())
}

// A key sent to a mistyped path, or with another method, is not used up:
// idem protects POST /v1/payments, not the router, so the 404 or 405 is
// not recorded and the corrected request runs (it used to get 422, the key
// "first used for POST /v1/payment").
func TestWrongRouteKeepsTheKey(t *testing.T) {
	t.Parallel()
	store := newSQLiteStore(t)
	s := startServer(t, store, nil)
	headers := []string{"Authorization", auth("acme"), "Idempotency-Key", "typo-1", "Content-Type", "application/json"}
	require.Equal(t, http.StatusNotFound, s.do(http.MethodPost, "/v1/payment", paymentBody, headers...).status)
	require.Equal(t, http.StatusMethodNotAllowed, s.do(http.MethodPatch, "/v1/payments", paymentBody, headers...).status)
	require.Equal(t, http.StatusMethodNotAllowed, s.do(http.MethodPost, "/v1/balance", paymentBody, headers...).status)
	_, err := store.Idem().Get(t.Context(), idemdriver.GetParams{Scope: "acme", Key: "typo-1"})
	require.ErrorIs(t, err, idemdriver.ErrNotFound, "no record for the wrong routes")

	r := s.postJSON("acme", "typo-1", paymentBody)
	require.Equal(t, http.StatusCreated, r.status, "body: %s", r.body)
	require.Empty(t, r.header.Get(idem.HeaderReplayed))
	require.Equal(t, "true", s.postJSON("acme", "typo-1", paymentBody).header.Get(idem.HeaderReplayed))
}

// The reads and GET /healthz answer 503 with Retry-After when the database
// fails (here its tables are dropped by another connection), not 500: the
// client did nothing wrong and may ask again. /healthz reads the tables, so
// it fails too, where a ping alone would still say ok.
func TestReadsAnswer503WhenTheDatabaseFails(t *testing.T) {
	t.Parallel()
	path := filepath.Join(t.TempDir(), "paymentsd.db")
	store := openTestStore(t, "sqlite:"+path)
	s := startServer(t, store, nil)
	created := s.postJSON("acme", "k-1", paymentBody)
	require.Equal(t, http.StatusCreated, created.status)
	var p paymentJSON
	created.json(t, &p)
	require.Equal(t, http.StatusOK, s.do(http.MethodGet, "/healthz", "").status)

	db, err := sql.Open("sqlite", path)
	require.NoError(t, err)
	defer db.Close()
	for _, table := range []string{"ledger_entries", "payments", "idem_keys"} {
		_, err := db.Exec("DROP TABLE " + table)
		require.NoError(t, err)
	}
	for _, path := range []string{"/v1/balance", "/v1/payments", "/v1/payments/" + p.ID} {
		r := s.get("acme", path)
		require.Equal(t, http.StatusServiceUnavailable, r.status, "%s: %s", path, r.body)
		require.Equal(t, ProblemTypeBase+service.ProblemUnavailable, r.problem(t)["type"])
		require.Equal(t, "1", r.header.Get("Retry-After"))
	}
	r := s.do(http.MethodGet, "/healthz", "")
	require.Equal(t, http.StatusServiceUnavailable, r.status, "body: %s", r.body)
	require.Equal(t, "1", r.header.Get("Retry-After"))
}

// Two spellings of one amount share a fingerprint (RFC 8785), so they must
// get one answer. Regression: 1000.0 was refused (400) and the retry
// spelling it 1000 was replayed the refusal.
func TestAmountSpellingsAreOneRequest(t *testing.T) {
	t.Parallel()
	s := startServer(t, newSQLiteStore(t), nil)
	first := s.postJSON("acme", "spell-1", `{"amount":1000.0,"currency":"JPY","customer":"c"}`)
	require.Equal(t, http.StatusCreated, first.status, "body: %s", first.body)
	var p paymentJSON
	first.json(t, &p)
	require.EqualValues(t, 1000, p.Amount)
	for _, amount := range []string{"1000", "1e3", "1.000e3"} {
		again := s.postJSON("acme", "spell-1", `{"amount":`+amount+`,"currency":"JPY","customer":"c"}`)
		require.Equal(t, "true", again.header.Get(idem.HeaderReplayed), amount)
		require.Equal(t, first.body, again.body, amount)
	}
	require.EqualValues(t, 1, s.balance("acme").Payments)
}
