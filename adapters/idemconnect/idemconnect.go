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
//	| request-in-flight            | unavailable + retry | 503  |
//	| response-not-stored          | already_exists      | 409  |
//	| store-unavailable            | unavailable + retry | 503  |
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
// recorded under Config.Outcome by their HTTP status: a Connect error with
// code invalid_argument (400) is recorded and replayed, unavailable (503) or
// internal (500) is FAILED and runs again. Under the default policy a 409
// (aborted, already_exists) and a 499 (canceled) are recorded and replayed;
// Outcome treats them as FAILED instead.
//
// Only unary Connect-protocol requests suit idem, and only they are
// translated: the whole response is held until its outcome is recorded, so a
// streaming response would arrive at once, at the end. Connect streams, gRPC
// and gRPC-Web requests pass through Handler untranslated; gRPC and gRPC-Web
// responses carry their status in HTTP trailers, which idem does not record,
// so they are not supported.
//
// A panic in the handler reaches idem, which releases the claim (FAILED: a
// retry runs again) and raises it again; net/http then drops the connection.
// connect.WithRecover on the handler answers it as a Connect error instead
// (internal, 500: FAILED).
package idemconnect

import (
	"bytes"
	"encoding/json"
	"errors"
	"net/http"
	"strconv"
	"strings"
	"time"

	"connectrpc.com/connect"
	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/idemgo/idem"
)

// HeaderProblemType carries the type URI of the idem problem a Connect error
// was translated from (for example
// https://github.com/idemgo/idem/blob/main/docs/problems.md#key-reused).
const HeaderProblemType = "Idem-Problem-Type"

// Handler returns h (a Connect handler, or a mux of them) protected by mw,
// with idem's own answers to unary Connect-protocol requests written as
// Connect errors (see the package documentation). Other requests get
// mw.Handler(h) unchanged.
func Handler(mw *idem.Middleware, h http.Handler) http.Handler {
	protected := mw.Handler(h)
	ew := connect.NewErrorWriter()
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if !isConnect(ew, r) {
			protected.ServeHTTP(w, r)
			return
		}
		tw := &translator{w: w}
		protected.ServeHTTP(tw, r)
		if tw.problem {
			writeProblem(ew, w, r, tw.status, tw.body.Bytes())
		}
	})
}

// Outcome is idem.DefaultOutcome with the Connect codes that call for a
// retry added as FAILED: 409 (aborted: a concurrency conflict, gRPC's advice
// is to retry the whole operation; already_exists shares the status) and 499
// (canceled). Set it as Config.Outcome for a Connect API.
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
	"request-in-flight":   connect.CodeUnavailable,
	"response-not-stored": connect.CodeAlreadyExists,
	"store-unavailable":   connect.CodeUnavailable,
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
	_ = ew.Write(w, r, cerr) // a write error means the client is gone
}
