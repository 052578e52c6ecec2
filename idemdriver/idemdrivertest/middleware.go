package idemdrivertest

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/idemgo/idem"
	idemfingerprint "github.com/idemgo/idem/fingerprint"
	"github.com/idemgo/idem/idemdriver"
)

// app is the protected handler of the middleware cases: it counts its runs,
// can hold on a gate, answers a chosen status, and can write a business row
// in the claim's transaction.
type app struct {
	runs      atomic.Int32
	started   chan struct{} // receives on the first run, when set
	gate      chan struct{} // the handler waits for it to close, when set
	status    func(run int32) int
	biz       Business     // when set, each run inserts a row "<key>/<run>" in the claim's tx
	panicOn   int32        // the run that panics, when non-zero
	bigBody   int          // when non-zero, the body is this many bytes
	rowPrefix string       // prefix of the business rows' ids
	ctxErr    atomic.Value // string: the handler's context error (or cause) as it returned
	gateOnce  sync.Once
	writes    handlerWrites // checked by newServer when the test ends
}

// handlerWrites records the errors of a case's handler writes, and fails the
// case on them once its servers have closed (and their handlers returned):
// an answer cut short is not the one the client read.
type handlerWrites struct {
	mu   sync.Mutex
	errs []error
}

// checkWrites returns a record of t's handler writes. Call it before
// starting the servers, so that its check runs after they close.
func checkWrites(t *testing.T) *handlerWrites {
	w := &handlerWrites{}
	t.Cleanup(func() { w.check(t) })
	return w
}

func (hw *handlerWrites) record(err error) {
	if err != nil {
		hw.mu.Lock()
		defer hw.mu.Unlock()
		hw.errs = append(hw.errs, err)
	}
}

// printf writes a handler's body with fmt.Fprintf, recording its error.
func (hw *handlerWrites) printf(w io.Writer, format string, args ...any) {
	_, err := fmt.Fprintf(w, format, args...)
	hw.record(err)
}

// write writes a handler's body, recording its error.
func (hw *handlerWrites) write(w io.Writer, b []byte) {
	_, err := w.Write(b)
	hw.record(err)
}

func (hw *handlerWrites) check(t *testing.T) {
	t.Helper()
	hw.mu.Lock()
	defer hw.mu.Unlock()
	require.NoError(t, errors.Join(hw.errs...), "a handler's answer was cut short")
}

// insertRow writes the business row id in the claim's transaction, which
// r's context carries.
func insertRow(r *http.Request, biz Business, id string) error {
	tx, err := idem.Tx[any](r.Context())
	if err != nil {
		return err
	}
	return biz.Insert(r.Context(), tx, id)
}

// release opens the gate (once; also when the test ends, so that a failed
// test does not leave handlers waiting and the server's Close hanging).
func (a *app) release() {
	if a.gate != nil {
		a.gateOnce.Do(func() { close(a.gate) })
	}
}

func (a *app) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	run := a.runs.Add(1)
	if a.started != nil {
		select { // only the first run is waited for; a second run must not hang the test
		case a.started <- struct{}{}:
		default:
		}
	}
	if a.gate != nil {
		select {
		case <-a.gate:
		case <-r.Context().Done():
			a.ctxErr.Store(fmt.Sprint(context.Cause(r.Context())))
			w.WriteHeader(http.StatusServiceUnavailable)
			return
		}
	}
	a.ctxErr.Store(fmt.Sprint(r.Context().Err()))
	if run == a.panicOn {
		panic("handler bug")
	}
	body, _ := io.ReadAll(r.Body)
	status := http.StatusCreated
	if a.status != nil {
		status = a.status(run)
	}
	if a.biz != nil {
		if err := insertRow(r, a.biz, fmt.Sprintf("%s%s/%d", a.rowPrefix, r.Header.Get("Idempotency-Key"), run)); err != nil {
			http.Error(w, err.Error(), http.StatusInternalServerError)
			return
		}
	}
	h := w.Header()
	h.Set("Content-Type", "application/json")
	h.Set("Location", fmt.Sprintf("/v1/payments/pay_%d", run))
	h.Set("Set-Cookie", "session=secret")
	h.Set("X-Internal", "not replayed")
	w.WriteHeader(status)
	if a.bigBody > 0 {
		a.writes.write(w, bytes.Repeat([]byte("x"), a.bigBody))
		return
	}
	a.writes.printf(w, `{"run":%d,"body":%q}`, run, body)
}

type server struct {
	*httptest.Server
	app *app
}

// serve starts handler behind idem with cfg on store (the single-tenant
// scope unless cfg says otherwise), on a server closed when t ends. A request
// that hangs (a second handler run held on a gate) fails the test, at the
// client's timeout, instead of stalling the suite.
func serve(t *testing.T, store idem.Store, cfg idem.Options, handler http.Handler) *server {
	t.Helper()
	if cfg.Scope == nil {
		cfg.Scope = idem.SingleTenant
	}
	m, err := idem.NewMiddleware(store, cfg)
	require.NoError(t, err)
	srv := httptest.NewServer(m.Handler(handler))
	t.Cleanup(srv.Close)
	srv.Client().Timeout = 30 * time.Second
	return &server{Server: srv, app: &app{}}
}

// newServer serves a (see serve), checks its writes once the server has
// closed, and opens its gate before that.
func newServer(t *testing.T, store idem.Store, cfg idem.Options, a *app) *server {
	t.Helper()
	t.Cleanup(func() { a.writes.check(t) }) // runs after srv.Close
	s := serve(t, store, cfg, a)
	s.app = a
	t.Cleanup(a.release) // runs before srv.Close
	return s
}

type answer struct {
	status  int
	header  http.Header
	trailer http.Header
	body    []byte
	err     error
}

func (s *server) post(t *testing.T, key, body string, mutate ...func(*http.Request)) answer {
	t.Helper()
	return s.do(context.Background(), http.MethodPost, "/v1/payments", key, body, mutate...)
}

func (s *server) do(ctx context.Context, method, path, key, body string, mutate ...func(*http.Request)) answer {
	req, err := http.NewRequestWithContext(ctx, method, s.URL+path, strings.NewReader(body))
	if err != nil {
		return answer{err: err}
	}
	req.Header.Set("Content-Type", "application/json")
	if key != "" {
		req.Header.Set("Idempotency-Key", key)
	}
	for _, f := range mutate {
		f(req)
	}
	resp, err := s.Client().Do(req)
	if err != nil {
		return answer{err: err}
	}
	b, err := io.ReadAll(resp.Body) // the trailers arrive after the body
	if cerr := resp.Body.Close(); err == nil {
		err = cerr
	}
	return answer{status: resp.StatusCode, header: resp.Header, trailer: resp.Trailer, body: b, err: err}
}

