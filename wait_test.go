package idem_test

import (
	"net/http"
	"net/http/httptest"
	"sync"
	"sync/atomic"
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
	mw := newMiddleware(t, nil, idem.Options{Engine: idem.EngineOptions{Waiting: idem.WaitOptions{Max: time.Minute}}})
	srv := mw.Handler(h)
	first := make(chan *httptest.ResponseRecorder, 1)
	go func() { first <- send(srv, http.MethodPost, "/pay", "k", `{"a":1}`) }()
	<-h.started
	for _, mutate := range [][]func(*http.Request){nil, {prefer("wait=0")}, {prefer("wait=nonsense")},
		{prefer(`foo="a, wait=60", wait=0`)}} { // a quoted string's comma separates nothing
		rec := send(srv, http.MethodPost, "/pay", "k", `{"a":1}`, mutate...)
		require.Equal(t, http.StatusConflict, rec.Code)
		require.NotEmpty(t, rec.Header().Get("Retry-After"))
		require.Empty(t, rec.Header().Values(idem.HeaderPreferenceApplied), "no wait, none applied")
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
	applied := map[string]bool{}
	for range asks {
		rec := <-dup
		require.Equal(t, http.StatusCreated, rec.Code)
		require.Equal(t, "true", rec.Header().Get(idem.HeaderReplayed))
		require.Equal(t, "paid", rec.Body.String())
		applied[rec.Header().Get(idem.HeaderPreferenceApplied)] = true
	}
	// RFC 7240 section 3: the wait applied, after the cap at MaxWait.
	require.Equal(t, map[string]bool{"wait=30": true, "wait=60": true}, applied)
	// A replay that waited for nothing names no preference applied.
	later := send(srv, http.MethodPost, "/pay", "k", `{"a":1}`, prefer("wait=30"))
	require.Equal(t, "true", later.Header().Get(idem.HeaderReplayed))
	require.Empty(t, later.Header().Values(idem.HeaderPreferenceApplied))
	require.Equal(t, 1, h.runs)
}

// Preference-Applied (RFC 7240 section 3) names the wait of a request that
// waited, whatever ends its wait: the handler's own run (its key's owner
// failed, this request claimed it), beside the handler's own applied
// preferences, or 409 when the wait runs out. It is never stored nor
// replayed, even when ReplayHeaders names it; a request that waits by the
// server's default (Wait) asked for nothing, and gets none.
func TestPreferenceApplied(t *testing.T) {
	t.Parallel()
	d := openSQLite(t)
	started, release := make(chan struct{}), make(chan struct{})
	var runs atomic.Int32
	mw := newMiddleware(t, d, idem.Options{
		Engine: idem.EngineOptions{Waiting: idem.WaitOptions{Max: time.Minute}},
		Replay: idem.ReplayOptions{Headers: append(idem.DefaultReplayHeaders(), idem.HeaderPreferenceApplied)},
	})
	h := mw.Handler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if runs.Add(1) == 1 && r.URL.Path == "/fails" {
			close(started)
			<-release
			w.WriteHeader(http.StatusServiceUnavailable) // FAILED: the waiter claims
			return
		}
		w.Header().Set(idem.HeaderPreferenceApplied, "return=minimal")
		w.WriteHeader(http.StatusCreated)
	}))
	first := make(chan *httptest.ResponseRecorder, 1)
	go func() { first <- send(h, http.MethodPost, "/fails", "k", `{}`) }()
	<-started
	waiter := make(chan *httptest.ResponseRecorder, 1)
	go func() { waiter <- send(h, http.MethodPost, "/fails", "k", `{}`, prefer("wait=20")) }()
	waiting(t, mw, 1)
	close(release)
	require.Equal(t, http.StatusServiceUnavailable, (<-first).Code)
	ran := <-waiter
	require.Equal(t, http.StatusCreated, ran.Code)
	require.Empty(t, ran.Header().Get(idem.HeaderReplayed), "its own run")
	require.Equal(t, []string{"return=minimal", "wait=20"}, ran.Header().Values(idem.HeaderPreferenceApplied))
	require.Equal(t, int32(2), runs.Load())
	rec := record(t, d, idem.SingleTenantScope, "k")
	require.NotContains(t, rec.Response.Header, idem.HeaderPreferenceApplied, "never stored")
	replay := send(h, http.MethodPost, "/fails", "k", `{}`, prefer("wait=20"))
	require.Equal(t, "true", replay.Header().Get(idem.HeaderReplayed))
	require.Empty(t, replay.Header().Values(idem.HeaderPreferenceApplied), "never replayed")
}

