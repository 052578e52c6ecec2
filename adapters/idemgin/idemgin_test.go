package idemgin_test

import (
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"sync/atomic"
	"testing"

	"github.com/gin-gonic/gin"
	"github.com/stretchr/testify/require"

	"github.com/idemgo/idem"
	"github.com/idemgo/idem/adapters/idemgin"
	"github.com/idemgo/idem/internal/adaptertest"
)

func init() {
	gin.SetMode(gin.TestMode)
	gin.DefaultErrorWriter = io.Discard // gin.Recovery prints every panic the tests raise
}

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

// serve starts a gin engine on a fresh SQLite store serving /op (POST,
// protected; GET, passed through): the before middleware, then the adapter
// with opts, then a handler counting runs, then handlers.
func serve(t *testing.T, before []gin.HandlerFunc, opts []idemgin.Option, handlers ...gin.HandlerFunc) (url string, runs *atomic.Int64) {
	t.Helper()
	runs = &atomic.Int64{}
	r := gin.New()
	r.Use(before...)
	count := func(c *gin.Context) { runs.Add(1) }
	chain := append([]gin.HandlerFunc{idemgin.Middleware(adaptertest.NewMiddleware(t, adaptertest.SQLite(t)), opts...), count}, handlers...)
	r.POST("/op", chain...)
	r.GET("/op", chain...)
	srv := httptest.NewServer(r)
	t.Cleanup(srv.Close)
	return srv.URL + "/op", runs
}

func TestAbortWithErrorRecordsItsStatus(t *testing.T) {
	// gin answers c.AbortWithError(402, err) with a 402 and no body: recorded
	// and replayed as that, never as the empty 200 of naive glue.
	url, runs := serve(t, nil, nil, func(c *gin.Context) {
		_ = c.AbortWithError(http.StatusPaymentRequired, errors.New("card declined"))
	})
	first, second := adaptertest.Twice(t, url, "k")
	require.Equal(t, http.StatusPaymentRequired, first.Status)
	require.Empty(t, first.Body)
	require.Equal(t, http.StatusPaymentRequired, second.Status)
	require.Equal(t, "true", second.Header.Get(idem.HeaderReplayed))
	require.EqualValues(t, 1, runs.Load())
}

func TestErrorWithoutResponseIsNotASuccess(t *testing.T) {
	// c.Error alone: gin would answer an empty 200, which idem would record
	// and replay as a success. The default error handler answers 500
	// problem details instead: FAILED, the retry runs again.
	url, runs := serve(t, nil, nil, func(c *gin.Context) {
		_ = c.Error(errors.New("ledger write failed: secret detail"))
	})
	first, second := adaptertest.Twice(t, url, "k")
	for _, r := range []adaptertest.Response{first, second} {
		require.Equal(t, http.StatusInternalServerError, r.Status)
		require.Equal(t, "about:blank", adaptertest.ProblemType(t, r))
		require.NotContains(t, string(r.Body), "secret detail", "a private error's message is not sent")
		require.Empty(t, r.Header.Get(idem.HeaderReplayed))
	}
	require.EqualValues(t, 2, runs.Load())
}

func TestErrorWithStatusIsRecorded(t *testing.T) {
	// c.Status(409) with a public error and no body: a 409 problem with the
	// public message, recorded and replayed.
	url, runs := serve(t, nil, nil, func(c *gin.Context) {
		c.Status(http.StatusConflict)
		_ = c.Error(errors.New("order already shipped")).SetType(gin.ErrorTypePublic)
	})
	first, second := adaptertest.Twice(t, url, "k")
	require.Equal(t, http.StatusConflict, first.Status)
	require.Contains(t, string(first.Body), "order already shipped")
	require.Equal(t, first.Body, second.Body)
	require.Equal(t, "true", second.Header.Get(idem.HeaderReplayed))
	require.EqualValues(t, 1, runs.Load())
}