// requireProblem checks an RFC 9457 answer of the given kind.
func requireProblem(t *testing.T, a answer, status int, slug string) {
	t.Helper()
	require.NoError(t, a.err)
	require.Equal(t, status, a.status, "body: %s", a.body)
	require.Equal(t, "application/problem+json", a.header.Get("Content-Type"))
	var p map[string]any
	require.NoError(t, json.Unmarshal(a.body, &p))
	require.Equal(t, idem.ProblemTypeBase+slug, p["type"])
	require.EqualValues(t, status, p["status"])
	require.NotEmpty(t, p["title"])
	require.NotEmpty(t, p["detail"])
}

func requireReplay(t *testing.T, first, again answer) {
	t.Helper()
	require.NoError(t, again.err)
	require.Equal(t, first.status, again.status)
	require.Equal(t, "true", again.header.Get(idem.HeaderReplayed))
	require.True(t, bytes.Equal(first.body, again.body), "replay must be byte-exact: %q vs %q", first.body, again.body)
	require.Equal(t, first.header.Get("Content-Type"), again.header.Get("Content-Type"))
	require.Equal(t, first.header.Get("Location"), again.header.Get("Location"))
	require.Empty(t, again.header.Get("Set-Cookie"), "Set-Cookie is never replayed")
	require.Empty(t, again.header.Get("X-Internal"), "only allow-listed headers are replayed")
}

// requireFencedOut serves slow and fast on d, two servers on one database,
// fast's seeing the clock past the lease. slow's request for "k" is held
// (slow must have a gate and started) while fast takes the key over and
// answers 201; then slow's answer is 409 request-in-flight (fenced out: its
// outcome is not recorded), and a retry on slow's server gets fast's replay.
func requireFencedOut(t *testing.T, d idemdriver.Driver, slow, fast *app) {
	t.Helper()
	later := &Clock{}
	later.Advance(idem.DefaultLeaseDuration + time.Second)
	s1 := newServer(t, d, idem.Options{}, slow)
	s2 := newServer(t, Shift(d, later), idem.Options{}, fast)
	done := make(chan answer)
	go func() { done <- s1.post(t, "k", `{}`) }()
	<-slow.started
	took := s2.post(t, "k", `{}`)
	require.Equal(t, 201, took.status)
	slow.release()
	requireProblem(t, <-done, 409, "request-in-flight")
	requireReplay(t, took, s1.post(t, "k", `{}`))
}

// requireCommittedOnce checks a first answer (to POST "k" {}) of 201,
// replayed to the retry, with its business row committed and the handler
// run once (runs).
func requireCommittedOnce(t *testing.T, s *server, first answer, biz Business, row string, runs int32) {
	t.Helper()
	require.Equal(t, http.StatusCreated, first.status, "%s", first.body)
	requireReplay(t, first, s.post(t, "k", `{}`))
	require.Equal(t, 1, rows(t, biz, row))
	require.EqualValues(t, 1, runs)
}

func retryAfter(t *testing.T, a answer) int {
	t.Helper()
	n, err := strconv.Atoi(a.header.Get("Retry-After"))
	require.NoError(t, err, "Retry-After %q", a.header.Get("Retry-After"))
	return n
}

// newHandlerServer serves handler (see serve), with a silent logger unless
// cfg says otherwise.
func newHandlerServer(t *testing.T, store idem.Store, cfg idem.Options, handler http.HandlerFunc) *server {
	t.Helper()
	if cfg.Engine.Logger == nil {
		cfg.Engine.Logger = slog.New(slog.DiscardHandler)
	}
	return serve(t, store, cfg, handler)
}

func runMiddleware(t *testing.T, h Harness) {
	runEdges(t, h)
	runCases(t, h, []suiteCase{
		{"FirstRunThenReplay", middlewareFirstRunThenReplay},
		{"KeyForms", middlewareKeyForms},
		{"InvalidKeys", middlewareInvalidKeys},
		{"RequestTooLarge", middlewareRequestTooLarge},
		{"JSONCanonicalFingerprint", middlewareJSONCanonicalFingerprint},
		{"KeyReusedInEveryState", middlewareKeyReusedInEveryState},
		{"InFlight409", middlewareInFlight409},
		{"ConcurrentDuplicates", middlewareConcurrentDuplicates},
		{"TakeoverAfterLeaseExpiry", middlewareTakeoverAfterLeaseExpiry},
		{"FencedOutFailure", middlewareFencedOutFailure},
		{"LostLeaseCancelsHandler", middlewareLostLeaseCancelsHandler},
		{"FailedOutcomesRunAgain", middlewareFailedOutcomesRunAgain},
		{"PanicRecordsFailed", middlewarePanicRecordsFailed},
		{"ClientDisconnects", middlewareClientDisconnects},
		{"StoreUnavailable", middlewareStoreUnavailable},
		{"UnprotectedRequestsPassThrough", middlewareUnprotectedRequestsPassThrough},
		{"ResponseTooLargeToStore", middlewareResponseTooLargeToStore},
		{"BusinessWritesCommitWithOutcome", middlewareBusinessWritesCommitWithOutcome},
		{"MaxExecutionRollsBack", middlewareMaxExecutionRollsBack},
		{"HandlerCommitsItself", middlewareHandlerCommitsItself},
		{"ExpiredKeyIsNew", middlewareExpiredKeyIsNew},
		{"RelayKeyPerLife", middlewareRelayKeyPerLife},
		{"StatementBudget", middlewareStatementBudget},
		{"ScopesNeverMeet", middlewareScopesNeverMeet},
		{"SealedOnlyRefusesPlain", middlewareSealedOnly},
		{"DamagedRecord", middlewareDamagedRecord},
		{"SealTagBindsStatus", middlewareSealTagBindsStatus},
	})
}

func middlewareFirstRunThenReplay(t *testing.T, h Harness) {
	t.Parallel()
	s := newServer(t, h.NewDriver(t), idem.Options{}, &app{})
	first := s.post(t, "k1", `{"amount":100}`)
	require.NoError(t, first.err)
	require.Equal(t, http.StatusCreated, first.status)
	require.Empty(t, first.header.Get(idem.HeaderReplayed))
	require.Equal(t, "session=secret", first.header.Get("Set-Cookie"), "the first caller gets every header")
	again := s.post(t, "k1", `{"amount":100}`)
	requireReplay(t, first, again)
	require.EqualValues(t, 1, s.app.runs.Load())
}

func middlewareKeyForms(t *testing.T, h Harness) {
	t.Parallel()
	s := newServer(t, h.NewDriver(t), idem.Options{}, &app{})
	first := s.post(t, `"abc-123"`, `{}`)
	require.Equal(t, http.StatusCreated, first.status)
	requireReplay(t, first, s.post(t, `abc-123`, `{}`))
	requireReplay(t, first, s.post(t, `"abc-123";v=1`, `{}`))
	require.EqualValues(t, 1, s.app.runs.Load())
	// A quoted key may hold a comma: it is one sf-string, not a list.
	require.Equal(t, http.StatusCreated, s.post(t, `"a,b"`, `{}`).status)
}

