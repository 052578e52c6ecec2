package idem

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/idemgo/idem/idemdriver"
)

// Store is the database seam: a driver such as idempgx.New or idemsqlite.Open.
type Store = idemdriver.Driver

// Middleware protects handlers with the claim protocol of docs/contract.md
// (CONTRACT sections 2 to 6). Create it with New; its Handler method is a
// func(http.Handler) http.Handler for net/http, chi, gorilla/mux and anything
// that speaks http.Handler.
type Middleware struct {
	cfg     Config
	methods map[string]bool
	replay  map[string]bool // canonical header names kept for replay
}

// neverReplayed are the headers dropped from the replay allow-list whatever
// it says (CONTRACT section 5): cookies, hop-by-hop headers (RFC 9110
// section 7.6.1), Date and Content-Length (recomputed on replay).
var neverReplayed = map[string]bool{
	"Set-Cookie": true, "Date": true, "Content-Length": true, "Connection": true,
	"Keep-Alive": true, "Proxy-Connection": true, "Transfer-Encoding": true,
	"Te": true, "Trailer": true, "Upgrade": true, "Proxy-Authenticate": true,
	HeaderReplayed: true,
}

// New validates cfg (after WithDefaults) and returns the middleware. The
// error names every invalid field.
func New(cfg Config) (*Middleware, error) {
	cfg = cfg.WithDefaults()
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	m := &Middleware{cfg: cfg, methods: map[string]bool{}, replay: map[string]bool{}}
	for _, meth := range cfg.Methods {
		m.methods[strings.ToUpper(meth)] = true
	}
	for _, h := range cfg.ReplayHeaders {
		if k := http.CanonicalHeaderKey(h); !neverReplayed[k] {
			m.replay[k] = true
		}
	}
	return m, nil
}

// Handler wraps next: protected methods with a key go through the claim;
// everything else reaches next untouched.
func (m *Middleware) Handler(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		m.serve(w, r, next)
	})
}

