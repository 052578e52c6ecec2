package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"io"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/idemgo/idem/cmd/internal/naivecache"
	"github.com/idemgo/idem/internal/dbtest"
)

// EnvRedis names the variable holding the Redis test server's URL, for
// example redis://127.0.0.1:6379/0 (scripts/test sets it when it finds
// redis-server).
const EnvRedis = "TEST_REDIS_URL"

// memCache is a naivecache.Cache in memory; getErr makes every Get fail.
type memCache struct {
	mu     sync.Mutex
	m      map[string][]byte
	getErr error
	sets   int
}

func (c *memCache) Get(_ context.Context, key string) ([]byte, bool, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.getErr != nil {
		return nil, false, c.getErr
	}
	b, ok := c.m[key]
	return b, ok, nil
}

func (c *memCache) Set(_ context.Context, key string, value []byte, _ time.Duration) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.m == nil {
		c.m = map[string][]byte{}
	}
	c.m[key] = value
	c.sets++
	return nil
}

// startNaiveServer serves the naive mode on a fresh SQLite store.
func startNaiveServer(t *testing.T, cache naivecache.Cache, provider Provider) *testServer {
	t.Helper()
	store := newSQLiteStore(t)
	h, err := newNaiveHandler(handlerConfig{Store: store, Provider: provider, Logger: discardLogger()}, cache, time.Minute)
	require.NoError(t, err)
	srv := httptest.NewServer(h)
	t.Cleanup(srv.Close)
	return &testServer{t: t, url: srv.URL, store: store, provider: provider}
}

// redisCacheForTest connects to TEST_REDIS_URL (skipped without it, failed
// under CI).
func redisCacheForTest(t *testing.T) *naivecache.Redis {
	t.Helper()
	url := dbtest.RequireURL(t, EnvRedis)
	c, err := naivecache.OpenRedis(context.Background(), url)
	require.NoError(t, err)
	t.Cleanup(func() { c.Close() })
	return c
}

func TestNaiveReplaysSequentialRetry(t *testing.T) {
	t.Parallel()
	cache := &memCache{}
	provider := NewFakeProvider(0)
	s := startNaiveServer(t, cache, provider)
	const body = `{"amount":1000,"currency":"JPY","customer":"cus_1"}`

	first := s.postJSON("acme", "order-1", body)
	require.Equal(t, http.StatusCreated, first.status, "%s", first.body)
	require.Empty(t, first.header.Get("Idempotent-Replayed"))
	second := s.postJSON("acme", "order-1", body)
	require.Equal(t, http.StatusCreated, second.status)
	require.Equal(t, "true", second.header.Get("Idempotent-Replayed"))
	require.Equal(t, first.body, second.body)
	require.Equal(t, first.header.Get("Location"), second.header.Get("Location"))
	require.Equal(t, "application/json", second.header.Get("Content-Type"))
	require.EqualValues(t, 1, s.balance("acme").Payments)
	require.Equal(t, 1, provider.Charges())

	// Another merchant with the same key is another payment.
	other := s.postJSON("globex", "order-1", body)
	require.Equal(t, http.StatusCreated, other.status)
	require.Empty(t, other.header.Get("Idempotent-Replayed"))
	require.Equal(t, 2, provider.Charges())
}

// TestNaiveDoubleChargesConcurrentDuplicates is the failure the naive mode
// exists to show: duplicates that arrive while the first request runs all
// miss the cache, and each one charges.
func TestNaiveDoubleChargesConcurrentDuplicates(t *testing.T) {
	t.Parallel()
	provider := NewFakeProvider(200 * time.Millisecond)
	s := startNaiveServer(t, &memCache{}, provider)
	const duplicates = 4
	var wg sync.WaitGroup
	statuses := make([]int, duplicates)
	for i := range duplicates {
		wg.Go(func() {
			statuses[i] = s.postJSON("acme", "order-2", `{"amount":500,"currency":"EUR","customer":"cus_2"}`).status
		})
	}
	wg.Wait()
	for _, st := range statuses {
		require.Equal(t, http.StatusCreated, st)
	}
	b := s.balance("acme")
	require.Greater(t, b.Payments, int64(1), "the naive cache let concurrent duplicates charge again")
	require.Equal(t, int(b.Payments), provider.Charges())
	require.Equal(t, map[string]int64{"EUR": 500 * b.Payments}, b.Totals)
}

// TestNaiveReplaysAnotherBody shows the missing fingerprint: the same key
// with another amount gets the first payment's answer, and nothing else runs.
func TestNaiveReplaysAnotherBody(t *testing.T) {
	t.Parallel()
	s := startNaiveServer(t, &memCache{}, NewFakeProvider(0))
	first := s.postJSON("acme", "order-3", `{"amount":100,"currency":"USD","customer":"cus_3"}`)
	require.Equal(t, http.StatusCreated, first.status)
	second := s.postJSON("acme", "order-3", `{"amount":99999,"currency":"USD","customer":"cus_3"}`)
	require.Equal(t, http.StatusCreated, second.status)
	require.Equal(t, first.body, second.body)
	var p paymentJSON
	second.json(t, &p)
	require.EqualValues(t, 100, p.Amount)
}

// TestNaiveFailsOpen: with the cache down, every request runs.
func TestNaiveFailsOpen(t *testing.T) {
	t.Parallel()
	provider := NewFakeProvider(0)
	s := startNaiveServer(t, &memCache{getErr: errors.New("connection refused")}, provider)
	for range 3 {
		r := s.postJSON("acme", "order-4", `{"amount":7,"currency":"GBP","customer":"cus_4"}`)
		require.Equal(t, http.StatusCreated, r.status)
	}
	require.EqualValues(t, 3, s.balance("acme").Payments)
	require.Equal(t, 3, provider.Charges())
}