func middlewareInvalidKeys(t *testing.T, h Harness) {
	t.Parallel()
	s := newServer(t, h.NewDriver(t), idem.Options{}, &app{})
	requireProblem(t, s.post(t, "", `{}`), 400, "missing-key")
	twoLines := func(r *http.Request) { r.Header.Add("Idempotency-Key", "k") }
	requireProblem(t, s.post(t, "k", `{}`, twoLines), 400, "invalid-key")
	for _, k := range []string{"k, k", "a,b", `"a", "b"`, `"k", k`, strings.Repeat("x", 256),
		`"with space"`, `"`, `"unterminated`, "caf\u00e9", `""`, "tab\tkey"} {
		requireProblem(t, s.post(t, k, `{}`), 400, "invalid-key")
	}
	require.Equal(t, http.StatusCreated, s.post(t, strings.Repeat("x", 255), `{}`).status)
	require.EqualValues(t, 1, s.app.runs.Load())
}

func middlewareRequestTooLarge(t *testing.T, h Harness) {
	t.Parallel()
	s := newServer(t, h.NewDriver(t), idem.Options{Request: idem.RequestOptions{MaxBytes: 16}}, &app{})
	requireProblem(t, s.post(t, "big", strings.Repeat("1", 17)), 413, "request-too-large")
	require.Zero(t, s.app.runs.Load())
	ok := s.post(t, "fits", strings.Repeat("1", 16))
	require.Equal(t, http.StatusCreated, ok.status)
	require.Contains(t, string(ok.body), strings.Repeat("1", 16), "the handler sees the whole body")
}

func middlewareJSONCanonicalFingerprint(t *testing.T, h Harness) {
	t.Parallel()
	s := newServer(t, h.NewDriver(t), idem.Options{}, &app{})
	first := s.post(t, "k", `{"amount":100,"currency":"JPY","meta":{"a":1,"b":[1,2]}}`)
	require.Equal(t, http.StatusCreated, first.status)
	requireReplay(t, first, s.post(t, "k", "{ \"meta\" : {\"b\":[1, 2],\"a\":1},\n\t\"currency\":\"JPY\", \"amount\": 1e2 }"))
	requireProblem(t, s.post(t, "k", `{"amount":101,"currency":"JPY","meta":{"a":1,"b":[1,2]}}`), 422, "key-reused")
	requireProblem(t, s.post(t, "k", `{"amount":100,"currency":"JPY","meta":{"a":1,"b":[2,1]}}`), 422, "key-reused")
	require.EqualValues(t, 1, s.app.runs.Load())
}

func middlewareKeyReusedInEveryState(t *testing.T, h Harness) {
	t.Parallel()
	a := &app{gate: make(chan struct{}), started: make(chan struct{}, 1),
		status: func(run int32) int {
			if run == 2 {
				return 500
			}
			return 201
		}}
	s := newServer(t, h.NewDriver(t), idem.Options{}, a)
	otherBody := func(k string) { requireProblem(t, s.post(t, k, `{"amount":2}`), 422, "key-reused") }
	otherPath := func(k string) {
		requireProblem(t, s.do(context.Background(), "POST", "/v1/refunds", k, `{"amount":1}`), 422, "key-reused")
	}
	otherMethod := func(k string) {
		requireProblem(t, s.do(context.Background(), "PATCH", "/v1/payments", k, `{"amount":1}`), 422, "key-reused")
	}
	// PROCESSING
	done := make(chan answer)
	go func() { done <- s.post(t, "p", `{"amount":1}`) }()
	<-a.started
	otherBody("p")
	otherPath("p")
	otherMethod("p")
	a.release()
	require.Equal(t, 201, (<-done).status)
	// SUCCEEDED
	otherBody("p")
	otherPath("p")
	otherMethod("p")
	// FAILED (run 2 answers 500)
	a.started = nil
	require.Equal(t, 500, s.post(t, "f", `{"amount":1}`).status)
	otherBody("f")
	otherPath("f")
	otherMethod("f")
	require.EqualValues(t, 2, a.runs.Load())
}

func middlewareInFlight409(t *testing.T, h Harness) {
	t.Parallel()
	a := &app{gate: make(chan struct{}), started: make(chan struct{}, 1)}
	s := newServer(t, h.NewDriver(t), idem.Options{}, a)
	done := make(chan answer)
	go func() { done <- s.post(t, "k", `{}`) }()
	<-a.started
	busy := s.post(t, "k", `{}`)
	requireProblem(t, busy, 409, "request-in-flight")
	ra := retryAfter(t, busy)
	require.GreaterOrEqual(t, ra, 1)
	require.LessOrEqual(t, ra, int(idem.DefaultLeaseDuration/time.Second))
	a.release()
	first := <-done
	require.Equal(t, 201, first.status)
	requireReplay(t, first, s.post(t, "k", `{}`))
	require.EqualValues(t, 1, a.runs.Load())
}

func middlewareConcurrentDuplicates(t *testing.T, h Harness) {
	t.Parallel()
	a := &app{gate: make(chan struct{})}
	s := newServer(t, h.NewDriver(t), idem.Options{}, a)
	answers := make(chan answer, racers)
	var wg sync.WaitGroup
	for i := 0; i < racers; i++ {
		wg.Add(1)
		go func() { defer wg.Done(); answers <- s.post(t, "hot", `{"amount":1}`) }()
	}
	// Every loser answers while the winner is held; then the winner runs.
	var got []answer
	tick := time.NewTicker(10 * time.Millisecond)
	defer tick.Stop()
	for len(got) < racers-1 {
		select {
		case g := <-answers:
			got = append(got, g)
		case <-tick.C:
			if n := a.runs.Load(); n > 1 {
				a.release()
				t.Fatalf("the handler ran %d times for one key", n)
			}
		}
	}
	a.release()
	wg.Wait()
	got = append(got, <-answers)
	counts := map[int]int{}
	for _, g := range got {
		require.NoError(t, g.err)
		counts[g.status]++
		if g.status == 409 {
			require.GreaterOrEqual(t, retryAfter(t, g), 1)
		}
	}
	require.Equal(t, map[int]int{201: 1, 409: racers - 1}, counts)
	require.EqualValues(t, 1, a.runs.Load(), "exactly one handler run")
}

func middlewareTakeoverAfterLeaseExpiry(t *testing.T, h Harness) {
	t.Parallel()
	d := h.NewDriver(t)
	biz := h.Business(t, d)
	slow := &app{gate: make(chan struct{}), started: make(chan struct{}, 1), biz: biz, rowPrefix: "slow:"}
	requireFencedOut(t, d, slow, &app{biz: biz, rowPrefix: "fast:"})
	require.Zero(t, rows(t, biz, "slow:k/1"), "the fenced-out run's business writes rolled back")
	require.Equal(t, 1, rows(t, biz, "fast:k/1"), "the takeover's business writes committed with its completion")
	rec := record(t, d, "global", "k")
	require.Equal(t, idemdriver.StateSucceeded, rec.State)
	require.Equal(t, 2, rec.Attempts)
}

