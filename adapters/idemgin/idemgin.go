// Package idemgin runs gin handlers under idem's claim protocol: exactly one
// execution per (scope, Idempotency-Key), its response recorded and replayed
// byte-exact (CONTRACT sections 3 and 5).
//
// Register the middleware returned by Middleware on the routes (or the group)
// it protects:
//
//	mw, err := idem.NewMiddleware(store, idem.Options{Scope: tenantOf})
//	if err != nil {
//		log.Fatal(err)
//	}
//	r := gin.New()
//	r.Use(gin.Recovery())
//	payments := r.Group("/v1", idemgin.Middleware(mw))
//	payments.POST("/charges", charge)
//
// # Why not three lines of glue
//
// idem decides before the handler runs and records what it wrote. Glue that
// calls idem's Handler around a no-op and then c.Next() runs the handler for
// every request, including those idem answered with a replay or a 409, and
// records the no-op's empty 200, which every retry then replays.
// Middleware instead runs the rest of gin's handler chain (c.Next) inside
// idem's handler, once per claim, with c.Writer writing through the writer
// idem gives, so what the chain writes is what idem records; when idem answers
// by itself (replay, 409, 422, 400, 503, ...) the chain is aborted and does not
// run.
//
// # What the chain sees
//
// c.Request is idem's request for the execution: its context carries the
// claim (idem.ExecutionFromContext, the business transaction of the drivers'
// Tx functions, idem.RelayKey), is detached from the client's, and is
// cancelled when the lease is lost or Options.Engine.Lease.MaxExecution passes (CONTRACT
// section 4). Pass Context(c) (that is, c.Request.Context()) to idem's
// context-taking functions, or use Execution(c) and RelayKey(c, step): c
// itself, as a context.Context, reaches idem's context only with gin's
// Engine.ContextWithFallback, and idem.RelayKey(c, ...) or idem.Tx[*sql.Tx](c)
// otherwise answer idem.ErrNoExecution. The body was read by idem (at most
// Options.Request.MaxBytes) and is given again in full.
//
// c.Writer keeps gin's semantics (a status set with c.Status is written with
// the first body byte or when the chain ends) over idem's writer, which holds
// the response until the outcome is recorded: Flush is deferred, Hijack
// refused, Pusher nil, and CloseNotify reports the end of the execution's
// context, not the client hanging up (which does not stop the work).
//
// # Errors and panics
//
// Whatever the chain wrote is the outcome, recorded with its real status by
// Options.Engine.Response.Outcome: c.AbortWithStatusJSON(402, ...) is recorded and replayed as
// that 402 and body, c.AbortWithError(402, err) as a 402 with an empty body
// (what gin answers), a 5xx is recorded FAILED and runs again on retry. Errors
// added with c.Error by a chain that wrote nothing are answered by the
// ErrorHandler (default DefaultErrorHandler: a problem details 500, or the
// status the chain set when it is 4xx or 5xx) inside idem's writer, so they are
// recorded like any answer rather than as an empty 200.
//
// A panic in the chain of a protected execution reaches idem, which records
// the claim FAILED (a retry runs again, CONTRACT section 5) and raises it
// again; Middleware recovers it there and answers 500 by the ErrorHandler
// (the panic added to c.Errors, its stack printed to gin.DefaultErrorWriter
// as gin.Recovery does), so gin.Recovery registered before it does not see
// it. Left to net/http, the panic would drop the connection, and Go's
// http.Transport resends by itself a POST that carries an Idempotency-Key
// when its reused connection breaks before any response byte: one client
// call would run the handler twice. gin.Recovery registered after this
// middleware answers the panic inside idem's writer instead: a 500, recorded
// FAILED, with the same effect. A panic of a request idem passes through
// (another method, no key with Options.KeyOptional) is left to gin.
package idemgin

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"runtime/debug"
	"strings"

	"github.com/gin-gonic/gin"

	"github.com/idemgo/idem"
	"github.com/idemgo/idem/internal/httpwrite"
)

// Option configures Middleware.
type Option func(*options)

type options struct {
	errorHandler gin.HandlerFunc
}

// WithErrorHandler sets the handler that answers a chain that added errors
// with c.Error (c.Errors is not empty) and wrote nothing. It runs inside
// idem's handler and must write the response through c.Writer, which idem
// records. Default: DefaultErrorHandler.
func WithErrorHandler(h gin.HandlerFunc) Option {
	return func(o *options) { o.errorHandler = h }
}

// DefaultErrorHandler answers a chain that added errors and wrote nothing
// with RFC 9457 problem details (type about:blank): the status the chain set
// (c.Status) when it is 4xx or 5xx, else 500, so an error is never recorded
// as a 200 success. The detail joins the messages of the errors of type
// gin.ErrorTypePublic; other errors' messages are not sent.
func DefaultErrorHandler(c *gin.Context) {
	status := c.Writer.Status()
	if status < 400 {
		status = http.StatusInternalServerError
	}
	idem.Problem{
		Type: "about:blank", Title: http.StatusText(status), Status: status,
		Detail: strings.Join(c.Errors.ByType(gin.ErrorTypePublic).Errors(), "; "),
	}.Write(c.Writer)
}

