package idemgin

import (
	"context"

	"github.com/gin-gonic/gin"

	"github.com/idemgo/idem"
)

// Context returns the context of the execution c's handler runs under:
// c.Request.Context(), which the middleware set to idem's. Pass it to every
// context-taking idem function (idem.ReleaseKey, idem.RelayTransport's
// requests, a driver's Tx: idem.Tx[*sql.Tx](idemgin.Context(c)), ...). c itself,
// as a context.Context, does not reach it: gin's Context.Value falls back to
// the request's context only with Engine.ContextWithFallback, so
// idem.RelayKey(c, ...) answers idem.ErrNoExecution. Outside a protected
// execution (another method, no key with Options.KeyOptional) it is the
// request's own context, and idem's functions answer as outside one.
func Context(c *gin.Context) context.Context { return c.Request.Context() }

// Execution returns the claim c's handler runs under, and false outside a
// protected execution: idem.ExecutionFromContext(Context(c)).
func Execution(c *gin.Context) (idem.Execution, bool) {
	return idem.ExecutionFromContext(Context(c))
}

// RelayKey returns the key to send to a downstream provider for step:
// idem.RelayKey(Context(c), step). It returns idem.ErrNoExecution outside a
// protected execution.
func RelayKey(c *gin.Context, step string) (string, error) {
	return idem.RelayKey(Context(c), step)
}