// Regression: a fenced-out worker whose handler failed sent its 5xx,
// although another worker owned the key (and had answered).
func middlewareFencedOutFailure(t *testing.T, h Harness) {
	t.Parallel()
	d := h.NewDriver(t)
	slow := &app{gate: make(chan struct{}), started: make(chan struct{}, 1), status: func(int32) int { return 500 }}
	requireFencedOut(t, d, slow, &app{})
}

func middlewareLostLeaseCancelsHandler(t *testing.T, h Harness) {
	t.Parallel()
	d := h.NewDriver(t)
	const shortLease = time.Second
	slow := &app{gate: make(chan struct{}), started: make(chan struct{}, 1)} // never opened: waits for its context
	s1 := newServer(t, d, idem.Options{Engine: idem.EngineOptions{Lease: idem.LeaseOptions{Duration: shortLease}}}, slow)
	later := &Clock{}
	later.Advance(time.Minute)
	s2 := newServer(t, Shift(d, later), idem.Options{Engine: idem.EngineOptions{Lease: idem.LeaseOptions{Duration: shortLease}}}, &app{})
	done := make(chan answer)
	go func() { done <- s1.post(t, "k", `{}`) }()
	<-slow.started
	require.Equal(t, 201, s2.post(t, "k", `{}`).status)
	// s1's next heartbeat finds the token moved and cancels its handler.
	requireProblem(t, <-done, 409, "request-in-flight")
	require.Equal(t, idem.ErrLeaseLost.Error(), slow.ctxErr.Load())
}

func middlewareFailedOutcomesRunAgain(t *testing.T, h Harness) {
	t.Parallel()
	for _, failing := range []int{500, 502, 503, 408, 425, 429} {
		a := &app{status: func(run int32) int {
			if run == 1 {
				return failing
			}
			return 201
		}}
		s := newServer(t, h.NewDriver(t), idem.Options{}, a)
		require.Equal(t, failing, s.post(t, "k", `{}`).status)
		second := s.post(t, "k", `{}`)
		require.Equal(t, 201, second.status, "after %d the retry runs again", failing)
		requireReplay(t, second, s.post(t, "k", `{}`))
		require.EqualValues(t, 2, a.runs.Load())
	}
	for _, final := range []int{200, 202, 204, 400, 404, 409, 422} {
		a := &app{status: func(int32) int { return final }}
		s := newServer(t, h.NewDriver(t), idem.Options{}, a)
		first := s.post(t, "k", `{}`)
		require.Equal(t, final, first.status)
		requireReplay(t, first, s.post(t, "k", `{}`))
		require.EqualValues(t, 1, a.runs.Load(), "%d is final", final)
	}
}

// A panic is recorded FAILED and answered 500, on a connection kept alive:
// left to net/http, the dropped connection made Go's Transport resend the
// POST (it carries an Idempotency-Key) by itself, and the handler ran twice
// for one client call (found by a fresh user; run 2 below was run 3).
func middlewarePanicRecordsFailed(t *testing.T, h Harness) {
	t.Parallel()
	d := h.NewDriver(t)
	a := &app{panicOn: 2}
	s := newServer(t, d, idem.Options{}, a)
	require.Equal(t, 201, s.post(t, "warm", `{}`).status, "run 1 opens the keep-alive connection")
	first := s.post(t, "k", `{}`)
	require.NoError(t, first.err)
	require.Equal(t, http.StatusInternalServerError, first.status, "body: %s", first.body)
	require.Equal(t, "application/problem+json", first.header.Get("Content-Type"))
	require.EqualValues(t, 2, a.runs.Load(), "one client call, one execution")
	rec := record(t, d, "global", "k")
	require.Equal(t, idemdriver.StateFailed, rec.State)
	retry := s.post(t, "k", `{}`)
	require.Equal(t, 201, retry.status)
	require.EqualValues(t, 3, a.runs.Load())
}

func middlewareClientDisconnects(t *testing.T, h Harness) {
	t.Parallel()
	d := h.NewDriver(t)
	a := &app{gate: make(chan struct{}), started: make(chan struct{}, 1)}
	s := newServer(t, d, idem.Options{}, a)
	ctx, hangUp := context.WithCancel(context.Background())
	done := make(chan answer)
	go func() { done <- s.do(ctx, "POST", "/v1/payments", "k", `{}`) }()
	<-a.started
	hangUp()
	require.Error(t, (<-done).err)
	a.release() // the work goes on and is recorded
	var rec idemdriver.Record
	require.Eventually(t, func() bool {
		var err error
		rec, err = d.Get(context.Background(), idemdriver.GetParams{Scope: "global", Key: "k"})
		return err == nil && rec.State == idemdriver.StateSucceeded
	}, 30*time.Second, 5*time.Millisecond)
	require.Equal(t, "<nil>", a.ctxErr.Load(), "the handler's context is detached from the client's")
	retry := s.post(t, "k", `{}`)
	require.Equal(t, 201, retry.status)
	require.Equal(t, "true", retry.header.Get(idem.HeaderReplayed))
	require.Equal(t, rec.Response.Body, retry.body)
	require.EqualValues(t, 1, a.runs.Load())
}

func middlewareStoreUnavailable(t *testing.T, h Harness) {
	t.Parallel()
	a := &app{}
	s := newServer(t, h.Unreachable(t), idem.Options{}, a)
	got := s.post(t, "k", `{}`)
	requireProblem(t, got, 503, "store-unavailable")
	require.Equal(t, 1, retryAfter(t, got))
	require.Zero(t, a.runs.Load(), "never run unprotected")
}

func middlewareUnprotectedRequestsPassThrough(t *testing.T, h Harness) {
	t.Parallel()
	a := &app{}
	s := newServer(t, h.NewDriver(t), idem.Options{}, a)
	for i := 0; i < 2; i++ {
		got := s.do(context.Background(), "GET", "/v1/payments", "k", "")
		require.Equal(t, 201, got.status)
		require.Empty(t, got.header.Get(idem.HeaderReplayed))
	}
	require.EqualValues(t, 2, a.runs.Load())
	opt := &app{}
	so := newServer(t, h.NewDriver(t), idem.Options{KeyOptional: true}, opt)
	require.Equal(t, 201, so.post(t, "", `{}`).status)
	require.Equal(t, 201, so.post(t, "", `{}`).status)
	require.EqualValues(t, 2, opt.runs.Load())
}

func middlewareResponseTooLargeToStore(t *testing.T, h Harness) {
	t.Parallel()
	a := &app{bigBody: 4096}
	s := newServer(t, h.NewDriver(t), idem.Options{Engine: idem.EngineOptions{Response: idem.ResponseOptions{MaxBytes: 1024}}}, a)
	first := s.post(t, "k", `{}`)
	require.Equal(t, 201, first.status)
	require.Len(t, first.body, 4096, "the first caller gets the whole response")
	again := s.post(t, "k", `{}`)
	requireProblem(t, again, 410, "response-not-stored")
	require.Equal(t, "true", again.header.Get(idem.HeaderReplayed))
	require.Equal(t, first.header.Get("Location"), again.header.Get("Location"))
	require.EqualValues(t, 1, a.runs.Load(), "never run twice because of it")
}

