package idemgin_test

import (
	"net/http"
	"testing"

	"github.com/gin-gonic/gin"

	"github.com/idemgo/idem"
	"github.com/idemgo/idem/adapters/idemgin"
	"github.com/idemgo/idem/internal/adaptertest"
)

func init() { gin.SetMode(gin.TestMode) }

// build serves adaptertest's routes with gin, the way a gin user writes
// them: gin.Recovery outside the adapter, errors through gin's own calls.
func build(_ *testing.T, mw *idem.Middleware, app *adaptertest.App) http.Handler {
	r := gin.New()
	r.Use(gin.Recovery())
	g := r.Group("/", idemgin.Middleware(mw))
	g.POST("/charges", func(c *gin.Context) {
		var req adaptertest.ChargeRequest
		if err := c.ShouldBindJSON(&req); err != nil {
			c.AbortWithStatusJSON(http.StatusBadRequest, gin.H{"error": err.Error()})
			return
		}
		n, err := app.Charge(c.Request.Context())
		if err != nil {
			_ = c.AbortWithError(http.StatusInternalServerError, err)
			return
		}
		for k, v := range adaptertest.ChargeHeaders(n) {
			c.Header(k, v[0])
		}
		c.JSON(http.StatusCreated, gin.H{"charge": n, "amount": req.Amount})
	})
	g.POST("/declined", func(c *gin.Context) {
		if err := app.Decline(c.Request.Context()); err != nil {
			_ = c.AbortWithError(http.StatusInternalServerError, err)
			return
		}
		c.AbortWithStatusJSON(http.StatusPaymentRequired, gin.H{"error": adaptertest.DeclinedMessage})
	})
	g.POST("/unavailable", func(c *gin.Context) {
		if err := app.Unavailable(c.Request.Context()); err != nil {
			_ = c.AbortWithError(http.StatusInternalServerError, err)
			return
		}
		c.AbortWithStatusJSON(http.StatusServiceUnavailable, gin.H{"error": adaptertest.UnavailableMessage})
	})
	g.POST("/panic", func(c *gin.Context) { app.Panic(c.Request.Context()) })
	return r
}

func TestAdapter(t *testing.T) { adaptertest.Run(t, build) }
