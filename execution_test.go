package idem_test

import (
	"context"
	"database/sql"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/idemgo/idem"
	"github.com/idemgo/idem/idemdriver"
)

// Regression: a client that hung up during the claim cancelled a claim the
// database could already have committed; the key then stayed PROCESSING,
// run by nobody, for a whole lease.
func TestClientGoneBeforeClaim(t *testing.T) {
	t.Parallel()
	d := openSQLite(t)
	c := &counter{status: http.StatusCreated}
	h := newMiddleware(t, d, idem.Options{}).Handler(c)
	ctx, cancel := context.WithCancel(context.Background())
	cancel() // gone before idem even claimed
	send(h, "POST", "/x", "k", "{}", withContext(ctx))
	require.Equal(t, idemdriver.StateSucceeded, record(t, d, "global", "k").State, "the work is done and recorded; the retry replays")
	require.Equal(t, 1, c.runs)
}

// Regression: on SQLite the lease renewal waited for the write lock held by
// the handler's own business transaction, so a handler holding its
// transaction past a renewal tick was answered 503 and rolled back.
func TestSQLiteRenewalDoesNotWaitForOwnTransaction(t *testing.T) {
	t.Parallel()
	d := openSQLite(t)
	_, err := d.DB().Exec(`CREATE TABLE payments (id INTEGER PRIMARY KEY)`)
	require.NoError(t, err)
	mw := newMiddleware(t, d, idem.Options{Engine: idem.EngineOptions{Lease: idem.LeaseOptions{Duration: time.Second}}})
	h := mw.Handler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		tx, err := idem.Tx[*sql.Tx](r.Context())
		if err == nil {
			_, err = tx.ExecContext(r.Context(), `INSERT INTO payments DEFAULT VALUES`)
		}
		if err != nil {
			http.Error(w, err.Error(), http.StatusInternalServerError)
			return
		}
		// A slow handler holds its transaction across several renewal
		// ticks (every LeaseDuration/3).
		time.Sleep(1500 * time.Millisecond)
		w.WriteHeader(http.StatusCreated)
	}))
	rr := send(h, "POST", "/x", "k", "{}")
	require.Equal(t, http.StatusCreated, rr.Code, rr.Body.String())
	var n int
	require.NoError(t, d.DB().QueryRow(`SELECT count(*) FROM payments`).Scan(&n))
	require.Equal(t, 1, n)
}

// A context kept past the handler cannot open the claim's transaction.
func TestTxAfterExecutionEnded(t *testing.T) {
	t.Parallel()
	d := openSQLite(t)
	mw := newMiddleware(t, d, idem.Options{})
	var kept context.Context
	h := mw.Handler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		kept = r.Context()
		w.WriteHeader(http.StatusCreated)
	}))
	send(h, "POST", "/x", "k", "{}")
	_, err := idem.Tx[*sql.Tx](kept)
	require.ErrorIs(t, err, idem.ErrExecutionEnded)
}

// CONTRACT section 5: Set-Cookie, hop-by-hop headers, Date and
// Content-Length are never replayed, whatever the allow-list says; section 2:
// the protected methods are configurable, the others pass through.
func TestReplayAllowListAndMethods(t *testing.T) {
	t.Parallel()
	d := openSQLite(t)
	mw := newMiddleware(t, d, idem.Options{
		Methods: []string{"PUT"},
		Replay:  idem.ReplayOptions{Headers: []string{"Set-Cookie", "Date", "Connection", "X-Order"}},
	})
	runs := 0
	h := mw.Handler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		runs++
		w.Header().Set("Set-Cookie", "s=1")
		w.Header().Set("Date", "Mon, 30 Nov 2026 09:00:00 GMT")
		w.Header().Set("X-Order", "o-1")
		w.WriteHeader(http.StatusCreated)
	}))
	send(h, "PUT", "/x", "k", "{}")
	again := send(h, "PUT", "/x", "k", "{}")
	require.Equal(t, "true", again.Header().Get(idem.HeaderReplayed))
	require.Equal(t, "o-1", again.Header().Get("X-Order"))
	require.Empty(t, again.Header().Get("Set-Cookie"))
	require.Empty(t, again.Header().Get("Date"))
	require.Equal(t, 1, runs)
	// POST is not protected in this configuration: it runs every time.
	send(h, "POST", "/x", "k", "{}")
	send(h, "POST", "/x", "k", "{}")
	require.Equal(t, 3, runs)
}

