package idem_test

import (
	"context"
	"net/http"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/idemgo/idem"
)

// replayCacheEnv serves POST /pay through a middleware with cfg on a store
// of its own, counting the handler's runs.
func replayCacheEnv(t *testing.T, cfg idem.Options) (h http.Handler, runs *atomic.Int64, closeStore func(), obs *events) {
	t.Helper()
	d := openSQLite(t)
	obs = &events{}
	cfg.Engine.Observer = obs
	runs = &atomic.Int64{}
	h = newMiddleware(t, d, cfg).Handler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		runs.Add(1)
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusCreated)
		_, err := w.Write([]byte(`{"id":"pay_1"}`))
		require.NoError(t, err)
	}))
	return h, runs, func() { require.NoError(t, d.Close()) }, obs
}

// With ReplayCacheBytes, a key this process has replayed once is answered
// from memory: its replay and its 422 need no store (here, a closed one),
// while every other key still goes to the store.
func TestReplayCacheAnswersWithoutTheStore(t *testing.T) {
	t.Parallel()
	h, runs, closeStore, obs := replayCacheEnv(t, idem.Options{Replay: idem.ReplayOptions{Cache: idem.ReplayCacheOptions{Bytes: 1 << 20}}})
	first := send(h, "POST", "/pay", "k1", `{"amount":100}`)
	require.Equal(t, http.StatusCreated, first.Code)
	obs.takeOne(t, idem.EventExecuted)
	fromStore := send(h, "POST", "/pay", "k1", `{"amount":100}`)
	require.Equal(t, "true", fromStore.Header().Get(idem.HeaderReplayed))
	require.False(t, obs.takeOne(t, idem.EventReplayed).Cached)

	closeStore()
	cached := send(h, "POST", "/pay", "k1", ` { "amount" : 100 } `) // the same request, reformatted
	require.Equal(t, http.StatusCreated, cached.Code, cached.Body.String())
	require.Equal(t, "true", cached.Header().Get(idem.HeaderReplayed))
	require.Equal(t, first.Body.String(), cached.Body.String())
	require.Equal(t, fromStore.Header().Get(idem.HeaderKeyExpires), cached.Header().Get(idem.HeaderKeyExpires))
	require.Equal(t, "k1", cached.Header().Get(idem.HeaderKey))
	ev := obs.takeOne(t, idem.EventReplayed)
	require.True(t, ev.Cached)
	require.Zero(t, ev.Claim)

	reused := send(h, "POST", "/pay", "k1", `{"amount":200}`)
	require.Equal(t, http.StatusUnprocessableEntity, reused.Code, reused.Body.String())
	require.True(t, obs.takeOne(t, idem.EventKeyReused).Cached)

	other := send(h, "POST", "/pay", "k2", `{"amount":100}`)
	require.Equal(t, http.StatusServiceUnavailable, other.Code, "a key the cache does not hold goes to the store")
	require.Empty(t, other.Header().Get(idem.HeaderKeyExpires), "a failed claim advertises no expiry")
	obs.takeOne(t, idem.EventStoreUnavailable)
	require.EqualValues(t, 1, runs.Load())
}

// The cache keeps an answer no longer than ReplayCacheTTL, and is off by
// default: then every retry reads the store.
func TestReplayCacheBounds(t *testing.T) {
	t.Parallel()
	for name, cfg := range map[string]idem.Options{
		"off by default": {},
		"TTL ran out":    {Replay: idem.ReplayOptions{Cache: idem.ReplayCacheOptions{Bytes: 1 << 20, TTL: time.Nanosecond}}},
	} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			h, runs, closeStore, _ := replayCacheEnv(t, cfg)
			require.Equal(t, http.StatusCreated, send(h, "POST", "/pay", "k1", `{}`).Code)
			require.Equal(t, "true", send(h, "POST", "/pay", "k1", `{}`).Header().Get(idem.HeaderReplayed))
			closeStore()
			got := send(h, "POST", "/pay", "k1", `{}`)
			require.Equal(t, http.StatusServiceUnavailable, got.Code, got.Body.String())
			require.EqualValues(t, 1, runs.Load())
		})
	}
}