func middlewareBusinessWritesCommitWithOutcome(t *testing.T, h Harness) {
	t.Parallel()
	d := h.NewDriver(t)
	biz := h.Business(t, d)
	a := &app{biz: biz, status: func(run int32) int {
		if run == 1 {
			return 503 // FAILED: its business row must roll back
		}
		return 201
	}}
	s := newServer(t, d, idem.Options{}, a)
	require.Equal(t, 503, s.post(t, "k", `{}`).status)
	require.Zero(t, rows(t, biz, "k/1"))
	first := s.post(t, "k", `{}`)
	require.Equal(t, 201, first.status)
	require.Equal(t, 1, rows(t, biz, "k/2"))
	requireReplay(t, first, s.post(t, "k", `{}`))
	require.EqualValues(t, 2, a.runs.Load())
}

// A handler writing in the claim's transaction that runs past MaxExecution
// is rolled back and recorded FAILED, whatever it answers: database/sql
// aborts a transaction whose context ends, so recording its 201 would keep
// a SUCCEEDED without its writes (regression, MySQL and SQLite).
func middlewareMaxExecutionRollsBack(t *testing.T, h Harness) {
	t.Parallel()
	d := h.NewDriver(t)
	biz := h.Business(t, d)
	var runs atomic.Int32
	s := newHandlerServer(t, d, idem.Options{Engine: idem.EngineOptions{Lease: idem.LeaseOptions{Duration: time.Second, MaxExecution: time.Second}}}, func(w http.ResponseWriter, r *http.Request) {
		run := runs.Add(1)
		if err := insertRow(r, biz, fmt.Sprintf("slow/%d", run)); err != nil {
			http.Error(w, err.Error(), http.StatusInternalServerError)
			return
		}
		if run == 1 {
			<-r.Context().Done() // past MaxExecution; it answers 201 all the same
		}
		w.WriteHeader(http.StatusCreated)
	})
	first := s.post(t, "k", `{}`)
	require.Equal(t, http.StatusServiceUnavailable, first.status, "body: %s", first.body)
	rec := record(t, d, "global", "k")
	require.Equal(t, idemdriver.StateFailed, rec.State)
	require.Zero(t, rows(t, biz, "slow/1"), "its writes rolled back")
	require.Equal(t, http.StatusCreated, s.post(t, "k", `{}`).status, "the retry runs again")
	require.Equal(t, 1, rows(t, biz, "slow/2"))
}

// Regression: a handler that committed the claim's transaction itself got
// 503 while its writes were committed, and the record stayed PROCESSING,
// so the retry after the lease charged again.
func middlewareHandlerCommitsItself(t *testing.T, h Harness) {
	t.Parallel()
	d := h.NewDriver(t)
	biz := h.Business(t, d)
	var runs atomic.Int32
	s := newHandlerServer(t, d, idem.Options{}, func(w http.ResponseWriter, r *http.Request) {
		runs.Add(1)
		tx, err := idem.Tx[any](r.Context())
		if err == nil {
			err = biz.Insert(r.Context(), tx, "self-commit")
		}
		if err == nil { // against the contract: pgx.Tx or *sql.Tx
			switch native := tx.(type) {
			case interface{ Commit(context.Context) error }:
				err = native.Commit(r.Context())
			case interface{ Commit() error }:
				err = native.Commit()
			}
		}
		if err != nil {
			http.Error(w, err.Error(), http.StatusInternalServerError)
			return
		}
		w.WriteHeader(http.StatusCreated)
	})
	first := s.post(t, "k", `{}`)
	rec := record(t, d, "global", "k")
	require.Equal(t, idemdriver.StateSucceeded, rec.State)
	requireCommittedOnce(t, s, first, biz, "self-commit", runs.Load())
}

func middlewareExpiredKeyIsNew(t *testing.T, h Harness) {
	t.Parallel()
	d := h.NewDriver(t)
	a := &app{}
	clock := &Clock{}
	s := newServer(t, Shift(d, clock), idem.Options{}, a)
	first := s.post(t, "k", `{"amount":1}`)
	require.Equal(t, 201, first.status)
	clock.Advance(idem.DefaultRetention + time.Second)
	again := s.post(t, "k", `{"amount":2}`)
	require.Equal(t, 201, again.status)
	require.Empty(t, again.header.Get(idem.HeaderReplayed))
	require.EqualValues(t, 2, a.runs.Load())
}

// The relayed key (CONTRACT section 7) is one for every execution of one
// life of the key (the first run, the re-claim after FAILED) and a new
// one when the key is reused after its record expired: a provider that
// keeps keys longer than idem must not answer the new request with the
// old charge.
func middlewareRelayKeyPerLife(t *testing.T, h Harness) {
	t.Parallel()
	clock := &Clock{}
	secret := []byte("relay-secret")
	var (
		mu      sync.Mutex
		relayed []string
		derived []string
	)
	s := newHandlerServer(t, Shift(h.NewDriver(t), clock), idem.Options{Engine: idem.EngineOptions{RelaySecret: secret}}, func(w http.ResponseWriter, r *http.Request) {
		k, err := idem.RelayKey(r.Context(), "charge")
		if err != nil {
			http.Error(w, err.Error(), http.StatusInternalServerError)
			return
		}
		ex, _ := idem.ExecutionFromContext(r.Context())
		mu.Lock()
		relayed = append(relayed, k)
		derived = append(derived, idem.DeriveKey(secret, ex.Scope, ex.Key, ex.Created, "charge"))
		run := len(relayed)
		mu.Unlock()
		if run == 1 {
			w.WriteHeader(http.StatusBadGateway) // FAILED: the retry runs again
			return
		}
		w.WriteHeader(http.StatusCreated)
	})
	require.Equal(t, http.StatusBadGateway, s.post(t, "k", `{"amount":1}`).status)
	require.Equal(t, http.StatusCreated, s.post(t, "k", `{"amount":1}`).status)
	require.Equal(t, "true", s.post(t, "k", `{"amount":1}`).header.Get(idem.HeaderReplayed))
	clock.Advance(idem.DefaultRetention + time.Second)
	require.Equal(t, http.StatusCreated, s.post(t, "k", `{"amount":1}`).status)

	require.Len(t, relayed, 3)
	require.Equal(t, derived, relayed, "RelayKey is DeriveKey of the execution")
	require.Equal(t, relayed[0], relayed[1], "the re-claim after FAILED relays the first run's key")
	require.NotEqual(t, relayed[1], relayed[2], "the key reused after expiry relays a new key")
}

