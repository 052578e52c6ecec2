// Package idemecho runs echo (v4) handlers under idem's claim protocol:
// exactly one execution per (scope, Idempotency-Key), its response, errors
// included, recorded and replayed byte-exact (CONTRACT sections 3 and 5).
//
// Register the middleware returned by Middleware on the routes (or the group)
// it protects:
//
//	mw, err := idem.NewMiddleware(store, idem.Options{Scope: tenantOf})
//	if err != nil {
//		log.Fatal(err)
//	}
//	e := echo.New()
//	e.Use(middleware.Recover())
//	payments := e.Group("/v1", idemecho.Middleware(mw))
//	payments.POST("/charges", charge)
//
// # Why not echo.WrapMiddleware
//
// echo handlers return their errors; echo turns them into a response with its
// HTTPErrorHandler only after the whole middleware chain has returned. Under
// echo.WrapMiddleware(mw.Handler), idem records what the handler wrote before
// that, so `return echo.NewHTTPError(402, ...)` is recorded as an empty 200,
// which every retry then replays. Middleware instead runs the rest
// of the chain inside idem's handler, once per claim, with c.Response()
// writing through the writer idem gives, and an error the chain returns is
// answered there, by the Echo instance's HTTPErrorHandler (as echo would
// answer it), so idem records it with its real status and body. When idem
// answers by itself (replay, 409, 422, 400, 503, ...) the chain does not run.
//
// # Unrouted requests
//
// echo's Group.Use registers catch-all not-found routes for the group's
// prefix, so the group's middleware also runs for a mistyped path under it
// (POST /v1/chargee) and for a method no route of the path takes. Middleware
// passes such a request through unprotected, for echo to answer 404 (or 405):
// it has no side effect, and recording its 404 would burn the key, the
// corrected request getting 422. A request is routed when a route is
// registered for its method at the path echo matched (c.Path()); a route
// registered with RouteNotFound is not.
//
// # What the chain sees
//
// c.Request() is idem's request for the execution: its context carries the
// claim (idem.ExecutionFromContext, the business transaction of the drivers'
// Tx functions, idem.RelayKey), is detached from the client's, and is
// cancelled when the lease is lost or Options.Engine.Lease.MaxExecution passes (CONTRACT
// section 4). Its body was read by idem (at most Options.Request.MaxBytes) and
// is given again in full. c.Response() is a fresh *echo.Response over idem's
// writer, which holds the response until the outcome is recorded: Flush is
// deferred and Hijack refused. Both are put back when the chain returns, so
// middleware registered before this one sees the answer idem sent (status,
// Committed) on the first execution and on a replay alike.
//
// # Errors and panics
//
// The returned error's response is the outcome, recorded by Options.Engine.Response.Outcome: a
// 402 *echo.HTTPError is recorded and replayed, a 503 is recorded FAILED and
// runs again on retry. Middleware itself returns nil once the error is
// answered: the error has its response, recorded, and must not be answered
// again.
//
// A panic in the chain of a protected execution reaches idem, which records
// the claim FAILED (a retry runs again, CONTRACT section 5) and raises it
// again; Middleware recovers it there, as middleware.Recover would: its stack
// logged with c.Logger(), a 500 *echo.HTTPError answered by the
// HTTPErrorHandler. middleware.Recover registered before this middleware does
// not see it. Left to net/http, the panic would drop the connection, and Go's
// http.Transport resends by itself a POST that carries an Idempotency-Key
// when its reused connection breaks before any response byte: one client
// call would run the handler twice. Recover registered after this middleware
// answers the panic inside idem's writer instead: a 500, recorded FAILED,
// with the same effect. A panic of a request idem passes through (another
// method, no key with Options.KeyOptional, an unrouted request) is left to
// echo.
package idemecho

import (
	"fmt"
	"net/http"
	"runtime/debug"
	"sync"

	"github.com/labstack/echo/v4"

	"github.com/idemgo/idem"
	"github.com/idemgo/idem/internal/httpwrite"
)