func TestCustomErrorHandler(t *testing.T) {
	// An API's own error format, written inside idem's writer: recorded.
	handler := idemgin.WithErrorHandler(func(c *gin.Context) {
		c.JSON(http.StatusUnprocessableEntity, gin.H{"errors": c.Errors.Errors()})
	})
	url, runs := serve(t, nil, []idemgin.Option{handler}, func(c *gin.Context) {
		_ = c.Error(errors.New("amount must be positive"))
	})
	first, second := adaptertest.Twice(t, url, "k")
	require.Equal(t, http.StatusUnprocessableEntity, first.Status)
	require.JSONEq(t, `{"errors":["amount must be positive"]}`, string(first.Body))
	require.Equal(t, first.Body, second.Body)
	require.Equal(t, "true", second.Header.Get(idem.HeaderReplayed))
	require.EqualValues(t, 1, runs.Load())
}

func TestRecoveryInsideTheAdapter(t *testing.T) {
	// gin.Recovery registered after the adapter answers the panic with a 500
	// inside idem's writer: recorded FAILED, the retry runs again.
	url, runs := serve(t, nil, nil, gin.Recovery(), func(c *gin.Context) { panic("boom") })
	first, second := adaptertest.Twice(t, url, "k")
	require.Equal(t, http.StatusInternalServerError, first.Status)
	require.Equal(t, http.StatusInternalServerError, second.Status)
	require.EqualValues(t, 2, runs.Load())
}

func TestStatusWithoutBody(t *testing.T) {
	// c.Status(204) writes nothing: gin sends it when the chain ends; the
	// adapter does so inside idem's writer, so 204 is what is recorded.
	url, runs := serve(t, nil, nil, func(c *gin.Context) { c.Status(http.StatusNoContent) })
	first, second := adaptertest.Twice(t, url, "k")
	require.Equal(t, http.StatusNoContent, first.Status)
	require.Equal(t, http.StatusNoContent, second.Status)
	require.Equal(t, "true", second.Header.Get(idem.HeaderReplayed))
	require.EqualValues(t, 1, runs.Load())
}

func TestUnprotectedMethodPassesThrough(t *testing.T) {
	url, runs := serve(t, nil, nil, func(c *gin.Context) { c.String(http.StatusOK, "read") })
	for range 2 {
		resp, err := http.Get(url)
		require.NoError(t, err)
		resp.Body.Close()
		require.Equal(t, http.StatusOK, resp.StatusCode)
		require.Empty(t, resp.Header.Get(idem.HeaderReplayed))
	}
	require.EqualValues(t, 2, runs.Load())
}

func TestOuterMiddlewareSeesTheAnswer(t *testing.T) {
	// A logger registered before the adapter sees the status idem sent,
	// on the first execution and on the replay.
	statuses := make(chan int, 2)
	logger := func(c *gin.Context) { c.Next(); statuses <- c.Writer.Status() }
	url, _ := serve(t, []gin.HandlerFunc{logger}, nil, func(c *gin.Context) { c.String(http.StatusCreated, "made") })
	adaptertest.Twice(t, url, "k")
	require.Equal(t, []int{http.StatusCreated, http.StatusCreated}, []int{<-statuses, <-statuses})
}

func TestGinContextReachesTheClaim(t *testing.T) {
	// With ContextWithFallback, *gin.Context as a context.Context reaches
	// idem's request context, and so the claim.
	r := gin.New()
	r.ContextWithFallback = true
	r.POST("/op", idemgin.Middleware(adaptertest.NewMiddleware(t, adaptertest.SQLite(t))), func(c *gin.Context) {
		e, ok := idem.ExecutionFromContext(c)
		if !ok {
			c.String(http.StatusInternalServerError, "no execution")
			return
		}
		c.String(http.StatusCreated, "%s %s", e.Scope, e.Key)
	})
	srv := httptest.NewServer(r)
	t.Cleanup(srv.Close)
	first := adaptertest.Post(t, srv.URL+"/op", "k-1", `{}`)
	require.Equal(t, http.StatusCreated, first.Status)
	require.Equal(t, adaptertest.Scope+" k-1", string(first.Body))
}
