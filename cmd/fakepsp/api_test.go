package main

import (
	"context"
	"encoding/json"
	"io"
	"log/slog"
	"math/big"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/idemgo/idem"
	"github.com/idemgo/idem/cmd/internal/service"
	"github.com/idemgo/idem/internal/dbtest"
)

const chargeBody = `{"amount":1000,"currency":"jpy","customer":"cus_42","description":"Order #1"}`

type testPSP struct {
	t   *testing.T
	url string
}

func newSQLiteStore(t *testing.T) Store {
	t.Helper()
	return openTestStore(t, filepath.Join(t.TempDir(), "fakepsp.db"))
}

// newPostgresStore opens the store on a fresh PostgreSQL schema
// (dbtest.PostgresURL), closed when the test ends.
func newPostgresStore(t *testing.T) Store {
	t.Helper()
	url, _ := dbtest.PostgresURL(t)
	return openTestStore(t, url)
}

// openTestStore opens the store at target (a path or a URL, as --db takes
// it), closed when the test ends.
func openTestStore(t *testing.T, target string) Store {
	t.Helper()
	s, err := openStore(context.Background(), target)
	require.NoError(t, err)
	t.Cleanup(func() { s.Close() })
	return s
}

func startPSP(t *testing.T, cfg handlerConfig) *testPSP {
	t.Helper()
	if cfg.Store == nil {
		cfg.Store = newSQLiteStore(t)
	}
	cfg.Logger = slog.New(slog.DiscardHandler)
	h, err := newHandler(cfg)
	require.NoError(t, err)
	srv := httptest.NewServer(h)
	t.Cleanup(srv.Close)
	return &testPSP{t: t, url: srv.URL}
}

type response struct {
	status int
	header http.Header
	body   []byte
}

func (p *testPSP) do(client *http.Client, method, path, body string, headers ...string) (response, error) {
	var rd io.Reader
	if body != "" {
		rd = strings.NewReader(body)
	}
	req, err := http.NewRequest(method, p.url+path, rd)
	require.NoError(p.t, err)
	for i := 0; i+1 < len(headers); i += 2 {
		req.Header.Add(headers[i], headers[i+1])
	}
	resp, err := client.Do(req)
	if err != nil {
		return response{}, err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	return response{status: resp.StatusCode, header: resp.Header, body: b}, err
}

func (p *testPSP) charge(merchant, key, contentType, body string) response {
	p.t.Helper()
	r, err := p.do(http.DefaultClient, http.MethodPost, "/v1/charges", body,
		"Authorization", "Bearer sk_test_"+merchant, "Idempotency-Key", key, "Content-Type", contentType)
	require.NoError(p.t, err)
	return r
}

func (p *testPSP) stats() Stats {
	p.t.Helper()
	r, err := p.do(http.DefaultClient, http.MethodGet, "/v1/charges/stats", "")
	require.NoError(p.t, err)
	require.Equal(p.t, http.StatusOK, r.status, "body: %s", r.body)
	var st Stats
	require.NoError(p.t, json.Unmarshal(r.body, &st))
	return st
}

func TestChargeAndReplay(t *testing.T) {
	t.Parallel()
	p := startPSP(t, handlerConfig{})

	first := p.charge("acme", "k-1", "application/json", chargeBody)
	require.Equal(t, http.StatusCreated, first.status, "body: %s", first.body)
	var c chargeJSON
	require.NoError(t, json.Unmarshal(first.body, &c))
	require.True(t, strings.HasPrefix(c.ID, "ch_"), c.ID)
	require.Equal(t, "/v1/charges/"+c.ID, first.header.Get("Location"))
	require.Equal(t, chargeJSON{ID: c.ID, Merchant: "acme", AmountJSON: service.AmountJSON{Amount: 1000, Currency: "JPY", Customer: "cus_42",
		Description: c.Description}, CreatedAt: c.CreatedAt}, c)
	require.Equal(t, "Order #1", *c.Description)

	// The same key: idem's replay, byte for byte; no second charge.
	again := p.charge("acme", "k-1", "application/json", `{"customer":"cus_42","amount":1000,"description":"Order #1","currency":"jpy"}`)
	require.Equal(t, http.StatusCreated, again.status)
	require.Equal(t, "true", again.header.Get(idem.HeaderReplayed))
	require.Equal(t, first.body, again.body)

	// A form body; another merchant with the same key is another charge.
	form := p.charge("acme", "k-2", "application/x-www-form-urlencoded", "amount=500&currency=usd&customer=cus_7")
	require.Equal(t, http.StatusCreated, form.status, "body: %s", form.body)
	require.Contains(t, string(form.body), `"description":null`)
	other := p.charge("globex", "k-1", "application/json", chargeBody)
	require.Equal(t, http.StatusCreated, other.status)
	require.Empty(t, other.header.Get(idem.HeaderReplayed))

	st := p.stats()
	require.EqualValues(t, 3, st.Charges)
	require.Equal(t, &MerchantStats{Charges: 2, Amount: map[string]*big.Int{"JPY": big.NewInt(1000), "USD": big.NewInt(500)}}, st.Merchants["acme"])
	require.Equal(t, &MerchantStats{Charges: 1, Amount: map[string]*big.Int{"JPY": big.NewInt(1000)}}, st.Merchants["globex"])

	// The merchant reads its charge; another merchant does not find it.
	r, err := p.do(http.DefaultClient, http.MethodGet, "/v1/charges/"+c.ID, "", "Authorization", "Bearer sk_test_acme")
	require.NoError(t, err)
	require.Equal(t, http.StatusOK, r.status)
	require.JSONEq(t, string(first.body), string(r.body))
	r, err = p.do(http.DefaultClient, http.MethodGet, "/v1/charges/"+c.ID, "", "Authorization", "Bearer sk_test_globex")
	require.NoError(t, err)
	require.Equal(t, http.StatusNotFound, r.status)

	// The same key with another body: idem's 422; nothing charged.
	reused := p.charge("acme", "k-1", "application/json", `{"amount":1,"currency":"JPY","customer":"x"}`)
	require.Equal(t, http.StatusUnprocessableEntity, reused.status)
	require.EqualValues(t, 3, p.stats().Charges)
}

// Without idempotency (--idempotency=false), every call charges anew,
// whatever its key, on both databases: a provider without key handling,
// for at-most-once steps.
func TestWithoutIdempotencyChargesEveryCall(t *testing.T) {
	t.Parallel()
	for name, store := range map[string]func(*testing.T) Store{"sqlite": newSQLiteStore, "postgres": newPostgresStore} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			p := startPSP(t, handlerConfig{Store: store(t), WithoutIdempotency: true})
			var ids []string
			for range 2 {
				r := p.charge("acme", "k-1", "application/json", chargeBody)
				require.Equal(t, http.StatusCreated, r.status, "body: %s", r.body)
				require.Empty(t, r.header.Get(idem.HeaderReplayed))
				var c chargeJSON
				require.NoError(t, json.Unmarshal(r.body, &c))
				ids = append(ids, c.ID)
			}
			require.NotEqual(t, ids[0], ids[1])
			require.Equal(t, http.StatusCreated, p.charge("acme", "", "application/json", chargeBody).status, "no key needed")
			require.Equal(t, http.StatusBadRequest, p.charge("acme", "k-2", "application/json", `{"amount":"x"}`).status)
			require.EqualValues(t, 3, p.stats().Charges)
		})
	}
}

