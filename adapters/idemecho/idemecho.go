// Package idemecho runs echo (v4) handlers under idem's claim protocol:
// exactly one execution per (scope, Idempotency-Key), its response, errors
// included, recorded and replayed byte-exact (CONTRACT sections 3 and 5).
//
// Register the middleware returned by Middleware on the routes (or the group)
// it protects:
//
//	mw, err := idem.New(idem.Config{Store: store, Scope: tenantOf})
//	...
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
// # What the chain sees
//
// c.Request() is idem's request for the execution: its context carries the
// claim (idem.ExecutionFromContext, the business transaction of the drivers'
// Tx functions, idem.RelayKey), is detached from the client's, and is
// cancelled when the lease is lost or Config.MaxExecution passes (CONTRACT
// section 4). Its body was read by idem (at most Config.MaxRequestBytes) and
// is given again in full. c.Response() is a fresh *echo.Response over idem's
// writer, which holds the response until the outcome is recorded: Flush is
// deferred and Hijack refused. Both are put back when the chain returns, so
// middleware registered before this one sees the answer idem sent (status,
// Committed) on the first execution and on a replay alike.
//
// # Errors and panics
//
// The returned error's response is the outcome, recorded by Config.Outcome: a
// 402 *echo.HTTPError is recorded and replayed, a 503 is recorded FAILED and
// runs again on retry. Middleware itself returns nil once the error is
// answered: the error has its response, recorded, and must not be answered
// again. A panic in the chain reaches idem, which releases the claim (FAILED:
// a retry runs again) and raises it again for middleware.Recover, registered
// before this middleware, to answer 500 (CONTRACT section 5). Recover
// registered after this middleware answers the panic inside idem's writer
// instead: a 500, recorded FAILED, with the same effect.
package idemecho

import (
	"net/http"

	"github.com/labstack/echo/v4"

	"github.com/idemgo/idem"
)

// Middleware returns echo middleware that runs the rest of the chain under
// mw: once per claim, inside mw's handler, writing through mw's writer, with
// a returned error answered there by the Echo instance's HTTPErrorHandler
// (see the package documentation). Requests that mw does not protect (other
// methods, Config.KeyOptional without a key) run the chain as usual, still
// inside mw's handler, their errors answered the same way.
func Middleware(mw *idem.Middleware) echo.MiddlewareFunc {
	return func(next echo.HandlerFunc) echo.HandlerFunc {
		return func(c echo.Context) error {
			outerResp, outerReq := c.Response(), c.Request()
			mw.Handler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				c.SetResponse(echo.NewResponse(w, c.Echo()))
				c.SetRequest(r)
				// Put back on a panic too: middleware.Recover then answers
				// on the client's writer, after idem released the claim.
				defer func() { c.SetResponse(outerResp); c.SetRequest(outerReq) }()
				if err := next(c); err != nil {
					// What echo's ServeHTTP does with the chain's error,
					// done here so the answer goes through idem's writer.
					c.Error(err)
				}
			})).ServeHTTP(outerResp, outerReq)
			return nil
		}
	}
}
