package idem

import (
	"errors"
	"fmt"
	"net/http"
	"strings"
	"time"

	"github.com/idemgo/idem/idemdriver"
	"github.com/idemgo/idem/internal/httpread"
	"github.com/idemgo/idem/internal/httpwrite"
	"github.com/idemgo/idem/internal/protocol"
)

// Middleware is the HTTP front of an Engine (CONTRACT sections 2 to 6): it
// reads a protected request, runs it through the Engine's protocol and
// writes the answer. NewMiddleware makes one.
type Middleware struct {
	eng     *Engine
	o       Options // defaulted
	methods map[string]bool
	replay  map[string]bool // canonical header names kept for replay
	body    httpread.Body
	dates   httpwrite.Dates // the key's expiry, Idempotency-Key-Expires
}

// neverReplayed are never replayed (CONTRACT section 5, RFC 9110 section 7.6.1).
var neverReplayed = map[string]bool{
	"Set-Cookie": true, "Date": true, "Content-Length": true, "Connection": true,
	"Keep-Alive": true, "Proxy-Connection": true, "Transfer-Encoding": true,
	"Te": true, "Trailer": true, "Upgrade": true, "Proxy-Authenticate": true,
	HeaderReplayed: true, HeaderKey: true, HeaderKeyExpires: true,
	HeaderPreferenceApplied: true, // each answer's own (RFC 7240 section 3)
}

// Engine returns the engine behind m.
func (m *Middleware) Engine() *Engine { return m.eng }

// Handler wraps next: protected requests go through the claim.
func (m *Middleware) Handler(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		m.serve(w, r, next)
	})
}

// serve reads r, runs it through the protocol and writes the answer.
func (m *Middleware) serve(w http.ResponseWriter, r *http.Request, next http.Handler) {
	// RFC 9110 methods are case-sensitive, but routers may not be.
	if !m.methods[strings.ToUpper(r.Method)] {
		next.ServeHTTP(w, r)
		return
	}
	values := r.Header.Values(HeaderKey)
	if len(values) == 0 && m.o.KeyOptional {
		next.ServeHTTP(w, r)
		return
	}
	rq := m.read(w, r, values, next)
	var a protocol.Answer
	if rq.refusal == nil {
		a = m.eng.proto.Run(r.Context(), rq.p, rq.key, rq.wait, rq.job)
	}
	m.respond(w, r, rq, a)
}

// request is what serve read of a protected request: its claim, the
// client's key, its wait, and the job that runs its handler; or the
// refusal that answers it before any claim.
type request struct {
	p       idemdriver.ClaimParams
	key     string
	echo    string // the key's field line as sent, echoed on the answer
	wait    time.Duration
	asked   bool // the wait is the request's Prefer: wait, named in Preference-Applied
	job     *httpJob
	refusal *refusal
}

// refusal is a request's problem before its claim: the error that names
// its kind (a sentinel, or an error wrapping one: ProblemFor), and the
// detail.
type refusal struct {
	kind   error
	detail string
}

// read reads r's key, scope, path, body and wait, in that order, then
// builds the claim, where a scope no store can hold is refused; the first
// check that fails refuses r. w carries what the body's reading asks of
// the connection.
func (m *Middleware) read(w http.ResponseWriter, r *http.Request, values []string, next http.Handler) request {
	refuse := func(kind error, detail string) request { return request{refusal: &refusal{kind, detail}} }
	key, err := httpread.ParseKey(values)
	if errors.Is(err, ErrMissingKey) {
		return refuse(ErrMissingKey, fmt.Sprintf("this endpoint requires an %s header: a unique value per logical request, sent again unchanged on every retry", HeaderKey))
	} else if err != nil {
		return refuse(err, strings.TrimPrefix(err.Error(), "idem: "))
	}
	scope, err := m.o.Scope(r)
	if err != nil || scope == "" {
		// The error is the server's: logged, never sent.
		if err != nil {
			m.o.Engine.Logger.InfoContext(r.Context(), "idem: Scope refused the request", "err", err)
		}
		return refuse(ErrMissingScope, "this request names no owner for its key; authenticate first")
	}
	path := r.URL.EscapedPath()
	if len(path) > MaxPathLength {
		return refuse(ErrPathTooLong, fmt.Sprintf("the request path is %d bytes; a protected request's path may have at most %d", len(path), MaxPathLength))
	}
	body, err := m.body.Read(w, r)
	if errors.Is(err, httpread.ErrTooLarge) {
		return refuse(ErrRequestTooLarge, fmt.Sprintf("the request body exceeds %d bytes", m.o.Request.MaxBytes))
	} else if err != nil {
		return refuse(ErrBodyUnreadable, "the request body could not be read to its end; nothing was processed, send the request again with the same key")
	}
	// How long r waits for its key's execution in flight: its Prefer wait
	// (RFC 7240 section 4.3), at most Waiting.Max, else Waiting.Wait.
	rq := request{key: key, echo: values[0], job: &httpJob{m: m, r: r, w: w, body: body, next: next}}
	if m.o.Engine.Waiting.Max > 0 {
		rq.wait = m.o.Engine.Waiting.Wait
		if d, ok := httpread.PreferredWait(r); ok {
			rq.wait, rq.asked = min(d, m.o.Engine.Waiting.Max), d > 0
		}
	}
	if why := protocol.UnstorableScope(scope); why != "" {
		m.o.Engine.Logger.ErrorContext(r.Context(), "idem: Scope returned a scope no store can hold", "reason", why, "length", len(scope))
		return refuse(ErrScopeUnstorable, "the server could not scope this request")
	}
	rq.p = m.eng.proto.Params(scope, key, r.Method, path, m.o.Request.Fingerprint(r, body))
	return rq
}