// Middleware returns gin middleware that runs the rest of the handler chain
// under mw: once per claim, inside mw's handler, writing through mw's writer
// (see the package documentation). Requests that mw does not protect (other
// methods, Options.KeyOptional without a key) run the chain as usual, still
// inside mw's handler.
func Middleware(mw *idem.Middleware, opts ...Option) gin.HandlerFunc {
	o := options{errorHandler: DefaultErrorHandler}
	for _, opt := range opts {
		opt(&o)
	}
	return func(c *gin.Context) {
		outerW, outerR := c.Writer, c.Request
		ctx, raised := httpwrite.RaisePanics(outerR.Context()) // answered below, gin's way
		ran, protected := false, false
		defer func() {
			if !protected {
				return // a panic of a request idem passed through: gin's, as usual
			}
			if rec := recover(); rec != nil {
				answerPanic(c, o.errorHandler, rec, raised.StackOr(debug.Stack))
			}
		}()
		mw.Handler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			ran = true
			_, protected = idem.ExecutionFromContext(r.Context())
			iw := &responseWriter{ResponseWriter: w, ctx: r.Context(), size: noWritten, status: http.StatusOK}
			c.Writer, c.Request = iw, r
			// Restored on a panic too: gin.Recovery then answers on the
			// client's writer, after idem released the claim.
			defer func() { c.Writer, c.Request = outerW, outerR }()
			c.Next()
			if len(c.Errors) > 0 && !iw.Written() {
				o.errorHandler(c)
			}
			iw.WriteHeaderNow()
		})).ServeHTTP(outerW, outerR.WithContext(ctx))
		if !ran {
			c.Abort() // idem answered by itself: the handler must not run
		}
	}
}

// answerPanic answers a protected execution's panic, which idem recorded
// FAILED and raised again: a 500 by the error handler (the panic added to
// c.Errors as a private error), on the client's writer, not recorded. Left to
// net/http, the panic would drop the connection, and Go's http.Transport
// resends a keyed POST whose reused connection broke before any response
// byte: one client call would run the handler twice.
func answerPanic(c *gin.Context, errorHandler gin.HandlerFunc, rec any, stack []byte) {
	if rec != http.ErrAbortHandler { //nolint:errorlint // the sentinel itself, as net/http compares it
		_, _ = fmt.Fprintf(gin.DefaultErrorWriter, "[idemgin] panic recovered (the claim is recorded FAILED; a retry runs again): %v\n%s\n", rec, stack)
	}
	_ = c.Error(fmt.Errorf("idemgin: handler panic: %v", rec))
	c.Abort()
	if c.Writer.Written() {
		return // idem holds a protected answer until it is recorded: not reached
	}
	c.Status(http.StatusInternalServerError)
	errorHandler(c)
	c.Writer.WriteHeaderNow()
}

const noWritten = -1

// responseWriter is gin.ResponseWriter over idem's writer, with gin's own
// semantics: WriteHeader only records the status, which is sent with the
// first body byte or by WriteHeaderNow.
type responseWriter struct {
	http.ResponseWriter // idem's writer
	ctx                 context.Context
	size                int
	status              int
	closed              chan bool
}

var _ gin.ResponseWriter = (*responseWriter)(nil)

func (w *responseWriter) Unwrap() http.ResponseWriter { return w.ResponseWriter }

// WriteHeader records code, until the header is written (as gin does).
func (w *responseWriter) WriteHeader(code int) {
	if code > 0 && !w.Written() {
		w.status = code
	}
}

// WriteHeaderNow writes the recorded status, once.
func (w *responseWriter) WriteHeaderNow() {
	if !w.Written() {
		w.size = 0
		w.ResponseWriter.WriteHeader(w.status)
	}
}

func (w *responseWriter) Write(b []byte) (int, error) {
	w.WriteHeaderNow()
	n, err := w.ResponseWriter.Write(b)
	w.size += n
	return n, err
}

func (w *responseWriter) WriteString(s string) (int, error) {
	w.WriteHeaderNow()
	n, err := io.WriteString(w.ResponseWriter, s)
	w.size += n
	return n, err
}

// Status returns the status set so far (default 200).
func (w *responseWriter) Status() int { return w.status }

// Size returns the body bytes written, -1 before the header is written.
func (w *responseWriter) Size() int { return w.size }

// Written reports whether the header has been written.
func (w *responseWriter) Written() bool { return w.size != noWritten }

// Hijack is refused by idem (its response is recorded and replayed).
func (w *responseWriter) Hijack() (net.Conn, *bufio.ReadWriter, error) {
	conn, rw, err := http.NewResponseController(w.ResponseWriter).Hijack()
	if err != nil {
		return nil, nil, fmt.Errorf("idemgin: %w", err)
	}
	return conn, rw, nil
}

// Flush writes the header; idem defers the flush itself until the outcome is
// recorded.
func (w *responseWriter) Flush() {
	w.WriteHeaderNow()
	_ = http.NewResponseController(w.ResponseWriter).Flush()
}

// CloseNotify returns a channel that receives true when the execution's
// context ends (lease lost, Options.Engine.Lease.MaxExecution passed, or the execution
// finished). A client hanging up does not end it (CONTRACT section 4).
func (w *responseWriter) CloseNotify() <-chan bool {
	if w.closed == nil {
		ch := make(chan bool, 1)
		context.AfterFunc(w.ctx, func() { ch <- true })
		w.closed = ch
	}
	return w.closed
}

// Pusher returns nil: a pushed response would bypass idem's record.
func (w *responseWriter) Pusher() http.Pusher { return nil }