func middlewareStatementBudget(t *testing.T, h Harness) {
	t.Parallel()
	require.NotNil(t, h.NewCountingDriver, "the harness must count statements")
	d, count := h.NewCountingDriver(t)
	biz := h.Business(t, d)
	plain, held := &app{}, &app{gate: make(chan struct{}), started: make(chan struct{}, 1)}
	t.Cleanup(held.release)
	txApp := &app{biz: biz}
	for _, a := range []*app{plain, held, txApp} {
		t.Cleanup(func() { a.writes.check(t) })
	}
	serve := func(a *app, key, body string) *httptest.ResponseRecorder {
		m, err := idem.NewMiddleware(d, idem.Options{Scope: idem.SingleTenant})
		require.NoError(t, err)
		req := httptest.NewRequest("POST", "/v1/payments", strings.NewReader(body))
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set("Idempotency-Key", key)
		rec := httptest.NewRecorder()
		m.Handler(a).ServeHTTP(rec, req)
		return rec
	}
	cost := func(outcome string, wantStatus int, f func() *httptest.ResponseRecorder, business int64) {
		t.Helper()
		want, ok := h.Budget[outcome]
		require.True(t, ok, "the harness gives no budget for %q", outcome)
		before := count()
		rec := f()
		require.Equal(t, wantStatus, rec.Code, rec.Body.String())
		require.EqualValues(t, want, count()-before-business, "statements for %s", outcome)
	}
	cost("first", 201, func() *httptest.ResponseRecorder { return serve(plain, "k", `{}`) }, 0)
	cost("replay", 201, func() *httptest.ResponseRecorder { return serve(plain, "k", `{}`) }, 0)
	cost("key-reused", 422, func() *httptest.ResponseRecorder { return serve(plain, "k", `{"x":1}`) }, 0)
	cost("first-claim-tx", 201, func() *httptest.ResponseRecorder { return serve(txApp, "t", `{}`) }, 1)
	done := make(chan struct{})
	go func() { defer close(done); serve(held, "h", `{}`) }()
	<-held.started
	cost("in-flight", 409, func() *httptest.ResponseRecorder { return serve(plain, "h", `{}`) }, 0)
	held.release()
	<-done
}

func middlewareScopesNeverMeet(t *testing.T, h Harness) {
	t.Parallel()
	a := &app{}
	cfg := idem.Options{Scope: func(r *http.Request) (string, error) {
		if m := r.Header.Get("X-Test-Merchant"); m != "" {
			return m, nil
		}
		return "", fmt.Errorf("no merchant")
	}}
	s := newServer(t, h.NewDriver(t), cfg, a)
	as := func(m string) func(*http.Request) {
		return func(r *http.Request) { r.Header.Set("X-Test-Merchant", m) }
	}
	first := s.post(t, "k", `{}`, as("m1"))
	require.Equal(t, 201, first.status)
	other := s.post(t, "k", `{"different":true}`, as("m2"))
	require.Equal(t, 201, other.status)
	require.Empty(t, other.header.Get(idem.HeaderReplayed))
	requireReplay(t, first, s.post(t, "k", `{}`, as("m1")))
	requireProblem(t, s.post(t, "k", `{}`), 401, "missing-scope")
	require.EqualValues(t, 2, a.runs.Load())
}

// runEdges holds the cases of the timing, size and error corners where the
// guarantee once broke (one regression each).
func runEdges(t *testing.T, h Harness) {
	runCases(t, h, []suiteCase{
		{"LongExecutionIsReplayed", edgeLongExecutionIsReplayed},
		{"HandlerAnswersItsSQLError", edgeHandlerAnswersItsSQLError},
		{"HandlerIgnoresSQLError", edgeHandlerIgnoresSQLError},
		{"InFlightRetryAfter", edgeInFlightRetryAfter},
		{"Trailers", edgeTrailers},
		{"LowercaseMethodProtected", edgeLowercaseMethodProtected},
		{"UnstorableScope", edgeUnstorableScope},
		{"ValidationFailureReleasesKey", edgeValidationFailureReleasesKey},
		{"HandlerStatusOutOfRange", edgeHandlerStatusOutOfRange},
		{"StoredStatusOutOfRange", edgeStoredStatusOutOfRange},
	})
}

// Regression (issue 32): a handler's WriteHeader(1000) was accepted, then
// net/http panicked sending it, the connection dropped, and the handler
// (whose charge had committed) ran again on every retry. idem answers 500
// invalid-status in its place and records that answer SUCCEEDED with the
// handler's writes, whatever the outcome policy says of a 500: the retry
// gets the same 500, and the handler never runs again.
func edgeHandlerStatusOutOfRange(t *testing.T, h Harness) {
	t.Parallel()
	d := h.NewDriver(t)
	biz := h.Business(t, d)
	a := &app{biz: biz, status: func(int32) int { return 1000 }}
	s := newServer(t, d, idem.Options{Engine: idem.EngineOptions{Logger: slog.New(slog.DiscardHandler)}}, a)
	first := s.post(t, "k", `{}`)
	requireProblem(t, first, http.StatusInternalServerError, "invalid-status")
	require.Empty(t, first.header.Get("Location"), "idem's answer, not the handler's")
	for range 2 {
		again := s.post(t, "k", `{}`)
		require.NoError(t, again.err)
		require.Equal(t, http.StatusInternalServerError, again.status)
		require.Equal(t, "true", again.header.Get(idem.HeaderReplayed))
		require.Equal(t, string(first.body), string(again.body), "replayed byte for byte")
	}
	require.Equal(t, http.StatusInternalServerError, record(t, d, idem.SingleTenantScope, "k").Response.Status)
	require.Equal(t, 1, rows(t, biz, "k/1"), "the handler's writes committed with its recorded answer")
	require.EqualValues(t, 1, a.runs.Load())
}

// Regression (issue 32): a SUCCEEDED record whose status is outside
// 200-599 (a damaged row; a completion through the seam plants it here)
// made net/http panic on every retry, which lost its connection. It is
// answered 500 response-missing, and the handler does not run.
func edgeStoredStatusOutOfRange(t *testing.T, h Harness) {
	t.Parallel()
	d := h.NewDriver(t)
	a := &app{}
	s := newHandlerServer(t, d, idem.Options{}, a.ServeHTTP)
	req := httptest.NewRequest(http.MethodPost, "/v1/payments", nil)
	req.Header.Set("Content-Type", "application/json")
	for _, status := range []int{1000, 600, 150, 99, 0, -1} {
		key := fmt.Sprintf("k%d", status)
		res := claim(t, d, idemdriver.ClaimParams{Scope: idem.SingleTenantScope, Key: key, Method: http.MethodPost, Path: "/v1/payments",
			Fingerprint: idemfingerprint.Request(req, []byte(`{}`)), LeaseDuration: lease, Retention: retention})
		require.True(t, res.Claimed)
		resp := okResponse(`{"id":"pay_1"}`)
		resp.Status = status
		require.True(t, complete(t, d, fence(res.Record), resp))
		require.Equal(t, status, record(t, d, idem.SingleTenantScope, key).Response.Status, "stored as planted")
		for range 2 {
			got := s.post(t, key, `{}`)
			requireProblem(t, got, http.StatusInternalServerError, "response-missing")
			require.Empty(t, got.header.Get(idem.HeaderReplayed), "status %d", status)
		}
	}
	require.Zero(t, a.runs.Load())
}