// blockingHeartbeat is a store whose renewals wait for their context, as
// one waiting for a connection of an exhausted pool does; it reports how
// each one ended.
type blockingHeartbeat struct {
	idem.Store
	started chan struct{}
	ended   chan error
}

func (s *blockingHeartbeat) Heartbeat(ctx context.Context, _ idemdriver.FenceParams) (bool, error) {
	select {
	case s.started <- struct{}{}:
	default:
	}
	<-ctx.Done()
	s.ended <- ctx.Err()
	return false, ctx.Err()
}

// The end of the handler cancels a renewal in flight instead of waiting out
// its timeout (LeaseDuration/3). Regression: with a pool exhausted by the
// business transactions, every response waited for the blocked renewal.
func TestHandlerEndCancelsRenewal(t *testing.T) {
	t.Parallel()
	store := &blockingHeartbeat{Store: openSQLite(t), started: make(chan struct{}, 1), ended: make(chan error, 8)}
	mw := newMiddleware(t, store, idem.Options{Engine: idem.EngineOptions{Lease: idem.LeaseOptions{Duration: 3 * time.Second}}})
	h := mw.Handler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		<-store.started // a renewal is in flight
		w.WriteHeader(http.StatusCreated)
	}))
	rr := send(h, "POST", "/x", "k", "{}")
	require.Equal(t, http.StatusCreated, rr.Code, rr.Body.String())
	require.ErrorIs(t, <-store.ended, context.Canceled, "ended by the handler's end, not by its own timeout")
	require.Equal(t, idemdriver.StateSucceeded, record(t, store, "global", "k").State)
}

// A handler that runs past MaxExecution has its context cancelled with
// cause ErrExecutionTimeout; its answer is recorded as usual (here 503:
// FAILED), so the retry runs again. Regression: the heartbeat renewed the
// lease of a stuck handler for as long as its process lived, and every retry
// got 409.
func TestMaxExecution(t *testing.T) {
	t.Parallel()
	d := openSQLite(t)
	mw := newMiddleware(t, d, idem.Options{Engine: idem.EngineOptions{Lease: idem.LeaseOptions{Duration: time.Second, MaxExecution: time.Second}}})
	var causes []error
	h := mw.Handler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if len(causes) == 0 {
			<-r.Context().Done() // stuck until idem gives up on it
			causes = append(causes, context.Cause(r.Context()))
			w.WriteHeader(http.StatusServiceUnavailable)
			return
		}
		causes = append(causes, nil)
		w.WriteHeader(http.StatusCreated)
	}))
	require.Equal(t, http.StatusServiceUnavailable, send(h, "POST", "/x", "k", "{}").Code)
	require.ErrorIs(t, causes[0], idem.ErrExecutionTimeout)
	require.Equal(t, idemdriver.StateFailed, record(t, d, "global", "k").State)
	require.Equal(t, http.StatusCreated, send(h, "POST", "/x", "k", "{}").Code, "the retry runs again")
	require.Len(t, causes, 2)
}