// A wait that runs out is answered 409 with the wait applied; a request
// that waited by the server's default names no preference.
func TestPreferenceAppliedTo409(t *testing.T) {
	t.Parallel()
	held := newHeld()
	defer close(held.release)
	mw := newMiddleware(t, nil, idem.Options{Engine: idem.EngineOptions{Waiting: idem.WaitOptions{Wait: time.Second, Max: time.Second}}})
	h := mw.Handler(held)
	go send(h, http.MethodPost, "/pay", "k", `{}`)
	<-held.started
	ran := send(h, http.MethodPost, "/pay", "k", `{}`, prefer("wait=5")) // capped at MaxWait: 1 s
	require.Equal(t, http.StatusConflict, ran.Code)
	require.Equal(t, []string{"wait=1"}, ran.Header().Values(idem.HeaderPreferenceApplied))
	byDefault := send(h, http.MethodPost, "/pay", "k", `{}`) // waits Wait, 1 s
	require.Equal(t, http.StatusConflict, byDefault.Code)
	require.Empty(t, byDefault.Header().Values(idem.HeaderPreferenceApplied))
}

// A server default wait applies to requests that ask for nothing; a
// request's own wait is bounded by MaxWait.
func TestServerDefaultWait(t *testing.T) {
	h := newHeld()
	mw := newMiddleware(t, nil, idem.Options{Engine: idem.EngineOptions{Waiting: idem.WaitOptions{Wait: time.Minute}}})
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
	for _, cfg := range []idem.EngineOptions{
		{Waiting: idem.WaitOptions{Wait: -time.Second}},
		{Waiting: idem.WaitOptions{Wait: time.Minute, Max: time.Second}},
		{Waiting: idem.WaitOptions{MaxWaiters: -1}},
		{Waiting: idem.WaitOptions{Poll: -time.Millisecond}},
	} {
		_, err := idem.NewEngineWith(store, cfg)
		require.Error(t, err, "%+v", cfg)
	}
}

// One-commit mode: a request behind this process's own execution of its
// key waits whatever it asked; it names the wait applied when it asked for
// one.
func TestPreferenceAppliedOneCommit(t *testing.T) {
	t.Parallel()
	held := newHeld()
	mw := newMiddleware(t, nil, idem.Options{Engine: idem.EngineOptions{OneCommit: idem.OneCommitOptions{Enabled: true}, Waiting: idem.WaitOptions{Max: time.Minute}}})
	h := mw.Handler(held)
	first := make(chan *httptest.ResponseRecorder, 1)
	go func() { first <- send(h, http.MethodPost, "/pay", "k", `{}`) }()
	<-held.started
	dups := make(chan *httptest.ResponseRecorder, 2)
	for _, mutate := range [][]func(*http.Request){{prefer("wait=30")}, nil} {
		go func() { dups <- send(h, http.MethodPost, "/pay", "k", `{}`, mutate...) }()
	}
	waiting(t, mw, 2)
	close(held.release)
	require.Equal(t, http.StatusCreated, (<-first).Code)
	applied := map[string]bool{}
	for range 2 {
		rec := <-dups
		require.Equal(t, http.StatusCreated, rec.Code)
		require.Equal(t, "true", rec.Header().Get(idem.HeaderReplayed))
		applied[rec.Header().Get(idem.HeaderPreferenceApplied)] = true
	}
	require.Equal(t, map[string]bool{"wait=30": true, "": true}, applied)
	require.Equal(t, 1, held.runs)
}