// Middleware returns echo middleware that runs the rest of the chain under
// mw: once per claim, inside mw's handler, writing through mw's writer, with
// a returned error answered there by the Echo instance's HTTPErrorHandler,
// and a panic answered 500 (see the package documentation). Requests that mw
// does not protect (other methods, Options.KeyOptional without a key) run the
// chain as usual, still inside mw's handler, their errors answered the same
// way. Requests echo does not route run the chain outside mw's handler.
func Middleware(mw *idem.Middleware) echo.MiddlewareFunc {
	var routes routeSet
	return func(next echo.HandlerFunc) echo.HandlerFunc {
		return func(c echo.Context) error {
			if !routes.routed(c) {
				// echo answers it (404, 405): a request no route takes
				// has no side effect to protect, and recording its 404
				// would burn the key for the corrected request.
				return next(c)
			}
			outerResp, outerReq := c.Response(), c.Request()
			ctx, raised := httpwrite.RaisePanics(outerReq.Context()) // answered below, echo's way
			protected := false
			defer func() {
				if !protected {
					return // a panic of a request idem passed through: echo's, as usual
				}
				if rec := recover(); rec != nil {
					answerPanic(c, rec, raised.StackOr(debug.Stack))
				}
			}()
			mw.Handler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				_, protected = idem.ExecutionFromContext(r.Context())
				c.SetResponse(echo.NewResponse(w, c.Echo()))
				c.SetRequest(r)
				// Put back on a panic too: it is answered on the client's
				// writer, after idem recorded the claim FAILED.
				defer func() { c.SetResponse(outerResp); c.SetRequest(outerReq) }()
				if err := next(c); err != nil {
					// What echo's ServeHTTP does with the chain's error,
					// done here so the answer goes through idem's writer.
					c.Error(err)
				}
			})).ServeHTTP(outerResp, outerReq.WithContext(ctx))
			return nil
		}
	}
}

// answerPanic answers a protected execution's panic, which idem recorded
// FAILED and raised again, as middleware.Recover does: the stack logged with
// c.Logger(), and a 500 *echo.HTTPError (its Internal error naming the panic)
// answered by the HTTPErrorHandler on the client's writer, not recorded.
// Left to net/http, the panic would drop the connection, and Go's
// http.Transport resends a keyed POST whose reused connection broke before
// any response byte: one client call would run the handler twice.
func answerPanic(c echo.Context, rec any, stack []byte) {
	if rec != http.ErrAbortHandler { //nolint:errorlint // the sentinel itself, as net/http compares it
		c.Logger().Errorf("[PANIC RECOVER] idemecho (the claim is recorded FAILED; a retry runs again): %v %s", rec, stack)
	}
	if c.Response().Committed {
		return // idem holds a protected answer until it is recorded: not reached
	}
	c.Error(echo.NewHTTPError(http.StatusInternalServerError).WithInternal(fmt.Errorf("idemecho: handler panic: %v", rec)))
}

// routeSet answers whether echo routed a request to a route registered for
// its method, rather than to a not-found handler: the catch-all routes
// Group.Use registers (RouteNotFound "/prefix" and "/prefix/*", whose handler
// is echo.NotFoundHandler), one registered with RouteNotFound, or echo's own
// NotFoundHandler and MethodNotAllowedHandler for a path or method no route
// takes (under e.Use).
type routeSet struct {
	known sync.Map // routeKey -> struct{}: routed, for good (echo removes no route)
}

type routeKey struct {
	router       *echo.Router
	method, path string
}

// routed reports whether c's route (c.Path(), the path of the route the
// router matched) is registered for the request's method on the router
// that matched it (the host's, else the default one). A route added later
// is found then; only the routes found are remembered.
func (s *routeSet) routed(c echo.Context) bool {
	e, r := c.Echo(), c.Request()
	router := e.Router()
	if hosts := e.Routers(); len(hosts) > 0 {
		if hr, ok := hosts[r.Host]; ok {
			router = hr
		}
	}
	k := routeKey{router, r.Method, c.Path()}
	if _, ok := s.known.Load(k); ok {
		return true
	}
	for _, route := range router.Routes() {
		if route.Method == k.method && route.Path == k.path {
			s.known.Store(k, struct{}{})
			return true
		}
	}
	return false
}
