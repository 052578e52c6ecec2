// Package idemconnect protects connect-go handlers with idem and answers
// idem's own refusals to Connect-protocol clients as Connect errors with the
// right codes.
//
// A Connect handler is an http.Handler, so idem's middleware can run it as
// is, once per claim, its response recorded and replayed byte-exact
// (CONTRACT sections 3 and 5). What a Connect client cannot read is idem's own
// answers: RFC 9457 problem details, which connect-go's client maps from the
// HTTP status alone (a 409 or 422 becomes code unknown, a 400 internal).
// Handler wraps the protected handler and, for unary Connect-protocol
// requests, rewrites every problem details answer (application/problem+json:
// idem's, or one a plain handler in the mux wrote) with connect-go's
// ErrorWriter:
//
//	| idem's problem type          | Connect code        | HTTP |
//	|------------------------------|---------------------|------|
//	| missing-key, invalid-key     | invalid_argument    | 400  |
//	| missing-scope                | unauthenticated     | 401  |
//	| request-too-large            | resource_exhausted  | 429  |
//	| key-reused                   | failed_precondition | 400  |
//	| outcome-unknown              | failed_precondition | 400  |
//	| request-in-flight            | unavailable + retry | 503  |
//	| response-not-stored          | already_exists      | 409  |
//	| store-unavailable            | unavailable + retry | 503  |
//	| step-unreconciled            | unavailable + retry | 503  |
//	| about:blank (by its status)  | 400 invalid_argument, 401 unauthenticated, 413 resource_exhausted, 414 invalid_argument, 503 unavailable, others internal | |
//
// "+ retry" is a google.rpc.RetryInfo error detail whose retry_delay is idem's
// Retry-After, which is also kept as the Retry-After response header (the
// error's metadata). unavailable is the code gRPC and Connect clients retry
// by default, which is right for both: the request did not run (store
// unavailable) or runs elsewhere (in flight), and the retry with the same key
// gets its result. The error message is the problem's detail, and the
// problem's type URI is kept in the Idem-Problem-Type response header.
//
// The handler's own answers, errors included, pass through untouched and are
// recorded under Options.Engine.Response.Outcome by their HTTP status: a Connect error with
// code invalid_argument (400) is recorded and replayed, unavailable (503) or
// internal (500) is FAILED and runs again. Under the default policy a 409
// (aborted, already_exists) and a 499 (canceled) are recorded and replayed;
// Outcome treats them as FAILED instead.
//
// Only unary Connect-protocol requests suit idem, and only they are
// translated: the whole response is held until its outcome is recorded, so a
// streaming response would arrive at once, at the end. Connect streams, gRPC
// and gRPC-Web requests pass through Handler untranslated; gRPC and gRPC-Web
// responses carry their status in HTTP trailers (Grpc-Status, Grpc-Message),
// which idem replays only when Options.Replay.Headers names them, so they are
// not supported.
//
// # The fingerprint
//
// A retry must send the same message (CONTRACT section 2), but not always
// the same bytes: connect-go's proto codec writes a map's entries in random
// order, and a client may compress one attempt and not another. Before
// idem reads a keyed unary Connect-protocol request, Handler puts its body
// in one form: a gzip body is decompressed (and its Content-Encoding
// removed), and a binary proto message (application/proto) is decoded and
// encoded again deterministically (map entries sorted by key) when its
// procedure, "/<package>.<Service>/<Method>", is a method of a service in
// protoregistry.GlobalFiles, where generated code registers it. The handler
// reads that form, and idem fingerprints it: a JSON message
// (application/json) as every JSON body, canonicalized per RFC 8785 (package
// fingerprint). A body over MaxCanonicalBytes, in another encoding, or of a
// procedure the registry does not know passes as sent and is hashed as
// sent: a message with a map then gets failed_precondition (key-reused) on
// the retries whose bytes differ. So does a map inside a google.protobuf.Any
// packed again for a retry: an Any's value is kept as its packer's bytes.
//
// # Metadata
//
// A replay carries the response headers, trailers and error metadata of the
// first call that are on Options.Replay.Headers, as on net/http: in the
// Connect protocol's unary responses all three are HTTP headers, a trailer
// under the Trailer- prefix. Set Options.Replay.Headers to ReplayHeaders(names...)
// with the metadata names the handlers set; it lists each name in both forms.
// Metadata off the list is not replayed.
//
// # Deadlines
//
// The execution of a protected request is detached from the client, as on
// net/http (CONTRACT section 4): Handler removes the client's deadline
// (Connect-Timeout-Ms, Grpc-Timeout) from the request before connect-go
// reads it, so a client that gives up after a short deadline does not cut
// the execution short (a deadline_exceeded, recorded FAILED, would run it
// again on retry); the execution is bounded by the lease and
// Options.Engine.Lease.MaxExecution, and the retry with the same key gets its result (or
// unavailable while it still runs). Requests idem passes through keep their
// deadline.
//
// # Panics
//
// A panic in the handler of a protected execution reaches idem, which
// records the claim FAILED (a retry runs again) and raises it again. Handler
// recovers it there and answers a Connect error with code internal (HTTP
// 500; a 500 problem for a request of another protocol), logged as net/http
// logs a panic. Left to net/http, the panic would drop the connection, and
// Go's http.Transport resends by itself a POST that carries an
// Idempotency-Key when its reused connection breaks before any response
// byte: one client call would run the handler twice. connect.WithRecover on
// the handler answers the panic inside idem's writer instead (internal, 500:
// FAILED), with the same effect. A panic of a request idem passes through is
// left to net/http.
package idemconnect

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"log"
	"net/http"
	"runtime/debug"
	"strconv"
	"strings"
	"time"

	"connectrpc.com/connect"
	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/idemgo/idem"
	"github.com/idemgo/idem/internal/httpwrite"
)