func TestNaiveDoesNotCacheServerErrors(t *testing.T) {
	t.Parallel()
	cache := &memCache{}
	s := startNaiveServer(t, cache, failingProvider{})
	r := s.postJSON("acme", "order-5", `{"amount":7,"currency":"GBP","customer":"cus_5"}`)
	require.Equal(t, http.StatusBadGateway, r.status)
	require.Zero(t, cache.sets)
	// A 4xx is cached, as the article does.
	r = s.postJSON("acme", "order-6", `{"amount":-1,"currency":"GBP","customer":"cus_5"}`)
	require.Equal(t, http.StatusBadRequest, r.status)
	require.Equal(t, 1, cache.sets)
	// Unprotected requests pass through.
	require.Equal(t, http.StatusBadRequest, s.do(http.MethodPost, "/v1/payments", `{}`,
		"Authorization", auth("acme"), "Content-Type", "application/json").status)
	require.Equal(t, http.StatusOK, s.get("acme", "/v1/payments").status)
	require.Equal(t, http.StatusUnauthorized, s.postJSON("", "k", `{}`).status)
}

type failingProvider struct{}

func (failingProvider) Charge(context.Context, ChargeRequest) (Charge, error) {
	return Charge{}, ErrProviderUnavailable
}

// TestNaiveOnRedis runs the naive cache on a real Redis server: a replay,
// and the double charge of concurrent duplicates.
func TestNaiveOnRedis(t *testing.T) {
	t.Parallel()
	cache := redisCacheForTest(t)
	provider := NewFakeProvider(200 * time.Millisecond)
	s := startNaiveServer(t, cache, provider)
	merchant := dbtest.Name("naive") // a fresh scope: Redis is shared
	const body = `{"amount":300,"currency":"JPY","customer":"cus_r"}`

	first := s.postJSON(merchant, "order-1", body)
	require.Equal(t, http.StatusCreated, first.status)
	again := s.postJSON(merchant, "order-1", body)
	require.Equal(t, "true", again.header.Get("Idempotent-Replayed"))
	require.Equal(t, first.body, again.body)
	raw, found, err := cache.Get(context.Background(), naiveKeyPrefix+merchant+":order-1")
	require.NoError(t, err)
	require.True(t, found)
	var stored naivecache.Response
	require.NoError(t, json.Unmarshal(raw, &stored))
	require.Equal(t, http.StatusCreated, stored.Status)
	ttl, err := cache.Client.TTL(context.Background(), naiveKeyPrefix+merchant+":order-1").Result()
	require.NoError(t, err)
	require.Greater(t, ttl, 50*time.Second)
	require.LessOrEqual(t, ttl, time.Minute)

	var wg sync.WaitGroup
	for range 4 {
		wg.Go(func() { s.postJSON(merchant, "order-2", body) })
	}
	wg.Wait()
	require.Greater(t, s.balance(merchant).Payments, int64(2), "order-1 once, order-2 more than once")
}

func TestNaiveFlags(t *testing.T) {
	t.Parallel()
	o, err := parseFlags(nil, io.Discard, nil)
	require.NoError(t, err)
	require.Equal(t, naiveOptions{}, o.naive)
	require.Equal(t, DefaultRedisURL, o.naive.url())
	require.Equal(t, DefaultNaiveTTL, o.naive.cacheTTL())

	o, err = parseFlags([]string{"--naive", "--redis-url", "redis://127.0.0.1:6380/2", "--naive-ttl", "1m"}, io.Discard, nil)
	require.NoError(t, err)
	require.Equal(t, naiveOptions{enabled: true, redisURL: "redis://127.0.0.1:6380/2", ttl: time.Minute}, o.naive)
	require.Equal(t, "naive (Redis 127.0.0.1:6380 db 2, TTL 1m0s)", o.naive.describe())

	for _, bad := range [][]string{
		{"--naive", "--redis-url", "http://127.0.0.1"},
		{"--naive", "--naive-ttl", "10ms"},
	} {
		_, err := parseFlags(bad, io.Discard, nil)
		require.Error(t, err, "%q", bad)
	}

	var fo naiveOptions
	fs := flag.NewFlagSet("x", flag.ContinueOnError)
	registerNaiveFlags(fs, &fo)
	require.NoError(t, fs.Parse([]string{"--naive"}))
	require.True(t, fo.enabled)
}

// TestRunNaive starts the whole service in naive mode on TEST_REDIS_URL,
// and refuses to start when Redis does not answer.
func TestRunNaive(t *testing.T) {
	t.Parallel()
	redisURL := dbtest.RequireURL(t, EnvRedis)
	s, stop := startRun(t, "--database-url", filepath.Join(t.TempDir(), "naive.db"), "--naive", "--redis-url", redisURL,
		"--naive-ttl", "1m", "--psp-latency", "0s")
	merchant := dbtest.Name("naive")
	first := s.postJSON(merchant, "k1", `{"amount":5,"currency":"EUR","customer":"c"}`)
	require.Equal(t, http.StatusCreated, first.status, "%s", first.body)
	again := s.postJSON(merchant, "k1", `{"amount":5,"currency":"EUR","customer":"c"}`)
	require.Equal(t, "true", again.header.Get("Idempotent-Replayed"))
	require.Contains(t, stop(), `"mode":"naive (Redis`)

	// No Redis there: paymentsd does not start.
	err := run(context.Background(), []string{"--addr", freeTestAddr(t), "--database-url", filepath.Join(t.TempDir(), "n.db"),
		"--naive", "--redis-url", "redis://" + freeTestAddr(t) + "/0"}, io.Discard)
	require.ErrorContains(t, err, "redis")
}
