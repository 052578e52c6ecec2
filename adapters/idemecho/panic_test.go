package idemecho_test

import (
	"net/http"
	"net/http/httptest"
	"sync/atomic"
	"testing"

	"github.com/labstack/echo/v4"
	"github.com/stretchr/testify/require"

	"github.com/idemgo/idem/adapters/idemecho"
	"github.com/idemgo/idem/internal/adaptertest"
)

func TestPanicWithoutRecoveryRunsOnce(t *testing.T) {
	// http.ErrAbortHandler too: idem holds the answer until it is recorded,
	// so nothing reached the client, and an aborted connection would be
	// resent all the same.
	for name, value := range map[string]any{"Value": adaptertest.PanicValue, "ErrAbortHandler": http.ErrAbortHandler} {
		t.Run(name, func(t *testing.T) { testPanicWithoutRecovery(t, value) })
	}
}

func testPanicWithoutRecovery(t *testing.T, value any) {
	// No middleware.Recover: the adapter answers the panic 500 itself (by
	// echo's HTTPErrorHandler), after idem recorded it FAILED. Were the
	// connection dropped, Go's http.Transport would resend the keyed POST and
	// the handler would run twice for one call. The retry with the same key
	// runs again, as FAILED allows.
	e := newEcho()
	var runs atomic.Int64
	e.GET("/health", func(c echo.Context) error { return c.NoContent(http.StatusNoContent) })
	v1 := e.Group("/v1", idemecho.Middleware(adaptertest.NewMiddleware(t, adaptertest.SQLite(t))))
	v1.POST("/op", func(c echo.Context) error {
		runs.Add(1)
		panic(value)
	})
	srv := httptest.NewServer(e)
	t.Cleanup(srv.Close)

	first, err := adaptertest.PostOnReusedConn(t, srv.URL+"/health", srv.URL+"/v1/op", "k")
	require.EqualValues(t, 1, runs.Load(), "one call, one execution")
	require.NoError(t, err)
	require.Equal(t, http.StatusInternalServerError, first.Status)
	require.JSONEq(t, `{"message":"Internal Server Error"}`, string(first.Body))

	retry := adaptertest.Post(t, srv.URL+"/v1/op", "k", `{}`)
	require.Equal(t, http.StatusInternalServerError, retry.Status)
	require.EqualValues(t, 2, runs.Load(), "FAILED: the retry runs again")
}