// Regression (lease 1 s, Retention 2 s, a 3 s handler): completion never
// moved expires_at, so the retry after the completion found the record
// expired and ran the handler again, under a new relayed key. Now an
// outcome is recorded only while its lease is live, and MaxExecution
// (1 s here, bounded by Retention - LeaseDuration) ends the renewals:
// the slow run is recorded FAILED, and its retry continues the same life.
func edgeLongExecutionIsReplayed(t *testing.T, h Harness) {
	t.Parallel()
	var (
		mu      sync.Mutex
		relayed []string
	)
	writes := checkWrites(t)
	s := newHandlerServer(t, h.NewDriver(t), idem.Options{Engine: idem.EngineOptions{Lease: idem.LeaseOptions{Duration: time.Second}, Retention: 2 * time.Second}},
		func(w http.ResponseWriter, r *http.Request) {
			k, err := idem.RelayKey(r.Context(), "charge")
			if err != nil {
				http.Error(w, err.Error(), http.StatusInternalServerError)
				return
			}
			mu.Lock()
			relayed = append(relayed, k)
			run := len(relayed)
			mu.Unlock()
			if run == 1 {
				time.Sleep(3 * time.Second) // real time: the handler outlives the retention
			}
			w.WriteHeader(http.StatusCreated)
			writes.printf(w, `{"run":%d}`, run)
		})
	first := s.post(t, "k", `{}`)
	require.NoError(t, first.err)
	second := s.post(t, "k", `{}`)
	if first.status == http.StatusCreated {
		requireReplay(t, first, second)
	} else {
		requireProblem(t, first, http.StatusServiceUnavailable, "store-unavailable")
		require.Equal(t, http.StatusCreated, second.status, "%s", second.body)
		requireReplay(t, second, s.post(t, "k", `{}`))
	}
	mu.Lock()
	defer mu.Unlock()
	for _, k := range relayed {
		require.Equal(t, relayed[0], k, "one life of the key: one relayed key")
	}
}

// Regression (PostgreSQL): a handler whose statement failed inside the
// claim's transaction (aborted, 25P02) and that answered 409 itself got
// 503 store-unavailable on every attempt, ran on every retry, and
// nothing was recorded.
func edgeHandlerAnswersItsSQLError(t *testing.T, h Harness) {
	t.Parallel()
	d := h.NewDriver(t)
	biz := h.Business(t, d)
	var runs, dupFailed atomic.Int32
	writes := checkWrites(t)
	s := newHandlerServer(t, d, idem.Options{}, func(w http.ResponseWriter, r *http.Request) {
		runs.Add(1)
		id := "dup/" + r.Header.Get("Idempotency-Key")
		if err := insertRow(r, biz, id); err != nil {
			http.Error(w, err.Error(), http.StatusInternalServerError)
			return
		}
		if err := insertRow(r, biz, id); err != nil { // a unique violation the handler handles
			dupFailed.Add(1)
			w.Header().Set("Content-Type", "application/json")
			w.WriteHeader(http.StatusConflict)
			writes.printf(w, `{"error":"duplicate order"}`)
			return
		}
		w.WriteHeader(http.StatusCreated)
	})
	first := s.post(t, "k", `{}`)
	require.NoError(t, first.err)
	require.Equal(t, http.StatusConflict, first.status, "%s", first.body)
	requireReplay(t, first, s.post(t, "k", `{}`))
	require.EqualValues(t, 1, runs.Load())
	require.EqualValues(t, 1, dupFailed.Load())
}

// The README's snippet ignores tx.Exec's error and answers 201. Where
// the failed statement aborted the transaction (PostgreSQL), the 201
// claims writes that never happened: 500 transaction-aborted, recorded
// FAILED, and the retry runs again (regression: 503 store-unavailable
// forever). Where it did not (SQLite, MariaDB: only the statement
// fails), the other writes commit with the 201, which is replayed.
func edgeHandlerIgnoresSQLError(t *testing.T, h Harness) {
	t.Parallel()
	d := h.NewDriver(t)
	biz := h.Business(t, d)
	var runs atomic.Int32
	var aborted atomic.Bool
	s := newHandlerServer(t, d, idem.Options{}, func(w http.ResponseWriter, r *http.Request) {
		run := runs.Add(1)
		tx, err := idem.Tx[any](r.Context())
		if err != nil {
			http.Error(w, err.Error(), http.StatusInternalServerError)
			return
		}
		id := fmt.Sprintf("ignored/%d", run)
		_ = biz.Insert(r.Context(), tx, id)
		_ = biz.Insert(r.Context(), tx, id) // fails: ignored, as the snippet does
		// Whether the database aborted the transaction: a later
		// statement fails too.
		if biz.Insert(r.Context(), tx, fmt.Sprintf("probe/%d", run)) != nil {
			aborted.Store(true)
		}
		w.WriteHeader(http.StatusCreated)
	})
	first := s.post(t, "k", `{}`)
	require.NoError(t, first.err)
	t.Logf("the failed statement aborted the transaction: %v", aborted.Load())
	if aborted.Load() {
		requireProblem(t, first, http.StatusInternalServerError, "transaction-aborted")
		rec := record(t, d, idem.SingleTenantScope, "k")
		require.Equal(t, idemdriver.StateFailed, rec.State)
		require.Zero(t, rows(t, biz, "ignored/1"))
		requireProblem(t, s.post(t, "k", `{}`), http.StatusInternalServerError, "transaction-aborted")
		require.EqualValues(t, 2, runs.Load(), "FAILED: the retry runs again")
		return
	}
	requireCommittedOnce(t, s, first, biz, "ignored/1", runs.Load())
}

// Regression: Retry-After on 409 was the whole lease left (30 s by
// default) and, with the database clock stepped back, more than the
// lease (330 s). It is the in-flight delay (1 s by default), within
// [1 s, lease left] and never beyond LeaseDuration.
func edgeInFlightRetryAfter(t *testing.T, h Harness) {
	t.Parallel()
	d := h.NewDriver(t)
	a := &app{gate: make(chan struct{}), started: make(chan struct{}, 1)}
	s := newServer(t, d, idem.Options{}, a)
	back := &Clock{}
	back.Advance(-5 * time.Minute)
	stepped := newServer(t, Shift(d, back), idem.Options{}, &app{})
	slow := newServer(t, d, idem.Options{Engine: idem.EngineOptions{RetryAfter: idem.RetryAfterOptions{InFlight: 5 * time.Second}}}, &app{})
	done := make(chan answer)
	go func() { done <- s.post(t, "k", `{}`) }()
	<-a.started
	busy := s.post(t, "k", `{}`)
	requireProblem(t, busy, http.StatusConflict, "request-in-flight")
	require.Equal(t, 1, retryAfter(t, busy), "the default in-flight delay")
	stepBack := stepped.post(t, "k", `{}`)
	requireProblem(t, stepBack, http.StatusConflict, "request-in-flight")
	require.Equal(t, 1, retryAfter(t, stepBack), "a clock stepped back does not stretch it")
	configured := slow.post(t, "k", `{}`)
	requireProblem(t, configured, http.StatusConflict, "request-in-flight")
	require.Equal(t, 5, retryAfter(t, configured))
	a.release()
	require.Equal(t, http.StatusCreated, (<-done).status)
	require.EqualValues(t, 1, a.runs.Load())
}

