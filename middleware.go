package idem

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strings"
	"sync"
	"time"
	"unicode/utf8"

	"github.com/idemgo/idem/idemdriver"
	"github.com/idemgo/idem/internal/httprec"
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
	replays *replayCache    // nil without Config.ReplayCacheBytes
	// turns holds the current turn of each key that one-commit requests of
	// this process are claiming or running (see serveOneCommit); turnsMu
	// guards it. turnWait bounds a request's wait for its turn.
	turnsMu  sync.Mutex
	turns    map[localKey]*keyTurn
	turnWait time.Duration
}

// neverReplayed are the headers dropped from the replay allow-list whatever
// it says (CONTRACT section 5): cookies, hop-by-hop headers (RFC 9110
// section 7.6.1), Date and Content-Length (recomputed on replay).
var neverReplayed = map[string]bool{
	"Set-Cookie": true, "Date": true, "Content-Length": true, "Connection": true,
	"Keep-Alive": true, "Proxy-Connection": true, "Transfer-Encoding": true,
	"Te": true, "Trailer": true, "Upgrade": true, "Proxy-Authenticate": true,
	HeaderReplayed: true, HeaderKey: true, HeaderKeyExpires: true,
}

// HeaderKeyExpires is the response header that advertises when the key of
// a protected request expires: the record's expires_at (database clock) as
// an RFC 9110 HTTP-date (section 5.6.7, as Expires and Retry-After carry
// it; rounded down to the second, so never later than the truth). A retry
// with the key after it names a new request (Config.Retention). It is sent
// on every answer to a request that reached the claim, except when the
// claim failed (503) or the execution was released (no record is left).
const HeaderKeyExpires = "Idempotency-Key-Expires"

// New validates cfg (after WithDefaults) and returns the middleware. The
// error names every invalid field.
func New(cfg Config) (*Middleware, error) { return newMiddleware(cfg, true) }