// HeaderProblemType carries the type URI of the idem problem a Connect error
// was translated from (for example
// https://github.com/idemgo/idem/blob/main/docs/problems.md#key-reused).
const HeaderProblemType = "Idem-Problem-Type"

// HeaderNewKeySafe carries the problem's new_key_safe member, "true" or
// "false": whether sending the call again under a new key is safe
// (docs/problems.md, CONTRACT section 11.5).
const HeaderNewKeySafe = "Idem-New-Key-Safe"

// Handler returns h (a Connect handler, or a mux of them) protected by mw,
// with idem's own answers to unary Connect-protocol requests written as
// Connect errors (see the package documentation). Other requests get
// mw.Handler(h) unchanged. When h is an *http.ServeMux, a request that no
// pattern of it matches (an unknown procedure) reaches it unprotected, for
// its 404 or 405: recorded, it would burn the key for the corrected call.
func Handler(mw *idem.Middleware, h http.Handler) http.Handler {
	protected := mw.Handler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if _, ok := idem.ExecutionFromContext(r.Context()); ok {
			if st, _ := r.Context().Value(stateKey{}).(*state); st != nil {
				st.protected = true
			}
			r = detachDeadline(r)
		}
		h.ServeHTTP(w, r)
	}))
	ew := connect.NewErrorWriter()
	mux, _ := h.(*http.ServeMux)
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if mux != nil {
			if _, pattern := mux.Handler(r); pattern == "" {
				// No procedure of the mux takes it: the mux answers
				// 404 (or 405), not recorded, so the key is not burnt
				// for the corrected call.
				h.ServeHTTP(w, r)
				return
			}
		}
		st := &state{}
		// A panic is answered below, connect-go's way (httpwrite.RaisePanics).
		ctx, raised := httpwrite.RaisePanics(context.WithValue(r.Context(), stateKey{}, st))
		r = r.WithContext(ctx)
		var tw *translator
		defer func() {
			if !st.protected {
				return // a panic of a request idem passed through: net/http's, as usual
			}
			if rec := recover(); rec != nil {
				answerPanic(ew, w, r, tw, rec, raised.StackOr(debug.Stack))
			}
		}()
		if !isConnect(ew, r) {
			protected.ServeHTTP(w, r)
			return
		}
		tw = &translator{w: w}
		r = canonical(r)
		protected.ServeHTTP(tw, r)
		if tw.problem {
			writeProblem(ew, w, r, tw.status, tw.body.Bytes())
		}
	})
}

