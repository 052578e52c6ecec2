package idem_test

import (
	"context"
	"fmt"
	"log/slog"
	"net/http"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/idemgo/idem"
	"github.com/idemgo/idem/idemdriver"
	"github.com/idemgo/idem/idemsqlite"
)

// renewingStore is a SQLite store that counts its renewals: Renew calls
// with the leases each carried, and Heartbeat calls. The first Renew that
// carries want leases closes full and reports the lease of the key lose
// lost (the store renewed it).
type renewingStore struct {
	*idemsqlite.Driver
	lose string

	mu         sync.Mutex
	renewals   []int // leases per Renew call
	heartbeats int
	// full is closed by the first Renew that carries want leases, or the
	// first Heartbeat (then unbatched too).
	want      int
	full      chan struct{}
	unbatched chan struct{}
}

func (s *renewingStore) Renew(ctx context.Context, p idemdriver.RenewParams) ([]bool, error) {
	renewed, err := s.Driver.Renew(ctx, p)
	s.mu.Lock()
	defer s.mu.Unlock()
	s.renewals = append(s.renewals, len(p.Leases))
	if err == nil && len(p.Leases) == s.want && s.full != nil {
		for i, l := range p.Leases {
			if l.Key == s.lose {
				renewed[i] = false
			}
		}
		close(s.full)
		s.full = nil
	}
	return renewed, err
}

func (s *renewingStore) Heartbeat(ctx context.Context, p idemdriver.FenceParams) (bool, error) {
	s.mu.Lock()
	s.heartbeats++
	if s.full != nil { // not batched: let the handlers end, and the test fail
		close(s.full)
		close(s.unbatched)
		s.full = nil
	}
	s.mu.Unlock()
	return s.Driver.Heartbeat(ctx, p)
}

// The leases of an engine's executions in flight are renewed together:
// one Renew per tick carries all of them, and no execution sends a
// Heartbeat of its own. Each execution still learns alone that its lease
// was lost: only its handler's context is cancelled (ErrLeaseLost), and it
// is answered 409 while the others complete.
func TestRenewalsAreBatched(t *testing.T) {
	t.Parallel()
	const executions = 12
	store := &renewingStore{Driver: openSQLite(t), lose: "k0", want: executions, full: make(chan struct{}), unbatched: make(chan struct{})}
	g, err := idem.NewEngineWith(store, idem.EngineOptions{Lease: idem.LeaseOptions{Duration: time.Second}})
	require.NoError(t, err)
	full, unbatched := store.full, store.unbatched
	var wg sync.WaitGroup
	errs := make([]error, executions)
	causes := make([]error, executions)
	for i := range executions {
		wg.Add(1)
		go func() {
			defer wg.Done()
			key := fmt.Sprintf("k%d", i)
			_, errs[i] = g.Do(context.Background(), idem.DoParams{Scope: "acct", Key: key, Payload: []byte(key)},
				func(ctx context.Context) (idem.Result, error) {
					select {
					case <-full: // a renewal carried every lease
					case <-ctx.Done():
					}
					if i == 0 {
						select {
						case <-ctx.Done(): // its lease is reported lost
						case <-unbatched:
						}
					}
					causes[i] = context.Cause(ctx)
					return idem.Result{Status: http.StatusCreated}, nil
				})
		}()
	}
	wg.Wait()
	require.ErrorIs(t, errs[0], idem.ErrLeaseLost)
	require.ErrorIs(t, causes[0], idem.ErrLeaseLost)
	for i := 1; i < executions; i++ {
		require.NoError(t, errs[i], "k%d", i)
		require.NoError(t, causes[i], "k%d: its context was not cancelled", i)
	}
	store.mu.Lock()
	defer store.mu.Unlock()
	require.Zero(t, store.heartbeats, "no lease renewed alone")
	require.Contains(t, store.renewals, executions, "one Renew carried every lease: %v", store.renewals)
}