// Regression: a SUCCEEDED record without its response (damaged by hand, a
// partial restore) answered 409 request-in-flight to every retry, forever.
// It answers 500 response-missing, and the handler is not run again.
func TestSucceededWithoutResponse(t *testing.T) {
	t.Parallel()
	d := openSQLite(t)
	c := &counter{status: http.StatusCreated}
	h := newMiddleware(t, d, idem.Options{}).Handler(c)
	require.Equal(t, http.StatusCreated, send(h, "POST", "/x", "k", "{}").Code)
	_, err := d.DB().Exec(`UPDATE idem_keys SET response_status = NULL, response_headers = NULL, response_body = NULL`)
	require.NoError(t, err)
	rec := record(t, d, idem.SingleTenantScope, "k")
	require.Equal(t, idemdriver.StateSucceeded, rec.State)
	require.Nil(t, rec.Response, "the record is damaged as the case needs")
	for range 2 {
		got := send(h, "POST", "/x", "k", "{}")
		requireKind(t, got, http.StatusInternalServerError, "response-missing")
		require.Empty(t, got.Header().Get("Retry-After"))
	}
	require.Equal(t, 1, c.runs)
}

// Regression: a SUCCEEDED record whose response columns were damaged but
// not emptied was answered as if whole or as if the store were down: a
// NULLed body column replayed an empty 201 (not the stored response byte
// for byte), a cut one replayed the part that was left, and headers that do
// not decode answered 503 "retry later" to every retry, forever. Each is
// answered 500 response-missing, and the handler is not run again.
func TestSucceededWithDamagedResponse(t *testing.T) {
	t.Parallel()
	for name, damage := range map[string]string{
		"NULL body":          `UPDATE idem_keys SET response_body = NULL`,
		"cut body":           `UPDATE idem_keys SET response_body = substr(response_body, 1, 3)`,
		"unreadable headers": `UPDATE idem_keys SET response_headers = x'00ff00ff'`,
	} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			d := openSQLite(t)
			runs := 0
			h := newMiddleware(t, d, idem.Options{Engine: idem.EngineOptions{Logger: slog.New(slog.DiscardHandler)}}).Handler(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
				runs++
				w.Header().Set("Location", "/payments/pay_1")
				w.WriteHeader(http.StatusCreated)
				_, _ = io.WriteString(w, `{"id":"pay_1","amount":100}`)
			}))
			first := send(h, "POST", "/x", "k", "{}")
			require.Equal(t, http.StatusCreated, first.Code)
			_, err := d.DB().Exec(damage)
			require.NoError(t, err)
			for range 2 {
				got := send(h, "POST", "/x", "k", "{}")
				requireKind(t, got, http.StatusInternalServerError, "response-missing")
				require.Empty(t, got.Header().Get(idem.HeaderReplayed))
			}
			require.Equal(t, 1, runs)
		})
	}
}

// ReleaseKey outside a protected execution, or after it ended, is an error
// the handler can see.
func TestReleaseKeyOutsideExecution(t *testing.T) {
	t.Parallel()
	require.ErrorIs(t, idem.ReleaseKey(context.Background()), idem.ErrNoExecution)
	var kept context.Context
	h := newMiddleware(t, nil, idem.Options{}).Handler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		kept = r.Context()
		w.WriteHeader(http.StatusCreated)
	}))
	require.Equal(t, http.StatusCreated, send(h, "POST", "/x", "k", "{}").Code)
	require.ErrorIs(t, idem.ReleaseKey(kept), idem.ErrExecutionEnded)
}

// refusingStore is a real store whose claims the database refuses as
// unstorable, as PostgreSQL refuses a value its text column cannot hold.
type refusingStore struct{ idem.Store }

func (refusingStore) Claim(context.Context, idemdriver.ClaimParams) (idemdriver.ClaimResult, error) {
	return idemdriver.ClaimResult{}, fmt.Errorf("idempgx: claim: %w (SQLSTATE 22021)", idemdriver.ErrUnstorable)
}

// A value the store refuses (idemdriver.ErrUnstorable) is a server fault
// answered 500 once, not a 503 store-unavailable that invites retries.
func TestStoreRefusesScope(t *testing.T) {
	t.Parallel()
	c := &counter{}
	h := newMiddleware(t, refusingStore{openSQLite(t)}, idem.Options{}).Handler(c)
	got := send(h, "POST", "/x", "k", "{}")
	requireKind(t, got, http.StatusInternalServerError, "scope-unstorable")
	require.Empty(t, got.Header().Get("Retry-After"))
	require.Zero(t, c.runs)
}
