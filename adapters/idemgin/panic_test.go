package idemgin_test

import (
	"net/http"
	"net/http/httptest"
	"sync/atomic"
	"testing"

	"github.com/gin-gonic/gin"
	"github.com/stretchr/testify/require"

	"github.com/idemgo/idem/adapters/idemgin"
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
	// No gin.Recovery: the adapter answers the panic 500 itself, after idem
	// recorded it FAILED. Were the connection dropped, Go's http.Transport
	// would resend the keyed POST and the handler would run twice for one
	// call. The retry with the same key runs again, as FAILED allows.
	r := gin.New()
	var runs atomic.Int64
	r.GET("/health", func(c *gin.Context) { c.Status(http.StatusNoContent) })
	r.POST("/op", idemgin.Middleware(adaptertest.NewMiddleware(t, adaptertest.SQLite(t))), func(c *gin.Context) {
		runs.Add(1)
		panic(value)
	})
	srv := httptest.NewServer(r)
	t.Cleanup(srv.Close)

	first, err := adaptertest.PostOnReusedConn(t, srv.URL+"/health", srv.URL+"/op", "k")
	require.EqualValues(t, 1, runs.Load(), "one call, one execution")
	require.NoError(t, err)
	require.Equal(t, http.StatusInternalServerError, first.Status)
	require.Equal(t, "about:blank", adaptertest.ProblemType(t, first))

	retry := adaptertest.Post(t, srv.URL+"/op", "k", `{}`)
	require.Equal(t, http.StatusInternalServerError, retry.Status)
	require.EqualValues(t, 2, runs.Load(), "FAILED: the retry runs again")
}