func (m *Middleware) serve(w http.ResponseWriter, r *http.Request, next http.Handler) {
	// Methods are case-sensitive (RFC 9110 section 9.1), but a handler or
	// router may match them without regard to case: a "post" must not run a
	// POST handler unprotected.
	if !m.methods[strings.ToUpper(r.Method)] {
		next.ServeHTTP(w, r)
		return
	}
	values := r.Header.Values(HeaderKey)
	if len(values) == 0 && m.cfg.KeyOptional {
		next.ServeHTTP(w, r)
		return
	}
	key, err := ParseKey(values)
	if err != nil {
		kind := ErrInvalidKey
		if errors.Is(err, ErrMissingKey) {
			kind = ErrMissingKey
			err = fmt.Errorf("this endpoint requires an %s header: a unique value per logical request, sent again unchanged on every retry", HeaderKey)
		}
		ProblemFor(kind, strings.TrimPrefix(err.Error(), "idem: ")).Write(w)
		return
	}
	scope, err := m.cfg.Scope(r)
	if err == nil && scope == "" {
		// Most often an unauthenticated request read as the zero value:
		// sharing one empty scope would let strangers' keys meet.
		err = errors.New("this request names no owner for its key; authenticate first")
	}
	if err != nil {
		ProblemFor(ErrMissingScope, err.Error()).Write(w)
		return
	}
	if why := unstorableScope(scope); why != "" {
		// The server's Scope function is at fault, not the client: a 500
		// that retries cannot cure, rather than a 503 that invites them.
		m.cfg.Logger.ErrorContext(r.Context(), "idem: Scope returned a scope no store can hold", "reason", why, "length", len(scope))
		ProblemFor(ErrScopeUnstorable, "the server could not scope this request").Write(w)
		return
	}
	path := r.URL.EscapedPath()
	if len(path) > MaxPathLength {
		// A client mistake every store could not hold (MySQL's column
		// holds 64 KiB): answered here, not as a store error (a 503 that
		// invites retries that cannot succeed).
		ProblemFor(ErrPathTooLong, fmt.Sprintf("the request path is %d bytes; a protected request's path may have at most %d", len(path), MaxPathLength)).Write(w)
		return
	}
	body, err := readBody(r, m.cfg.MaxRequestBytes)
	if errors.Is(err, ErrRequestTooLarge) {
		ProblemFor(ErrRequestTooLarge, fmt.Sprintf("the request body exceeds %d bytes", m.cfg.MaxRequestBytes)).Write(w)
		return
	}
	if err != nil {
		// The client stopped sending mid-body: nothing was claimed.
		ProblemFor(ErrBodyUnreadable, "the request body could not be read to its end; nothing was processed, send the request again with the same key").Write(w)
		return
	}
	params := idemdriver.ClaimParams{
		Scope: scope, Key: key, Method: r.Method, Path: path,
		Fingerprint:   m.cfg.Fingerprint(r, body),
		LeaseDuration: m.cfg.LeaseDuration, Retention: m.cfg.Retention,
		Owner: m.cfg.Owner,
	}
	if m.cfg.OneCommit {
		m.serveOneCommit(w, r, next, params, body)
		return
	}
	// Detached from the client: a hang-up must not cancel a claim that the
	// database may already have committed, which would leave the key
	// PROCESSING with nobody running it for a whole lease.
	claimCtx, cancel := context.WithTimeout(context.WithoutCancel(r.Context()), m.cfg.ClaimTimeout)
	claimSent := time.Now() // the lease runs from the database's now, no earlier
	res, err := m.cfg.Store.Claim(claimCtx, params)
	cancel()
	ev := Event{Method: r.Method, Scope: scope, Key: key, Claim: time.Since(claimSent)}
	if errors.Is(err, idemdriver.ErrUnstorable) {
		// The scope passed idem's rules but not this database's: a server
		// fault that every retry would meet again.
		m.cfg.Logger.ErrorContext(r.Context(), "idem: the store cannot hold this request's scope", "err", err)
		ProblemFor(ErrScopeUnstorable, "the server could not scope this request").Write(w)
		return
	}
	if err != nil {
		serr := &StoreError{Op: "claim", Err: err}
		m.storeUnavailable(r.Context(), w, serr)
		ev.Kind, ev.Status, ev.Err, ev.Route = EventStoreUnavailable, http.StatusServiceUnavailable, serr, m.route(r, nil)
		m.observe(r.Context(), &ev)
		return
	}
	ev.Attempt = res.Record.Attempts
	if !res.Claimed {
		ev.Kind, ev.Status = m.answer(r.Context(), w, res.Record, params)
		ev.Route = m.route(r, nil)
		m.observe(r.Context(), &ev)
		return
	}
	r.Body = io.NopCloser(bytes.NewReader(body))
	m.execute(w, r, next, res, params, claimSent, &ev)
}

// unstorableScope says why no store can hold scope (ScopeFunc's rules), or
// "" when every store can.
func unstorableScope(scope string) string {
	switch {
	case len(scope) > MaxScopeLength:
		return "longer than MaxScopeLength"
	case !utf8.ValidString(scope):
		return "not valid UTF-8"
	case strings.IndexByte(scope, 0) >= 0:
		return "contains a NUL byte"
	}
	return ""
}

// readBody reads at most limit bytes of r's body.
func readBody(r *http.Request, limit int64) ([]byte, error) {
	if r.Body == nil || r.Body == http.NoBody {
		return nil, nil
	}
	defer r.Body.Close()
	body, err := io.ReadAll(io.LimitReader(r.Body, limit+1))
	if err != nil {
		return nil, err
	}
	if int64(len(body)) > limit {
		return nil, ErrRequestTooLarge
	}
	return body, nil
}