// ReplayHeaders returns an allow-list for Options.Replay.Headers that keeps a
// Connect API's metadata for replay: idem.DefaultReplayHeaders() and each of
// metadata (header names: the response headers, trailers and error metadata
// the handlers set), each name also as the header that carries it as a
// trailer in the Connect protocol's unary responses (Trailer-<name>). In
// that protocol every piece of metadata is an HTTP header (an error's
// metadata too), which idem keeps by the allow-list like any header; a
// trailer is a header with the Trailer- prefix, which the list must name as
// such. Headers off the list are not replayed, as on net/http (CONTRACT
// section 5).
func ReplayHeaders(metadata ...string) []string {
	names := append(idem.DefaultReplayHeaders(), metadata...)
	out := make([]string, 0, 2*len(names))
	for _, n := range names {
		out = append(out, n, connectTrailerPrefix+n)
	}
	return out
}

// connectTrailerPrefix prefixes the headers that carry a unary Connect
// response's trailers.
const connectTrailerPrefix = "Trailer-"

// timeoutHeaders carry the client's deadline: Connect's, and gRPC's.
var timeoutHeaders = []string{"Connect-Timeout-Ms", "Grpc-Timeout"}

// detachDeadline returns r without the client's deadline headers, which
// connect-go's handler would turn into a deadline on the execution's
// context: idem detaches the execution from the client (a client that gives
// up does not stop the work or its recording; CONTRACT section 4), and the
// execution is bounded by the lease and Options.Engine.Lease.MaxExecution instead. r's
// header is copied, not changed.
func detachDeadline(r *http.Request) *http.Request {
	for _, k := range timeoutHeaders {
		if _, ok := r.Header[k]; ok {
			r2 := r.WithContext(r.Context())
			r2.Header = r.Header.Clone()
			for _, k := range timeoutHeaders {
				delete(r2.Header, k)
			}
			return r2
		}
	}
	return r
}

// state is what Handler learns of a request from inside idem's handler.
type state struct {
	protected bool // it runs as a protected execution (a claim's owner)
}

type stateKey struct{}

// answerPanic answers a protected execution's panic, which idem recorded
// FAILED and raised again: a Connect (or gRPC) error with code internal, or
// a 500 problem for another protocol, on the client's writer, not recorded;
// logged as net/http logs a handler's panic. Left to net/http, the panic
// would drop the connection, and Go's http.Transport resends a keyed POST
// whose reused connection broke before any response byte: one client call
// would run the handler twice.
func answerPanic(ew *connect.ErrorWriter, w http.ResponseWriter, r *http.Request, tw *translator, rec any, stack []byte) {
	if rec != http.ErrAbortHandler { //nolint:errorlint // the sentinel itself, as net/http compares it
		logf := log.Printf
		if srv, _ := r.Context().Value(http.ServerContextKey).(*http.Server); srv != nil && srv.ErrorLog != nil {
			logf = srv.ErrorLog.Printf
		}
		logf("idemconnect: panic serving %s (the claim is recorded FAILED; a retry runs again): %v\n%s", r.URL.Path, rec, stack)
	}
	if tw != nil && tw.wrote && !tw.problem {
		return // idem holds a protected answer until it is recorded: not reached
	}
	h := w.Header()
	h.Del("Content-Length")
	h.Del(HeaderProblemType)
	h.Del(HeaderNewKeySafe)
	if ew.IsSupported(r) {
		_ = ew.Write(w, r, connect.NewError(connect.CodeInternal, errors.New("internal error: the handler panicked; a retry with the same key runs it again")))
		return
	}
	idem.Problem{Type: "about:blank", Title: http.StatusText(http.StatusInternalServerError), Status: http.StatusInternalServerError}.Write(w)
}

// Outcome is idem.DefaultOutcome with the Connect codes that call for a
// retry added as FAILED: 409 (aborted: a concurrency conflict, gRPC's advice
// is to retry the whole operation; already_exists shares the status) and 499
// (canceled). Set it as Options.Engine.Response.Outcome for a Connect API.
func Outcome(status int) idem.Outcome {
	if status == http.StatusConflict || status == 499 {
		return idem.Failed
	}
	return idem.DefaultOutcome(status)
}