func TestChargeRequirements(t *testing.T) {
	t.Parallel()
	p := startPSP(t, handlerConfig{})

	r, err := p.do(http.DefaultClient, http.MethodPost, "/v1/charges", chargeBody,
		"Authorization", "Bearer sk_test_acme", "Content-Type", "application/json")
	require.NoError(t, err)
	require.Equal(t, http.StatusBadRequest, r.status, "Idempotency-Key is required")
	require.Contains(t, string(r.body), idem.ProblemTypeBase+"missing-key")

	for _, authz := range []string{"", "Basic x", "Bearer sk_live_acme", "Bearer sk_test_", "Bearer sk_test_a.b"} {
		headers := []string{"Idempotency-Key", "k", "Content-Type", "application/json"}
		if authz != "" {
			headers = append(headers, "Authorization", authz)
		}
		r, err := p.do(http.DefaultClient, http.MethodPost, "/v1/charges", chargeBody, headers...)
		require.NoError(t, err)
		require.Equal(t, http.StatusUnauthorized, r.status, "%q", authz)
	}

	n := 0
	for body, field := range map[string]string{
		`{"amount":12.5,"currency":"JPY","customer":"c"}`:                 "amount",
		`{"amount":"100","currency":"JPY","customer":"c"}`:                "amount",
		`{"amount":0,"currency":"JPY","customer":"c"}`:                    "amount",
		`{"amount":1,"currency":"JPYY","customer":"c"}`:                   "currency",
		`{"amount":1,"currency":"JPY","customer":""}`:                     "customer",
		`{"amount":1,"currency":"JPY","customer":5}`:                      "customer",
		`{"amount":1,"currency":"JPY","customer":"c","tip":1}`:            "tip",
		`{"amount":1,"currency":"JPY"}`:                                   "customer",
		`{"amount":1,"currency":"JPY","customer":"c","description":true}`: "description",
	} {
		n++
		r := p.charge("acme", "v-"+strconv.Itoa(n), "application/json", body)
		require.Equal(t, http.StatusBadRequest, r.status, "%s: %s", body, r.body)
		require.Contains(t, string(r.body), `"name":"`+field+`"`, body)
	}
	r = p.charge("acme", "media", "text/plain", chargeBody)
	require.Equal(t, http.StatusUnsupportedMediaType, r.status)
	require.EqualValues(t, 0, p.stats().Charges)
}

