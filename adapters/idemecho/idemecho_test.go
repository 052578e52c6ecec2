package idemecho_test

import (
	"bytes"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/labstack/echo/v4"
	"github.com/labstack/echo/v4/middleware"
	"github.com/stretchr/testify/require"

	"github.com/idemgo/idem"
	"github.com/idemgo/idem/adapters/idemecho"
	"github.com/idemgo/idem/internal/adaptertest"
)

// build serves adaptertest's routes with echo, the way an echo user writes
// them: middleware.Recover outside the adapter, errors returned as
// *echo.HTTPError for echo's HTTPErrorHandler.
func build(_ *testing.T, mw *idem.Middleware, app *adaptertest.App) http.Handler {
	e := newEcho()
	e.Use(middleware.Recover())
	g := e.Group("", idemecho.Middleware(mw))
	g.POST("/charges", func(c echo.Context) error {
		var req adaptertest.ChargeRequest
		if err := c.Bind(&req); err != nil {
			return err
		}
		n, err := app.Charge(c.Request().Context())
		if err != nil {
			return err
		}
		for k, v := range adaptertest.ChargeHeaders(n) {
			c.Response().Header().Set(k, v[0])
		}
		return c.JSON(http.StatusCreated, map[string]int64{"charge": n, "amount": req.Amount})
	})
	g.POST("/declined", func(c echo.Context) error {
		if err := app.Decline(c.Request().Context()); err != nil {
			return err
		}
		return echo.NewHTTPError(http.StatusPaymentRequired, adaptertest.DeclinedMessage)
	})
	g.POST("/unavailable", func(c echo.Context) error {
		if err := app.Unavailable(c.Request().Context()); err != nil {
			return err
		}
		return echo.NewHTTPError(http.StatusServiceUnavailable, adaptertest.UnavailableMessage)
	})
	g.POST("/panic", func(c echo.Context) error { app.Panic(c.Request().Context()); return nil })
	return e
}

func TestAdapter(t *testing.T) { adaptertest.Run(t, build) }

// newEcho returns an Echo that does not print the panics the tests raise.
func newEcho() *echo.Echo {
	e := echo.New()
	e.HideBanner, e.HidePort = true, true
	e.Logger.SetOutput(io.Discard)
	return e
}

// serve starts e, with POST /op (protected) and GET /op (passed through)
// behind the adapter on a fresh SQLite store: the inner middleware, then a
// handler that counts its runs and calls h.
func serve(t *testing.T, e *echo.Echo, h echo.HandlerFunc, inner ...echo.MiddlewareFunc) (url string, runs *atomic.Int64) {
	t.Helper()
	runs = &atomic.Int64{}
	counted := func(c echo.Context) error { runs.Add(1); return h(c) }
	g := e.Group("", append([]echo.MiddlewareFunc{idemecho.Middleware(adaptertest.NewMiddleware(t, adaptertest.SQLite(t)))}, inner...)...)
	g.POST("/op", counted)
	g.GET("/op", counted)
	srv := httptest.NewServer(e)
	t.Cleanup(srv.Close)
	return srv.URL + "/op", runs
}

func TestCustomHTTPErrorHandler(t *testing.T) {
	// The API's own error format, set on the Echo instance, answers the
	// returned error inside idem's writer: recorded and replayed.
	e := newEcho()
	e.HTTPErrorHandler = func(err error, c echo.Context) {
		var he *echo.HTTPError
		if !errors.As(err, &he) {
			he = echo.NewHTTPError(http.StatusInternalServerError, "internal")
		}
		_ = c.JSON(he.Code, map[string]any{"error": map[string]any{"code": he.Code, "message": he.Message}})
	}
	url, runs := serve(t, e, func(c echo.Context) error {
		return echo.NewHTTPError(http.StatusPaymentRequired, "card declined")
	})
	first, second := adaptertest.Twice(t, url, "k")
	require.Equal(t, http.StatusPaymentRequired, first.Status)
	require.JSONEq(t, `{"error":{"code":402,"message":"card declined"}}`, string(first.Body))
	require.Equal(t, http.StatusPaymentRequired, second.Status)
	require.Equal(t, first.Body, second.Body)
	require.Equal(t, "true", second.Header.Get(idem.HeaderReplayed))
	require.EqualValues(t, 1, runs.Load())
}