// isConnect reports whether r is a unary Connect-protocol request: not
// gRPC, gRPC-Web or a Connect stream (application/connect+...).
func isConnect(ew *connect.ErrorWriter, r *http.Request) bool {
	ct := strings.ToLower(r.Header.Get("Content-Type"))
	return ew.IsSupported(r) && !strings.HasPrefix(ct, "application/grpc") && !strings.HasPrefix(ct, "application/connect+")
}

// translator passes the protected handler's response through, except one
// that idem answers with problem details, which it holds for writeProblem.
type translator struct {
	w       http.ResponseWriter
	wrote   bool
	problem bool
	status  int
	body    bytes.Buffer
}

func (t *translator) Header() http.Header { return t.w.Header() }

func (t *translator) WriteHeader(status int) {
	if t.wrote || status < 200 {
		return
	}
	t.wrote = true
	if strings.HasPrefix(t.w.Header().Get("Content-Type"), "application/problem+json") {
		t.problem, t.status = true, status
		return
	}
	t.w.WriteHeader(status)
}

func (t *translator) Write(b []byte) (int, error) {
	if !t.wrote {
		t.WriteHeader(http.StatusOK)
	}
	if t.problem {
		return t.body.Write(b)
	}
	return t.w.Write(b)
}

// Flush flushes the client's writer, except while a problem is held.
func (t *translator) Flush() {
	if !t.problem {
		_ = http.NewResponseController(t.w).Flush()
	}
}

// Unwrap returns the client's writer (for http.ResponseController).
func (t *translator) Unwrap() http.ResponseWriter { return t.w }

// codes maps idem's problem types (docs/problems.md) to Connect codes.
var codes = map[string]connect.Code{
	"missing-key":         connect.CodeInvalidArgument,
	"invalid-key":         connect.CodeInvalidArgument,
	"missing-scope":       connect.CodeUnauthenticated,
	"request-too-large":   connect.CodeResourceExhausted,
	"key-reused":          connect.CodeFailedPrecondition,
	"outcome-unknown":     connect.CodeFailedPrecondition,
	"request-in-flight":   connect.CodeUnavailable,
	"response-not-stored": connect.CodeAlreadyExists,
	"store-unavailable":   connect.CodeUnavailable,
	"step-unreconciled":   connect.CodeUnavailable,
}

// Code returns the Connect code for an idem problem of type problemType
// (a URI, or about:blank) answered with status (see the package
// documentation's table).
func Code(problemType string, status int) connect.Code {
	if c, ok := codes[strings.TrimPrefix(problemType, idem.ProblemTypeBase)]; ok && strings.HasPrefix(problemType, idem.ProblemTypeBase) {
		return c
	}
	switch status {
	case http.StatusBadRequest, http.StatusRequestURITooLong:
		return connect.CodeInvalidArgument
	case http.StatusUnauthorized:
		return connect.CodeUnauthenticated
	case http.StatusRequestEntityTooLarge:
		return connect.CodeResourceExhausted
	case http.StatusServiceUnavailable:
		return connect.CodeUnavailable
	default:
		return connect.CodeInternal
	}
}

// writeProblem writes idem's problem (status, body) as a Connect error.
func writeProblem(ew *connect.ErrorWriter, w http.ResponseWriter, r *http.Request, status int, body []byte) {
	var p idem.Problem
	if err := json.Unmarshal(body, &p); err != nil || p.Type == "" {
		p = idem.Problem{Type: "about:blank", Status: status, Detail: http.StatusText(status)}
	}
	msg := p.Detail
	if msg == "" {
		msg = p.Title
	}
	cerr := connect.NewError(Code(p.Type, status), errors.New(msg))
	h := w.Header()
	if secs, err := strconv.ParseInt(h.Get("Retry-After"), 10, 64); err == nil && secs > 0 {
		if d, err := connect.NewErrorDetail(&errdetails.RetryInfo{RetryDelay: durationpb.New(time.Duration(secs) * time.Second)}); err == nil {
			cerr.AddDetail(d)
		}
	}
	h.Del("Content-Length")
	h.Set(HeaderProblemType, p.Type)
	h.Set(HeaderNewKeySafe, strconv.FormatBool(p.NewKeySafe))
	_ = ew.Write(w, r, cerr) // a write error means the client is gone
}