// Regression: trailers (declared with Trailer, or set with
// http.TrailerPrefix) reached neither the first caller nor the replay,
// so a gRPC-style handler with its status in trailers broke.
func edgeTrailers(t *testing.T, h Harness) {
	t.Parallel()
	var runs atomic.Int32
	cfg := idem.Options{Replay: idem.ReplayOptions{Headers: append(idem.DefaultReplayHeaders(), "X-Checksum", "Grpc-Status")}}
	writes := checkWrites(t)
	s := newHandlerServer(t, h.NewDriver(t), cfg, func(w http.ResponseWriter, r *http.Request) {
		runs.Add(1)
		w.Header().Set("Trailer", "X-Checksum, X-Private")
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusCreated)
		writes.printf(w, `{"id":"pay_1"}`)
		w.Header().Set("X-Checksum", "sha256:abc")
		w.Header().Set("X-Private", "not replayed")
		w.Header().Set(http.TrailerPrefix+"grpc-status", "0")
	})
	first := s.post(t, "k", `{}`)
	require.NoError(t, first.err)
	require.Equal(t, http.StatusCreated, first.status)
	require.Equal(t, "sha256:abc", first.trailer.Get("X-Checksum"))
	require.Equal(t, "not replayed", first.trailer.Get("X-Private"), "the first caller gets every trailer")
	require.Equal(t, "0", first.trailer.Get("Grpc-Status"))
	require.Empty(t, first.header.Get("X-Checksum"), "a trailer is not sent as a header")
	again := s.post(t, "k", `{}`)
	requireReplay(t, first, again)
	require.Equal(t, "sha256:abc", again.trailer.Get("X-Checksum"))
	require.Equal(t, "0", again.trailer.Get("Grpc-Status"))
	require.Empty(t, again.trailer.Get("X-Private"), "only allow-listed trailers are replayed")
	require.EqualValues(t, 1, runs.Load())
}

// Regression: a method that differs only in case from a protected one
// ("post") passed through unprotected, and a handler that matched
// methods case-insensitively ran twice.
func edgeLowercaseMethodProtected(t *testing.T, h Harness) {
	t.Parallel()
	a := &app{}
	s := newServer(t, h.NewDriver(t), idem.Options{}, a)
	first := s.do(context.Background(), "post", "/v1/payments", "k", `{}`)
	require.NoError(t, first.err)
	require.Equal(t, http.StatusCreated, first.status)
	requireReplay(t, first, s.do(context.Background(), "post", "/v1/payments", "k", `{}`))
	requireProblem(t, s.do(context.Background(), "post", "/v1/payments", "", `{}`), 400, "missing-key")
	require.EqualValues(t, 1, a.runs.Load())
}

// Regression: a scope PostgreSQL cannot store (a NUL byte, invalid
// UTF-8) was answered 503, inviting retries forever. It is a server
// fault answered 500 once, the same on every driver.
func edgeUnstorableScope(t *testing.T, h Harness) {
	t.Parallel()
	for _, scope := range []string{"acct\x00nul", "acct\xff\xfe"} {
		a := &app{}
		s := newServer(t, h.NewDriver(t), idem.Options{Scope: func(*http.Request) (string, error) { return scope, nil }}, a)
		requireProblem(t, s.post(t, "k", `{}`), http.StatusInternalServerError, "scope-unstorable")
		require.Zero(t, a.runs.Load())
	}
}

// Regression: a validation failure (415 for a wrong Content-Type) was
// recorded, so the corrected request with the same key got 422
// key-reused. The default still records it (idem cannot tell a 4xx
// answered before any side effect from one answered after); a handler
// that calls idem.ReleaseKey, or the ReleaseValidationFailures policy,
// releases the key, and the corrected request runs.
func edgeValidationFailureReleasesKey(t *testing.T, h Harness) {
	t.Parallel()
	d := h.NewDriver(t)
	biz := h.Business(t, d)
	var runs atomic.Int32
	writes := checkWrites(t)
	validating := func(release bool) http.HandlerFunc {
		return func(w http.ResponseWriter, r *http.Request) {
			run := runs.Add(1)
			if err := insertRow(r, biz, fmt.Sprintf("%s/%d", r.Header.Get("Idempotency-Key"), run)); err != nil {
				http.Error(w, err.Error(), http.StatusInternalServerError)
				return
			}
			if r.Header.Get("Content-Type") != "application/json" {
				if release {
					if err := idem.ReleaseKey(r.Context()); err != nil {
						http.Error(w, err.Error(), http.StatusInternalServerError)
						return
					}
				}
				http.Error(w, "send application/json", http.StatusUnsupportedMediaType)
				return
			}
			w.WriteHeader(http.StatusCreated)
			writes.printf(w, `{"run":%d}`, run)
		}
	}
	asText := func(r *http.Request) { r.Header.Set("Content-Type", "text/plain") }

	// The default: the 415 is an outcome, replayed; the corrected
	// request is another request for the key.
	recorded := newHandlerServer(t, d, idem.Options{}, validating(false))
	first := recorded.post(t, "burned", `{}`, asText)
	require.Equal(t, http.StatusUnsupportedMediaType, first.status)
	requireReplay(t, first, recorded.post(t, "burned", `{}`, asText))
	requireProblem(t, recorded.post(t, "burned", `{}`), 422, "key-reused")

	// The handler releases the key: nothing recorded, its writes
	// rolled back, and the corrected request runs.
	released := newHandlerServer(t, d, idem.Options{}, validating(true))
	runs.Store(0)
	refused := released.post(t, "k", `{}`, asText)
	require.Equal(t, http.StatusUnsupportedMediaType, refused.status)
	require.Empty(t, refused.header.Get(idem.HeaderReplayed))
	requireGone(t, d, idem.SingleTenantScope, "k", "the record is removed")
	require.Zero(t, rows(t, biz, "k/1"), "the released execution's writes rolled back")
	corrected := released.post(t, "k", `{}`)
	require.Equal(t, http.StatusCreated, corrected.status, "%s", corrected.body)
	requireReplay(t, corrected, released.post(t, "k", `{}`))
	require.EqualValues(t, 2, runs.Load())

	// The policy releases 400, 415 and 422 without the handler's help.
	policy := newHandlerServer(t, d, idem.Options{Engine: idem.EngineOptions{Response: idem.ResponseOptions{Outcome: idem.ReleaseValidationFailures}}}, validating(false))
	runs.Store(0)
	require.Equal(t, http.StatusUnsupportedMediaType, policy.post(t, "p", `{}`, asText).status)
	require.Equal(t, http.StatusCreated, policy.post(t, "p", `{}`).status)
	require.EqualValues(t, 2, runs.Load())
}