// MaxInFlight refuses the next request before it claims: 503 overloaded
// with Retry-After, no record of its key, its handler not run; once the
// execution in flight ends, the same request runs. A refusal is load, not a
// failure: it is counted by the observer (EventOverloaded) and logs nothing
// at ERROR (each one logged "outcome not recorded" before).
func TestMaxInFlightRefusesBeforeClaim(t *testing.T) {
	t.Parallel()
	store := openSQLite(t)
	obs := &events{}
	errs := &errorLog{}
	release := make(chan struct{})
	started := make(chan struct{})
	var runs atomic.Int32
	h := newMiddleware(t, store, idem.Options{Engine: idem.EngineOptions{Admission: idem.AdmissionOptions{MaxInFlight: 1}, Observer: obs, Logger: slog.New(errs), RetryAfter: idem.RetryAfterOptions{Store: 2 * time.Second}}}).Handler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if runs.Add(1) == 1 {
			close(started)
			<-release
		}
		w.WriteHeader(http.StatusCreated)
	}))
	first := make(chan int)
	go func() { first <- send(h, "POST", "/x", "a", "{}").Code }()
	<-started
	got := send(h, "POST", "/x", "b", "{}")
	requireKind(t, got, http.StatusServiceUnavailable, "overloaded")
	require.Equal(t, "2", got.Header().Get("Retry-After"))
	require.Equal(t, idem.EventOverloaded, obs.takeOne(t, idem.EventOverloaded).Kind)
	_, err := store.Get(t.Context(), idemdriver.GetParams{Scope: idem.SingleTenantScope, Key: "b"})
	require.ErrorIs(t, err, idemdriver.ErrNotFound, "nothing claimed")
	require.EqualValues(t, 1, runs.Load(), "the refused handler did not run")
	require.Empty(t, errs.messages(), "a refusal logs no error")
	close(release)
	require.Equal(t, http.StatusCreated, <-first)
	require.Equal(t, http.StatusCreated, send(h, "POST", "/x", "b", "{}").Code, "the retry runs once the bound allows")
	require.EqualValues(t, 2, runs.Load())
}

// Do refuses past MaxInFlight with ErrOverloaded, fn not run.
func TestMaxInFlightDo(t *testing.T) {
	t.Parallel()
	g, err := idem.NewEngineWith(openSQLite(t), idem.EngineOptions{Admission: idem.AdmissionOptions{MaxInFlight: 1}})
	require.NoError(t, err)
	inside := make(chan struct{})
	done := make(chan error)
	go func() {
		_, err := g.Do(context.Background(), idem.DoParams{Scope: "s", Key: "a"}, func(context.Context) (idem.Result, error) {
			inside <- struct{}{}
			<-inside
			return idem.Result{Status: 200}, nil
		})
		done <- err
	}()
	<-inside
	ran := false
	_, err = g.Do(context.Background(), idem.DoParams{Scope: "s", Key: "b"}, func(context.Context) (idem.Result, error) {
		ran = true
		return idem.Result{}, nil
	})
	require.ErrorIs(t, err, idem.ErrOverloaded)
	require.False(t, ran)
	inside <- struct{}{}
	require.NoError(t, <-done)
}

// errorLog is a slog.Handler that keeps the messages of records at ERROR
// and above.
type errorLog struct {
	mu   sync.Mutex
	msgs []string
}

func (h *errorLog) Enabled(_ context.Context, l slog.Level) bool { return l >= slog.LevelError }
func (h *errorLog) Handle(_ context.Context, r slog.Record) error {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.msgs = append(h.msgs, r.Message)
	return nil
}
func (h *errorLog) WithAttrs([]slog.Attr) slog.Handler { return h }
func (h *errorLog) WithGroup(string) slog.Handler      { return h }

func (h *errorLog) messages() []string {
	h.mu.Lock()
	defer h.mu.Unlock()
	return append([]string(nil), h.msgs...)
}