// newMiddleware is New; forHTTP requires Config.Scope (NewEngine does not).
func newMiddleware(cfg Config, forHTTP bool) (*Middleware, error) {
	cfg = cfg.WithDefaults()
	if err := cfg.validate(forHTTP); err != nil {
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
	if cfg.ReplayCacheBytes > 0 && forHTTP {
		m.replays = newReplayCache(cfg.ReplayCacheBytes, cfg.ReplayCacheTTL)
	}
	if cfg.OneCommit {
		m.turns = map[localKey]*keyTurn{}
		m.turnWait = cfg.OneCommitWait
		// On a single-writer store a duplicate waits for the owner's
		// transaction, as for the database's write lock (OneCommitWait is
		// not used there): at most as long as that transaction may last.
		if sw, ok := cfg.Store.(idemdriver.SingleWriter); ok && sw.SingleWriter() {
			m.turnWait = cfg.ClaimTimeout + cfg.MaxExecution + cfg.CompleteTimeout
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
		m.writeProblem(w, r, ProblemFor(kind, strings.TrimPrefix(err.Error(), "idem: ")))
		return
	}
	// Echoed as sent on every answer from here on, the replay included, so
	// a client (stripe-go's LastResponse.IdempotencyKey) can tell which key
	// an answer is for.
	w.Header().Set(HeaderKey, values[0])
	scope, err := m.cfg.Scope(r)
	if err != nil || scope == "" {
		// An empty scope is most often an unauthenticated request read as
		// the zero value: sharing one empty scope would let strangers' keys
		// meet. The Scope function's error is the server's (a session store's
		// failure, say) and may name its internals: logged, never sent.
		if err != nil {
			m.cfg.Logger.InfoContext(r.Context(), "idem: Scope refused the request", "err", err)
		}
		m.writeProblem(w, r, ProblemFor(ErrMissingScope, "this request names no owner for its key; authenticate first"))
		return
	}
	if why := unstorableScope(scope); why != "" {
		// The server's Scope function is at fault, not the client: a 500
		// that retries cannot cure, rather than a 503 that invites them.
		m.cfg.Logger.ErrorContext(r.Context(), "idem: Scope returned a scope no store can hold", "reason", why, "length", len(scope))
		m.writeProblem(w, r, ProblemFor(ErrScopeUnstorable, "the server could not scope this request"))
		return
	}
	path := r.URL.EscapedPath()
	if len(path) > MaxPathLength {
		// A client mistake every store could not hold (MySQL's column
		// holds 64 KiB): answered here, not as a store error (a 503 that
		// invites retries that cannot succeed).
		m.writeProblem(w, r, ProblemFor(ErrPathTooLong, fmt.Sprintf("the request path is %d bytes; a protected request's path may have at most %d", len(path), MaxPathLength)))
		return
	}
	body, err := readBody(r, m.cfg.MaxRequestBytes)
	if errors.Is(err, ErrRequestTooLarge) {
		m.writeProblem(w, r, ProblemFor(ErrRequestTooLarge, fmt.Sprintf("the request body exceeds %d bytes", m.cfg.MaxRequestBytes)))
		return
	}
	if err != nil {
		// The client stopped sending mid-body: nothing was claimed.
		m.writeProblem(w, r, ProblemFor(ErrBodyUnreadable, "the request body could not be read to its end; nothing was processed, send the request again with the same key"))
		return
	}
	params := idemdriver.ClaimParams{
		Scope: scope, Key: key, Method: r.Method, Path: path,
		Fingerprint:   m.cfg.Fingerprint(r, body),
		LeaseDuration: m.cfg.LeaseDuration, Retention: m.cfg.Retention,
		Owner: m.cfg.Owner,
	}
	if m.answerCached(w, r, params) {
		return
	}
	if m.cfg.OneCommit {
		m.serveOneCommit(w, r, next, params, body)
		return
	}
	ev := Event{Method: r.Method, Scope: scope, Key: key}
	res, claimSent, err := m.claim(r.Context(), params, &ev)
	if errors.Is(err, idemdriver.ErrUnstorable) {
		// The scope passed idem's rules but not this database's: a server
		// fault that every retry would meet again.
		m.cfg.Logger.ErrorContext(r.Context(), "idem: the store cannot hold this request's scope", "err", err)
		m.writeProblem(w, r, ProblemFor(ErrScopeUnstorable, "the server could not scope this request"))
		return
	}
	if err != nil {
		serr := &StoreError{Op: "claim", Err: err}
		m.storeUnavailable(w, r, serr)
		ev.Kind, ev.Status, ev.Err, ev.Route = EventStoreUnavailable, http.StatusServiceUnavailable, serr, m.route(r, nil)
		m.observe(r.Context(), &ev)
		return
	}
	if !res.Record.ExpiresAt.IsZero() {
		w.Header().Set(HeaderKeyExpires, res.Record.ExpiresAt.UTC().Format(http.TimeFormat))
	}
	if !res.Claimed {
		m.remember(params, res.Record)
		ev.Kind, ev.Status = m.answer(w, r, res.Record, params)
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
	// The server's request body: closing it releases the connection for
	// the next request; a Close error says nothing the read did not.
	defer func() { _ = r.Body.Close() }()
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
func (m *Middleware) answer(w http.ResponseWriter, r *http.Request, rec idemdriver.Record, p idemdriver.ClaimParams) (EventKind, int) {
	decision := lostTo(rec, p)
	switch {
	case decision == idemdriver.DecisionKeyReused && (rec.Method != p.Method || rec.Path != p.Path):
		return EventKeyReused, m.writeProblem(w, r, ProblemFor(ErrKeyReused, fmt.Sprintf("this %s was first used for %s %s; a key names one request", HeaderKey, rec.Method, rec.Path)))
	case decision == idemdriver.DecisionKeyReused:
		return EventKeyReused, m.writeProblem(w, r, ProblemFor(ErrKeyReused, fmt.Sprintf("this %s was first used with a different request (its body, query or media type differ); use a new key for a new request", HeaderKey)))
	case decision == idemdriver.DecisionReplay && rec.Response != nil:
		return EventReplayed, m.replayResponse(w, r, rec.Response)
	case decision == idemdriver.DecisionReplay:
		// Damaged by hand or by a partial restore: no retry will ever find
		// the response, so say so instead of 409 forever.
		m.cfg.Logger.ErrorContext(r.Context(), "idem: a SUCCEEDED record holds no response", "scope", p.Scope, "key", p.Key)
		return EventReplayed, m.writeProblem(w, r, ProblemFor(ErrResponseMissing, "the request with this key succeeded, but its stored response is missing from the idempotency store; "+
			"it will not run again: ask the operator to release the key, or use a new key only if you know the first request had no effect"))
	default:
		// PROCESSING under a live lease; or a record that changed between the
		// claim and its answer (the driver retries those): ask to come back.
		pr := ProblemFor(ErrInFlight, "another request with this key is being processed; retry after the Retry-After delay to get its result")
		pr.RetryAfter = m.inFlightRetryAfter(rec.LeaseLeft)
		return EventInFlight, m.writeProblem(w, r, pr)
	}
}

// writeProblem writes pr, through Config.ProblemWriter when set, and
// returns the status sent.
func (m *Middleware) writeProblem(w http.ResponseWriter, r *http.Request, pr Problem) int {
	if m.cfg.ProblemWriter == nil {
		pr.Write(w)
		return pr.Status
	}
	sw := httprec.New(w, false)
	m.cfg.ProblemWriter(sw, r, pr)
	if sw.Status == 0 {
		return http.StatusOK
	}
	return sw.Status
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
func (m *Middleware) replayResponse(w http.ResponseWriter, r *http.Request, resp *idemdriver.Response) int {
	h := w.Header()
	for k, v := range resp.Header {
		h[k] = v // the record's own (the replay cache hands out copies)
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
		return m.writeProblem(w, r, pr)
	}
	writeResponse(w, resp.Status, resp.Body)
	return resp.Status
}

// leaseLost answers the caller of a fenced-out execution: its outcome was not
// recorded (and, in transactional mode, its writes rolled back); the key's
// new owner has the answer.
func (m *Middleware) leaseLost(w http.ResponseWriter, r *http.Request) int {
	pr := ProblemFor(ErrLeaseLost, "this request's lease ran out and another request took its key over; its result was not recorded; retry with the same key to get the new owner's result")
	pr.RetryAfter = time.Second
	return m.writeProblem(w, r, pr)
}

// outcomeUnknown answers 503 store-unavailable for an execution that ran
// but whose outcome could not be recorded as this request's; detail says
// what a retry with the same key will get.
func (m *Middleware) outcomeUnknown(w http.ResponseWriter, r *http.Request, err error, detail string) int {
	m.cfg.Logger.ErrorContext(r.Context(), "idem: outcome not recorded", "err", err)
	pr := ProblemFor(ErrStoreUnavailable, detail)
	pr.RetryAfter = m.cfg.StoreRetryAfter
	return m.writeProblem(w, r, pr)
}

func (m *Middleware) storeUnavailable(w http.ResponseWriter, r *http.Request, err error) {
	m.cfg.Logger.ErrorContext(r.Context(), "idem: store unavailable", "err", err)
	pr := ProblemFor(ErrStoreUnavailable, "the idempotency store did not answer; the request was not processed, retry later with the same key")
	pr.RetryAfter = m.cfg.StoreRetryAfter
	m.writeProblem(w, r, pr)
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

// execute runs next as the owner of a claim (the protocol is run's),
// writes the answer its verdict calls for, and reports ev to the Observer.
func (m *Middleware) execute(w http.ResponseWriter, r *http.Request, next http.Handler, res idemdriver.ClaimResult, p idemdriver.ClaimParams, claimSent time.Time, ev *Event) {
	ctx := r.Context()
	cw := newCaptureWriter(w)
	fin := m.run(ctx, res, p, claimSent, ev, func(ectx context.Context) (int, bool, any) {
		hr := r.WithContext(ectx)
		panicked, recovered := runHandler(next, cw, hr)
		ev.Route = m.route(r, hr)
		return cw.statusCode(), panicked, recovered
	}, func() idemdriver.Response { return m.storedResponse(cw) })
	switch fin.verdict {
	case verdictSend:
		if ev.Kind == EventReleased {
			w.Header().Del(HeaderKeyExpires) // no record is left
		}
		cw.send()
		ev.Status = cw.statusCode()
	case verdictLeaseLost:
		ev.Status = m.leaseLost(w, r)
	case verdictTimedOut:
		ev.Status = m.outcomeUnknown(w, r, fin.err, fmt.Sprintf("the request ran past its time limit (%s) and its result was not recorded "+
			"(in transactional mode its writes were rolled back); retry with the same key: the request runs again", m.cfg.MaxExecution))
	case verdictUnreachable:
		ev.Status = m.outcomeUnknown(w, r, fin.err, fmt.Sprintf("the idempotency store stopped answering while the request ran, so its result was not recorded; "+
			"retry with the same key: once the store answers and the lease (%s) runs out, the request runs again", m.cfg.LeaseDuration))
	case verdictReleaseFailed:
		ev.Status = m.outcomeUnknown(w, r, fin.err, fmt.Sprintf("the request was refused (status %d), but the idempotency store could not release its key; "+
			"retry the same request with the same key", cw.statusCode()))
	case verdictTxAborted:
		ev.Status = m.writeProblem(w, r, ProblemFor(ErrTxAborted, fmt.Sprintf("the request failed: a statement in its transaction failed, so its writes were rolled back "+
			"(the server answered %d regardless); retry with the same key: the request runs again", cw.statusCode())))
	case verdictCompletionUnknown:
		ev.Status = m.outcomeUnknown(w, r, fin.err, fmt.Sprintf("the idempotency store failed while recording the result; "+
			"retry with the same key: it gets the result if it was recorded, or runs again once the lease (%s) runs out", m.cfg.LeaseDuration))
	case verdictCompletionNotRecorded:
		ev.Status = m.outcomeUnknown(w, r, fin.err, "the idempotency store failed while recording the result, which was not recorded "+
			"(in transactional mode the request's writes were rolled back with it); retry with the same key: the request runs again")
	case verdictCompletionMovedOn:
		ev.Status = m.outcomeUnknown(w, r, fin.err, "the idempotency store reported an error while recording the result, but the key's record "+
			"has moved on (the result was recorded after all, or another request took the key over); retry with the same key to get its result")
	}
	m.observe(ctx, ev)
}

// runHandler calls next, recovering a panic so its outcome can be recorded
// (FAILED, CONTRACT section 5) before the panic is raised again.
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