// answer responds to a request that did not win the claim, from the record
// it lost to (CONTRACT section 3), and returns the event kind and the status
// sent. The handler does not run.
func (m *Middleware) answer(ctx context.Context, w http.ResponseWriter, rec idemdriver.Record, p idemdriver.ClaimParams) (EventKind, int) {
	switch {
	case rec.Method != p.Method || rec.Path != p.Path:
		return EventKeyReused, writeProblem(w, ProblemFor(ErrKeyReused, fmt.Sprintf("this %s was first used for %s %s; a key names one request", HeaderKey, rec.Method, rec.Path)))
	case !bytes.Equal(rec.Fingerprint, p.Fingerprint):
		return EventKeyReused, writeProblem(w, ProblemFor(ErrKeyReused, fmt.Sprintf("this %s was first used with a different request body or query; use a new key for a new request", HeaderKey)))
	case rec.State == idemdriver.StateSucceeded && rec.Response != nil:
		return EventReplayed, m.replayResponse(w, rec.Response)
	case rec.State == idemdriver.StateSucceeded:
		// Damaged by hand or by a partial restore: no retry will ever find
		// the response, so say so instead of 409 forever.
		m.cfg.Logger.ErrorContext(ctx, "idem: a SUCCEEDED record holds no response", "scope", p.Scope, "key", p.Key)
		return EventReplayed, writeProblem(w, ProblemFor(ErrResponseMissing, "the request with this key succeeded, but its stored response is missing from the idempotency store; "+
			"it will not run again: ask the operator to release the key, or use a new key only if you know the first request had no effect"))
	default:
		// PROCESSING under a live lease; or a record that changed between the
		// claim and its answer (the driver retries those): ask to come back.
		pr := ProblemFor(ErrInFlight, "another request with this key is being processed; retry after the Retry-After delay to get its result")
		pr.RetryAfter = m.inFlightRetryAfter(rec.LeaseLeft)
		return EventInFlight, writeProblem(w, pr)
	}
}

// writeProblem writes pr and returns its status.
func writeProblem(w http.ResponseWriter, pr Problem) int {
	pr.Write(w)
	return pr.Status
}

// inFlightRetryAfter is the Retry-After of a 409 request-in-flight: the
// configured in-flight delay, never beyond what is left of the owner's lease
// (nor beyond LeaseDuration, which a database clock stepped back could make
// the lease left exceed), and at least 1 s (CONTRACT section 3).
func (m *Middleware) inFlightRetryAfter(leaseLeft time.Duration) time.Duration {
	return max(time.Second, min(m.cfg.InFlightRetryAfter, leaseLeft, m.cfg.LeaseDuration))
}

// replayResponse sends a stored response byte-exact (CONTRACT section 5)
// and returns the status sent.
func (m *Middleware) replayResponse(w http.ResponseWriter, resp *idemdriver.Response) int {
	h := w.Header()
	for k, v := range resp.Header {
		h[k] = v
	}
	h.Set(HeaderReplayed, "true")
	if !resp.BodyStored {
		h.Del("Content-Type")
		h.Del("Content-Encoding")
		for k := range h {
			if strings.HasPrefix(k, http.TrailerPrefix) {
				delete(h, k) // the trailers of a body not replayed
			}
		}
		pr := ProblemFor(ErrResponseNotStored, fmt.Sprintf(
			"the request with this key succeeded with status %d, but its %d-byte response exceeded the replay limit and was not stored; it will not run again",
			resp.Status, resp.BodySize))
		pr.Extra = map[string]any{"original_status": resp.Status}
		return writeProblem(w, pr)
	}
	writeResponse(w, resp.Status, resp.Body)
	return resp.Status
}

// leaseLost answers the caller of a fenced-out execution: its outcome was not
// recorded (and, in transactional mode, its writes rolled back); the key's
// new owner has the answer.
func (m *Middleware) leaseLost(w http.ResponseWriter) int {
	pr := ProblemFor(ErrLeaseLost, "this request's lease ran out and another request took its key over; its result was not recorded; retry with the same key to get the new owner's result")
	pr.RetryAfter = time.Second
	return writeProblem(w, pr)
}

// outcomeUnknown answers 503 store-unavailable for an execution that ran
// but whose outcome could not be recorded as this request's; detail says
// what a retry with the same key will get.
func (m *Middleware) outcomeUnknown(ctx context.Context, w http.ResponseWriter, err error, detail string) int {
	m.cfg.Logger.ErrorContext(ctx, "idem: outcome not recorded", "err", err)
	pr := ProblemFor(ErrStoreUnavailable, detail)
	pr.RetryAfter = m.cfg.StoreRetryAfter
	return writeProblem(w, pr)
}

func (m *Middleware) storeUnavailable(ctx context.Context, w http.ResponseWriter, err error) {
	m.cfg.Logger.ErrorContext(ctx, "idem: store unavailable", "err", err)
	pr := ProblemFor(ErrStoreUnavailable, "the idempotency store did not answer; the request was not processed, retry later with the same key")
	pr.RetryAfter = m.cfg.StoreRetryAfter
	pr.Write(w)
}