// A panic's log shows the handler's stack, not the adapter's recover of
// idem's raise (a fresh user found only idem's frames in it).
func TestPanicLogsTheHandlersStack(t *testing.T) {
	e := newEcho()
	log := &syncBuffer{}
	e.Logger.SetOutput(log)
	url, _ := serve(t, e, func(c echo.Context) error { panicInTheHandler(); return nil })
	first := adaptertest.Post(t, url, "k", `{"amount":1}`)
	require.Equal(t, http.StatusInternalServerError, first.Status)
	require.Contains(t, log.String(), "panicInTheHandler", "the handler's frame")
}

func panicInTheHandler() { panic("boom") }

// syncBuffer is a bytes.Buffer the server's goroutines write and the test
// reads.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string { s.mu.Lock(); defer s.mu.Unlock(); return s.b.String() }

func TestPlainErrorIsRetryable(t *testing.T) {
	// A plain error is echo's 500: FAILED, the retry runs again.
	url, runs := serve(t, newEcho(), func(c echo.Context) error { return errors.New("ledger unreachable") })
	first, second := adaptertest.Twice(t, url, "k")
	require.Equal(t, http.StatusInternalServerError, first.Status)
	require.JSONEq(t, `{"message":"Internal Server Error"}`, string(first.Body))
	require.Equal(t, http.StatusInternalServerError, second.Status)
	require.Empty(t, second.Header.Get(idem.HeaderReplayed))
	require.EqualValues(t, 2, runs.Load())
}

func TestErrorAfterResponseKeepsTheResponse(t *testing.T) {
	// An error returned after the handler answered: echo keeps the answer
	// (its error handler skips a committed response); so does the record.
	url, runs := serve(t, newEcho(), func(c echo.Context) error {
		if err := c.String(http.StatusCreated, "made"); err != nil {
			return err
		}
		return errors.New("audit log failed")
	})
	first, second := adaptertest.Twice(t, url, "k")
	require.Equal(t, http.StatusCreated, first.Status)
	require.Equal(t, "made", string(first.Body))
	require.Equal(t, first.Body, second.Body)
	require.Equal(t, "true", second.Header.Get(idem.HeaderReplayed))
	require.EqualValues(t, 1, runs.Load())
}

func TestRecoverInsideTheAdapter(t *testing.T) {
	// middleware.Recover registered after the adapter answers the panic
	// with a 500 inside idem's writer: recorded FAILED, the retry runs again.
	url, runs := serve(t, newEcho(), func(c echo.Context) error { panic("boom") }, middleware.Recover())
	first, second := adaptertest.Twice(t, url, "k")
	require.Equal(t, http.StatusInternalServerError, first.Status)
	require.Equal(t, http.StatusInternalServerError, second.Status)
	require.EqualValues(t, 2, runs.Load())
}

func TestOuterMiddlewareSeesTheAnswer(t *testing.T) {
	// Middleware registered before the adapter sees the status idem sent
	// and no error (it is answered already), first time and on replay.
	e := newEcho()
	type seen struct {
		status int
		err    error
	}
	seenc := make(chan seen, 2)
	e.Use(func(next echo.HandlerFunc) echo.HandlerFunc {
		return func(c echo.Context) error {
			err := next(c)
			seenc <- seen{c.Response().Status, err}
			return err
		}
	})
	url, _ := serve(t, e, func(c echo.Context) error { return echo.NewHTTPError(http.StatusConflict, "order shipped") })
	adaptertest.Twice(t, url, "k")
	require.Equal(t, seen{http.StatusConflict, nil}, <-seenc)
	require.Equal(t, seen{http.StatusConflict, nil}, <-seenc)
}

func TestUnprotectedMethodPassesThrough(t *testing.T) {
	url, runs := serve(t, newEcho(), func(c echo.Context) error { return echo.NewHTTPError(http.StatusNotFound, "no such order") })
	for range 2 {
		resp, err := http.Get(url)
		require.NoError(t, err)
		b, err := io.ReadAll(resp.Body)
		resp.Body.Close()
		require.NoError(t, err)
		require.Equal(t, http.StatusNotFound, resp.StatusCode)
		require.JSONEq(t, `{"message":"no such order"}`, string(b), "answered once, by echo's error handler")
	}
	require.EqualValues(t, 2, runs.Load())
}
