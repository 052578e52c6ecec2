package idemecho_test

import (
	"net/http"
	"net/http/httptest"
	"sync/atomic"
	"testing"

	"github.com/labstack/echo/v4"
	"github.com/stretchr/testify/require"

	"github.com/idemgo/idem"
	"github.com/idemgo/idem/adapters/idemecho"
	"github.com/idemgo/idem/internal/adaptertest"
)

// serveGroup serves the documented setup: e.Group("/v1", idemecho.Middleware(mw))
// with POST /v1/charge (counted) and GET /v1/orders, on a fresh SQLite store.
func serveGroup(t *testing.T) (base string, charges *atomic.Int64) {
	t.Helper()
	charges = &atomic.Int64{}
	e := newEcho()
	v1 := e.Group("/v1", idemecho.Middleware(adaptertest.NewMiddleware(t, adaptertest.SQLite(t))))
	v1.POST("/charge", func(c echo.Context) error {
		return c.JSON(http.StatusCreated, map[string]int64{"charge": charges.Add(1)})
	})
	v1.GET("/orders", func(c echo.Context) error { return c.JSON(http.StatusOK, []string{}) })
	srv := httptest.NewServer(e)
	t.Cleanup(srv.Close)
	return srv.URL, charges
}

func TestUnroutedPathDoesNotBurnTheKey(t *testing.T) {
	// echo's Group.Use registers catch-all not-found routes, so the group's
	// middleware runs on a mistyped path: its 404 must not be recorded, or
	// the corrected request with the same key gets 422.
	base, charges := serveGroup(t)
	typo := adaptertest.Post(t, base+"/v1/chargee", "k", `{}`)
	require.Equal(t, http.StatusNotFound, typo.Status)
	fixed := adaptertest.Post(t, base+"/v1/charge", "k", `{}`)
	require.Equal(t, http.StatusCreated, fixed.Status, "body: %s", fixed.Body)
	require.Empty(t, typo.Header.Get(idem.HeaderKey), "not protected: idem did not see it")
	require.Empty(t, fixed.Header.Get(idem.HeaderReplayed))
	require.JSONEq(t, `{"charge":1}`, string(fixed.Body))
	again := adaptertest.Post(t, base+"/v1/charge", "k", `{}`)
	require.Equal(t, "true", again.Header.Get(idem.HeaderReplayed))
	require.EqualValues(t, 1, charges.Load())
}

func TestUnroutedMethodDoesNotBurnTheKey(t *testing.T) {
	// A POST to a GET-only route under the group is echo's to refuse (echo
	// answers it from the group's catch-all, 404; a route without a group
	// answers 405): not recorded either.
	base, charges := serveGroup(t)
	wrong := adaptertest.Post(t, base+"/v1/orders", "k", `{}`)
	require.Contains(t, []int{http.StatusNotFound, http.StatusMethodNotAllowed}, wrong.Status)
	fixed := adaptertest.Post(t, base+"/v1/charge", "k", `{}`)
	require.Equal(t, http.StatusCreated, fixed.Status, "body: %s", fixed.Body)
	require.Empty(t, wrong.Header.Get(idem.HeaderKey), "not protected: idem did not see it")
	require.EqualValues(t, 1, charges.Load())
}

func TestUnroutedMethodUnderGlobalMiddleware(t *testing.T) {
	// e.Use(idemecho.Middleware(mw)): echo answers a POST to a GET-only
	// route 405 and an unknown path 404, neither recorded.
	e := newEcho()
	e.Use(idemecho.Middleware(adaptertest.NewMiddleware(t, adaptertest.SQLite(t))))
	var charges atomic.Int64
	e.POST("/charge", func(c echo.Context) error {
		return c.JSON(http.StatusCreated, map[string]int64{"charge": charges.Add(1)})
	})
	e.GET("/orders", func(c echo.Context) error { return c.NoContent(http.StatusOK) })
	srv := httptest.NewServer(e)
	t.Cleanup(srv.Close)
	wrong := adaptertest.Post(t, srv.URL+"/orders", "k", `{}`)
	require.Equal(t, http.StatusMethodNotAllowed, wrong.Status)
	require.Equal(t, "OPTIONS, GET", wrong.Header.Get("Allow"))
	require.Equal(t, http.StatusNotFound, adaptertest.Post(t, srv.URL+"/chargee", "k", `{}`).Status)
	fixed := adaptertest.Post(t, srv.URL+"/charge", "k", `{}`)
	require.Equal(t, http.StatusCreated, fixed.Status, "body: %s", fixed.Body)
	require.EqualValues(t, 1, charges.Load())
}