// storedResponse is what the completion records of a captured response:
// the status, the allow-listed headers and trailers, and the body when it
// fits MaxResponseBytes.
func (m *Middleware) storedResponse(c *captureWriter) idemdriver.Response {
	resp := idemdriver.Response{Status: c.statusCode(), Header: map[string][]string{}, BodySize: int64(c.body.Len())}
	for k, v := range c.sentHeader() {
		if m.replay[http.CanonicalHeaderKey(k)] {
			resp.Header[http.CanonicalHeaderKey(k)] = append([]string(nil), v...)
		}
	}
	// Trailers are kept under their http.TrailerPrefix key, allow-listed
	// by name like headers, and replayed as trailers.
	for name, v := range c.trailers() {
		if m.replay[name] {
			resp.Header[http.TrailerPrefix+name] = append([]string(nil), v...)
		}
	}
	if resp.BodySize <= m.cfg.MaxResponseBytes {
		resp.Body, resp.BodyStored = c.body.Bytes(), true
	}
	return resp
}

// execute runs next as the owner of a claim and records its outcome, then
// reports ev (the claim's event, its Claim duration and Attempt set) to the
// Observer.
func (m *Middleware) execute(w http.ResponseWriter, r *http.Request, next http.Handler, res idemdriver.ClaimResult, p idemdriver.ClaimParams, claimSent time.Time, ev *Event) {
	rec := res.Record
	ctx := r.Context()
	e := newExecution(m, ctx, rec, p)
	defer e.cancel(nil)
	hb := e.startHeartbeat(claimSent)

	cw := newCaptureWriter(w)
	hr := r.WithContext(e.ctx)
	ran := time.Now()
	panicked, recovered := runHandler(next, cw, hr)
	ev.Handler = time.Since(ran)
	hb.stop()
	ev.Route = m.route(r, hr)
	executed := EventExecuted
	if res.TookOver {
		executed = EventTakenOver
	}
	// done reports the event: kind, the status sent, and its cause.
	recording := time.Now()
	done := func(kind EventKind, status int, err error) {
		ev.Completion = time.Since(recording)
		ev.Kind, ev.Status, ev.Err = kind, status, err
		m.observe(ctx, ev)
	}

	cause := context.Cause(e.ctx)
	lost, unreachable := errors.Is(cause, ErrLeaseLost), errors.Is(cause, ErrStoreUnavailable)
	// Past MaxExecution a handler that used the claim's transaction cannot
	// be recorded as it answered: its context was cancelled, and
	// database/sql rolls a transaction back when the context it began on
	// ends (MySQL, SQLite), so its writes may be gone. Nor can a handler
	// that returned after its lease ran out: its record may expire before
	// anyone replays it (Config.Retention). Roll back and record FAILED
	// everywhere, so the retry runs again under the same relayed key.
	timedOut := errors.Is(cause, ErrExecutionTimeout) && (e.txBegun() || hb.leaseRanOut())
	if panicked {
		e.rollback()
		switch {
		case lost:
			done(EventLeaseLost, 0, cause)
		case unreachable:
			done(EventStoreUnavailable, 0, cause)
		case !e.fail():
			done(EventLeaseLost, 0, ErrLeaseLost)
		default:
			ev.Outcome = Failed
			done(executed, 0, fmt.Errorf("idem: the handler panicked: %v", recovered))
		}
		panic(recovered)
	}
	switch {
	case lost:
		e.rollback()
		done(EventLeaseLost, m.leaseLost(w), cause)
		return
	case timedOut:
		e.rollback()
		if !e.fail() {
			done(EventLeaseLost, m.leaseLost(w), ErrLeaseLost)
			return
		}
		ev.Outcome = Failed
		done(executed, m.outcomeUnknown(ctx, w, cause, fmt.Sprintf("the request ran past its time limit (%s) and its result was not recorded "+
			"(in transactional mode its writes were rolled back); retry with the same key: the request runs again", m.cfg.MaxExecution)), cause)
		return
	case unreachable:
		// The lease could not be renewed: the outcome cannot be recorded as
		// ours. The record stays PROCESSING until its lease runs out.
		e.rollback()
		done(EventStoreUnavailable, m.outcomeUnknown(ctx, w, cause, fmt.Sprintf("the idempotency store stopped answering while the request ran, so its result was not recorded; "+
			"retry with the same key: once the store answers and the lease (%s) runs out, the request runs again", m.cfg.LeaseDuration)), cause)
		return
	}
	outcome := m.cfg.Outcome(cw.statusCode())
	if e.released() {
		outcome = Released
	}
	ev.Outcome = outcome
	switch outcome {
	case Released:
		e.rollback()
		owned, err := e.release()
		switch {
		case err != nil:
			// The key could not be released: a corrected request would
			// meet key-reused. Mark it FAILED if the store answers, so the
			// same request runs again at once, and say so rather than send
			// an answer whose key stays burned.
			e.fail()
			done(EventCompletionFailed, m.outcomeUnknown(ctx, w, err, fmt.Sprintf("the request was refused (status %d), but the idempotency store could not release its key; "+
				"retry the same request with the same key", cw.statusCode())), err)
		case !owned:
			done(EventLeaseLost, m.leaseLost(w), ErrLeaseLost)
		default:
			cw.send()
			done(EventReleased, cw.statusCode(), nil)
		}
		return
	case Failed:
		e.rollback()
		if !e.fail() {
			done(EventLeaseLost, m.leaseLost(w), ErrLeaseLost) // another worker owns the key now: its answer counts
			return
		}
		cw.send()
		done(executed, cw.statusCode(), nil)
		return
	}
	ok, err := e.complete(m.storedResponse(cw))
	switch {
	case errors.Is(err, ErrTxAborted):
		m.cfg.Logger.ErrorContext(ctx, "idem: the handler answered 2xx although a statement failed in the claim's transaction, which aborted; "+
			"its writes are gone: answer an error when a statement fails", "scope", p.Scope, "key", p.Key, "status", cw.statusCode())
		e.rollback()
		if !e.fail() {
			done(EventLeaseLost, m.leaseLost(w), ErrLeaseLost)
			return
		}
		ev.Outcome = Failed
		done(executed, writeProblem(w, ProblemFor(ErrTxAborted, fmt.Sprintf("the request failed: a statement in its transaction failed, so its writes were rolled back "+
			"(the server answered %d regardless); retry with the same key: the request runs again", cw.statusCode()))), ErrTxAborted)
	case err != nil:
		// The completion (or the COMMIT that carries it) failed, perhaps
		// after it took effect. Fail is fenced on a PROCESSING record under
		// this execution's token, and waits for the row lock a transaction
		// still in flight holds: it marks the record FAILED only when the
		// outcome did not commit, so the retry runs at once instead of
		// waiting out the lease.
		owned, ferr := e.failed()
		var status int
		switch {
		case !owned && e.takenOver():
			// The COMMIT failed because another request took the key over
			// (on Galera, a certification failure, 1213, against a takeover
			// on another node): the lease was lost, as on one server.
			m.leaseLost(w)
		case ferr != nil:
			status = m.outcomeUnknown(ctx, w, err, fmt.Sprintf("the idempotency store failed while recording the result; "+
				"retry with the same key: it gets the result if it was recorded, or runs again once the lease (%s) runs out", m.cfg.LeaseDuration))
		case owned:
			status = m.outcomeUnknown(ctx, w, err, "the idempotency store failed while recording the result, which was not recorded "+
				"(in transactional mode the request's writes were rolled back with it); retry with the same key: the request runs again")
		default:
			status = m.outcomeUnknown(ctx, w, err, "the idempotency store reported an error while recording the result, but the key's record "+
				"has moved on (the result was recorded after all, or another request took the key over); retry with the same key to get its result")
		}
		done(EventCompletionFailed, status, err)
	case !ok:
		m.cfg.Logger.WarnContext(ctx, "idem: completion fenced out", "scope", p.Scope, "key", p.Key, "fencing_token", rec.FencingToken)
		done(EventLeaseLost, m.leaseLost(w), ErrLeaseLost)
	default:
		cw.send()
		done(executed, cw.statusCode(), nil)
	}
}

// runHandler calls next, recovering a panic so the claim can be released
// before the panic is raised again.
func runHandler(next http.Handler, w http.ResponseWriter, r *http.Request) (panicked bool, recovered any) {
	panicked = true
	defer func() {
		if panicked {
			recovered = recover()
		}
	}()
	next.ServeHTTP(w, r)
	return false, nil
}
