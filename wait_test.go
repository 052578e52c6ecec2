package idem_test

import (
	"net/http"
	"net/http/httptest"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/idemgo/idem"
)

// heldHandler answers 201 "paid" once release is closed; started is closed
// when its first run starts.
type heldHandler struct {
	once             sync.Once
	started, release chan struct{}
	runs             int
	mu               sync.Mutex
}

func newHeld() *heldHandler {
	return &heldHandler{started: make(chan struct{}), release: make(chan struct{})}
}

func (h *heldHandler) ServeHTTP(w http.ResponseWriter, _ *http.Request) {
	h.mu.Lock()
	h.runs++
	h.mu.Unlock()
	h.once.Do(func() { close(h.started) })
	<-h.release
	w.WriteHeader(http.StatusCreated)
	_, _ = w.Write([]byte("paid"))
}

func waiting(t *testing.T, mw *idem.Middleware, n int) {
	t.Helper()
	deadline := time.Now().Add(time.Minute)
	for mw.Engine().Waiters() < n {
		require.True(t, time.Now().Before(deadline), "%d waiters, not %d", mw.Engine().Waiters(), n)
		time.Sleep(time.Millisecond) // a poll of the state, not a wait for it
	}
}

func prefer(v string) func(*http.Request) {
	return func(r *http.Request) { r.Header.Set("Prefer", v) }
}

// With MaxWait and no server default, a request that asks (Prefer: wait=N,
// N capped at MaxWait however large) waits for the owner and gets its
// replay; one that does not, or asks for wait=0, gets 409 at once.
func TestPreferWaitGetsTheReplay(t *testing.T) {
	h := newHeld()
	mw := newMiddleware(t, idem.Config{EngineConfig: idem.EngineConfig{MaxWait: time.Minute}})
	srv := mw.Handler(h)
	first := make(chan *httptest.ResponseRecorder, 1)
	go func() { first <- send(srv, http.MethodPost, "/pay", "k", `{"a":1}`) }()
	<-h.started
	for _, mutate := range [][]func(*http.Request){nil, {prefer("wait=0")}, {prefer("wait=nonsense")}} {
		rec := send(srv, http.MethodPost, "/pay", "k", `{"a":1}`, mutate...)
		require.Equal(t, http.StatusConflict, rec.Code)
		require.NotEmpty(t, rec.Header().Get("Retry-After"))
	}
	// Regression: a wait too large to parse was ignored (409 at once); it
	// is capped at MaxWait.
	asks := []string{"respond-async, wait=30", "wait=99999999999999999999"}
	dup := make(chan *httptest.ResponseRecorder, len(asks))
	for _, ask := range asks {
		go func() { dup <- send(srv, http.MethodPost, "/pay", "k", `{"a":1}`, prefer(ask)) }()
	}
	waiting(t, mw, len(asks))
	// Another payload under the key, asking to wait, is still 422 at once.
	require.Equal(t, http.StatusUnprocessableEntity, send(srv, http.MethodPost, "/pay", "k", `{"a":2}`, prefer("wait=30")).Code)
	close(h.release)
	require.Equal(t, http.StatusCreated, (<-first).Code)
	for range asks {
		rec := <-dup
		require.Equal(t, http.StatusCreated, rec.Code)
		require.Equal(t, "true", rec.Header().Get(idem.HeaderReplayed))
		require.Equal(t, "paid", rec.Body.String())
	}
	require.Equal(t, 1, h.runs)
}

// A server default wait applies to requests that ask for nothing; a
// request's own wait is bounded by MaxWait.
func TestServerDefaultWait(t *testing.T) {
	h := newHeld()
	mw := newMiddleware(t, idem.Config{EngineConfig: idem.EngineConfig{Wait: time.Minute}})
	srv := mw.Handler(h)
	first := make(chan *httptest.ResponseRecorder, 1)
	go func() { first <- send(srv, http.MethodPost, "/pay", "k", `{"a":1}`) }()
	<-h.started
	const n = 8
	dups := make(chan *httptest.ResponseRecorder, n)
	for range n {
		go func() { dups <- send(srv, http.MethodPost, "/pay", "k", `{"a":1}`) }()
	}
	waiting(t, mw, n)
	close(h.release)
	require.Equal(t, http.StatusCreated, (<-first).Code)
	for range n {
		rec := <-dups
		require.Equal(t, http.StatusCreated, rec.Code)
		require.Equal(t, "true", rec.Header().Get(idem.HeaderReplayed))
	}
	require.Equal(t, 1, h.runs)
}

func TestWaitConfigValidation(t *testing.T) {
	store := openSQLite(t)
	for _, cfg := range []idem.EngineConfig{
		{Wait: -time.Second},
		{Wait: time.Minute, MaxWait: time.Second},
		{MaxWaiters: -1},
		{WaitPoll: -time.Millisecond},
	} {
		cfg.Store = store
		_, err := idem.NewEngine(cfg)
		require.Error(t, err, "%+v", cfg)
	}
}