// sequence returns a Roll function answering rolls in order, then 0.99.
func sequence(rolls ...float64) func() float64 {
	var mu sync.Mutex
	return func() float64 {
		mu.Lock()
		defer mu.Unlock()
		if len(rolls) == 0 {
			return 0.99
		}
		r := rolls[0]
		rolls = rolls[1:]
		return r
	}
}

func TestFailRate(t *testing.T) {
	t.Parallel()
	p := startPSP(t, handlerConfig{FailRate: 0.5, Roll: sequence(0.1)})
	r := p.charge("acme", "f-1", "application/json", chargeBody)
	require.Equal(t, http.StatusServiceUnavailable, r.status, "body: %s", r.body)
	require.Equal(t, "1", r.header.Get("Retry-After"))
	require.EqualValues(t, 0, p.stats().Charges, "nothing charged")

	// idem recorded FAILED: the same key runs again, and charges.
	r = p.charge("acme", "f-1", "application/json", chargeBody)
	require.Equal(t, http.StatusCreated, r.status, "body: %s", r.body)
	require.Empty(t, r.header.Get(idem.HeaderReplayed))
	require.EqualValues(t, 1, p.stats().Charges)
}

// TestTimeoutRate: the charge is made and recorded, its answer withheld
// past the client's timeout; the retry with the same key gets the replay.
func TestTimeoutRate(t *testing.T) {
	t.Parallel()
	p := startPSP(t, handlerConfig{TimeoutRate: 1, Hang: time.Minute})
	client := &http.Client{Timeout: 300 * time.Millisecond}
	headers := []string{"Authorization", "Bearer sk_test_acme", "Idempotency-Key", "t-1", "Content-Type", "application/json"}
	_, err := p.do(client, http.MethodPost, "/v1/charges", chargeBody, headers...)
	require.Error(t, err, "the answer is withheld past the client's timeout")
	require.EqualValues(t, 1, p.stats().Charges, "yet the charge was made")

	r, err := p.do(client, http.MethodPost, "/v1/charges", chargeBody, headers...)
	require.NoError(t, err, "a replay is never withheld")
	require.Equal(t, http.StatusCreated, r.status)
	require.Equal(t, "true", r.header.Get(idem.HeaderReplayed))
	require.EqualValues(t, 1, p.stats().Charges)

	// Once --hang is over, a withheld answer is sent after all.
	late := startPSP(t, handlerConfig{TimeoutRate: 1, Hang: 100 * time.Millisecond})
	r, err = late.do(http.DefaultClient, http.MethodPost, "/v1/charges", chargeBody, headers...)
	require.NoError(t, err)
	require.Equal(t, http.StatusCreated, r.status)
}

func TestLatency(t *testing.T) {
	t.Parallel()
	p := startPSP(t, handlerConfig{Latency: 300 * time.Millisecond})
	const racers = 5
	answers := make(chan response, racers)
	for range racers {
		go func() { answers <- p.charge("acme", "l-1", "application/json", chargeBody) }()
	}
	var fresh, inFlight int
	for range racers {
		r := <-answers
		switch {
		case r.status == http.StatusCreated && r.header.Get(idem.HeaderReplayed) == "":
			fresh++
		case r.status == http.StatusConflict:
			inFlight++
		default:
			require.Equal(t, http.StatusCreated, r.status, "body: %s", r.body)
		}
	}
	require.Equal(t, 1, fresh)
	require.Positive(t, inFlight, "while a charge takes its latency, its key is idem's 409")
	require.EqualValues(t, 1, p.stats().Charges)
}