// A negative size or TTL is refused by NewMiddleware.
func TestReplayCacheConfig(t *testing.T) {
	t.Parallel()
	_, err := idem.NewMiddleware(openSQLite(t), idem.Options{Scope: idem.SingleTenant, Replay: idem.ReplayOptions{Cache: idem.ReplayCacheOptions{Bytes: -1}}})
	require.ErrorContains(t, err, "Replay.Cache.Bytes must not be negative")
	require.Equal(t, idem.DefaultReplayCacheTTL, idem.Options{Replay: idem.ReplayOptions{Cache: idem.ReplayCacheOptions{Bytes: 1}}}.WithDefaults().Replay.Cache.TTL)
	require.Zero(t, idem.Options{}.WithDefaults().Replay.Cache.TTL)
}

// Regression: a replay from the cache handed the cached record's header
// values to the response writer, so a middleware that edited one in place
// (an absolute Location) changed every later replay of the key.
func TestReplayCacheAnswersAreCopies(t *testing.T) {
	t.Parallel()
	d := openSQLite(t)
	mw := newMiddleware(t, d, idem.Options{Replay: idem.ReplayOptions{Cache: idem.ReplayCacheOptions{Bytes: 1 << 20}}})
	inner := mw.Handler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Location", "/v1/payments/pay_1")
		w.WriteHeader(http.StatusCreated)
	}))
	absolute := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		inner.ServeHTTP(prefixLocation{w}, r)
	})
	for i := range 4 { // executed, replayed from the store, then twice from the cache
		got := send(absolute, "POST", "/pay", "k1", `{}`)
		require.Equal(t, "https://api.example.com/v1/payments/pay_1", got.Header().Get("Location"), "answer %d", i)
	}
}

// prefixLocation makes the Location header absolute in place, as a
// middleware may.
type prefixLocation struct{ http.ResponseWriter }

func (p prefixLocation) WriteHeader(status int) {
	if v := p.Header()["Location"]; len(v) > 0 {
		v[0] = "https://api.example.com" + v[0]
	}
	p.ResponseWriter.WriteHeader(status)
}

// The one-commit mode keeps its replays in the cache too.
func TestReplayCacheInOneCommitMode(t *testing.T) {
	t.Parallel()
	h, runs, closeStore, obs := replayCacheEnv(t, idem.Options{Engine: idem.EngineOptions{OneCommit: idem.OneCommitOptions{Enabled: true}}, Replay: idem.ReplayOptions{Cache: idem.ReplayCacheOptions{Bytes: 1 << 20}}})
	require.Equal(t, http.StatusCreated, send(h, "POST", "/pay", "k1", `{}`).Code)
	require.Equal(t, "true", send(h, "POST", "/pay", "k1", `{}`).Header().Get(idem.HeaderReplayed))
	closeStore()
	_ = obs.take()
	got := send(h, "POST", "/pay", "k1", `{}`)
	require.Equal(t, http.StatusCreated, got.Code, got.Body.String())
	require.True(t, obs.takeOne(t, idem.EventReplayed).Cached)
	require.EqualValues(t, 1, runs.Load())
}

// The replay cache belongs to the middleware's Engine (ReplayCacheOptions):
// Do on Middleware.Engine() answers a key it replayed once from memory,
// with the store closed, and fn does not run.
func TestReplayCacheAnswersDo(t *testing.T) {
	t.Parallel()
	d := openSQLite(t)
	obs := &events{}
	m := newMiddleware(t, d, idem.Options{Engine: idem.EngineOptions{Observer: obs},
		Replay: idem.ReplayOptions{Cache: idem.ReplayCacheOptions{Bytes: 1 << 20}}})
	var runs atomic.Int64
	fn := func(context.Context) (idem.Result, error) {
		runs.Add(1)
		return idem.Result{Status: http.StatusCreated, Body: []byte("ok")}, nil
	}
	p := idem.DoParams{Scope: "acct", Key: "do-1", Payload: []byte(`{"amount":100}`)}
	for _, want := range []idem.EventKind{idem.EventExecuted, idem.EventReplayed} {
		_, err := m.Engine().Do(t.Context(), p, fn)
		require.NoError(t, err)
		require.False(t, obs.takeOne(t, want).Cached)
	}
	require.NoError(t, d.Close())
	out, err := m.Engine().Do(t.Context(), p, fn)
	require.NoError(t, err)
	require.Equal(t, "ok", string(out.Body))
	require.True(t, obs.takeOne(t, idem.EventReplayed).Cached)
	require.EqualValues(t, 1, runs.Load())
}