func TestPostgres(t *testing.T) {
	t.Parallel()
	store := newPostgresStore(t)
	p := startPSP(t, handlerConfig{Store: store, TimeoutRate: 0.5, Hang: time.Minute, Roll: sequence(0.1)})

	client := &http.Client{Timeout: 300 * time.Millisecond}
	headers := []string{"Authorization", "Bearer sk_test_acme", "Idempotency-Key", "pg-1", "Content-Type", "application/json"}
	_, err := p.do(client, http.MethodPost, "/v1/charges", chargeBody, headers...)
	require.Error(t, err)
	r, err := p.do(client, http.MethodPost, "/v1/charges", chargeBody, headers...)
	require.NoError(t, err)
	require.Equal(t, "true", r.header.Get(idem.HeaderReplayed))
	require.Equal(t, http.StatusCreated, p.charge("acme", "pg-2", "application/x-www-form-urlencoded", "amount=7&currency=EUR&customer=c").status)
	st := p.stats()
	require.EqualValues(t, 2, st.Charges)
	require.Equal(t, map[string]*big.Int{"JPY": big.NewInt(1000), "EUR": big.NewInt(7)}, st.Merchants["acme"].Amount)
}

// A key sent to a mistyped path gets the 404 without a record: idem wraps
// the POST /v1/charges route, not the router, so the corrected request with
// the same key is charged (regression: idem wrapped the whole router, the
// 404 was recorded, and the corrected request got 422 key-reused).
func TestMistypedPathKeepsTheKey(t *testing.T) {
	t.Parallel()
	p := startPSP(t, handlerConfig{})
	headers := []string{"Authorization", "Bearer sk_test_acme", "Idempotency-Key", "typo-1", "Content-Type", "application/json"}
	for _, path := range []string{"/v1/chargez", "/v1/charges/"} {
		r, err := p.do(http.DefaultClient, http.MethodPost, path, chargeBody, headers...)
		require.NoError(t, err)
		require.Equal(t, http.StatusNotFound, r.status, "%s: %s", path, r.body)
		require.Empty(t, r.header.Get(idem.HeaderReplayed), path)
	}
	r := p.charge("acme", "typo-1", "application/json", chargeBody)
	require.Equal(t, http.StatusCreated, r.status, "the key is not used up: %s", r.body)
	require.EqualValues(t, 1, p.stats().Charges)
}

// GET /healthz answers 503 once the SQLite file was deleted (regression:
// 200, the ping served by the deleted inode).
func TestHealthzNoticesTheSQLiteFileGone(t *testing.T) {
	t.Parallel()
	path := filepath.Join(t.TempDir(), "fakepsp.db")
	store := openTestStore(t, path)
	p := startPSP(t, handlerConfig{Store: store})
	r, err := p.do(http.DefaultClient, http.MethodGet, "/healthz", "")
	require.NoError(t, err)
	require.Equal(t, http.StatusOK, r.status)
	require.NoError(t, os.Remove(path))
	r, err = p.do(http.DefaultClient, http.MethodGet, "/healthz", "")
	require.NoError(t, err)
	require.Equal(t, http.StatusServiceUnavailable, r.status, "body: %s", r.body)
}

// A charge refused by fakepsp's own validation (400, 415) does not burn its
// key: the corrected request with the same key is charged (regression,
// issue 13 item 10: the refusal was recorded and replayed, and the
// corrected request got 422 key-reused).
func TestValidationFailureKeepsTheKey(t *testing.T) {
	t.Parallel()
	p := startPSP(t, handlerConfig{})
	for key, bad := range map[string][2]string{
		"fix-415": {"text/plain", chargeBody},
		"fix-400": {"application/json", `{"amount":0,"currency":"jpy","customer":"c"}`},
	} {
		r := p.charge("acme", key, bad[0], bad[1])
		require.Contains(t, []int{http.StatusBadRequest, http.StatusUnsupportedMediaType}, r.status, "%s: %s", key, r.body)
		again := p.charge("acme", key, bad[0], bad[1])
		require.Empty(t, again.header.Get(idem.HeaderReplayed), "%s: validated again, not replayed", key)
		fixed := p.charge("acme", key, "application/json", chargeBody)
		require.Equal(t, http.StatusCreated, fixed.status, "%s: the corrected request runs: %s", key, fixed.body)
	}
	require.EqualValues(t, 2, p.stats().Charges)
}

// A charge taking its latency is counted in_progress by the stats until it
// is made, so that a reconciler reads the charges once none is in progress
// (idemstorm: a charge its caller gave up on is still made).
func TestStatsCountChargesInProgress(t *testing.T) {
	t.Parallel()
	p := startPSP(t, handlerConfig{Latency: 3 * time.Second})
	done := make(chan response, 1)
	go func() { done <- p.charge("acme", "ip-1", "application/json", chargeBody) }()
	require.Eventually(t, func() bool { return p.stats().InProgress == 1 }, time.Minute, 10*time.Millisecond)
	require.Equal(t, http.StatusCreated, (<-done).status)
	st := p.stats()
	require.Zero(t, st.InProgress)
	require.EqualValues(t, 1, st.Charges)
}
