package browser

import (
	"context"
	"fmt"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"sync/atomic"
	"testing"
	"time"

	"github.com/chromedp/chromedp"
	"github.com/rs/cors"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/idemgo/idem"
	"github.com/idemgo/idem/idemsqlite"
)

// page is the page the browser opens: post() sends one fetch() with an
// Idempotency-Key and returns what the page can read of the answer.
const page = `<!doctype html><title>idem CORS</title><script>
async function post(api, key) {
  try {
    const r = await fetch(api + "/orders", {
      method: "POST",
      headers: {"Content-Type": "application/json", "Idempotency-Key": key},
      body: '{"sku":"tea"}',
    });
    return {status: r.status, replayed: r.headers.get("Idempotent-Replayed"),
            retryAfter: r.headers.get("Retry-After"), key: r.headers.get("Idempotency-Key"),
            expires: r.headers.get("Idempotency-Key-Expires"), body: await r.text()};
  } catch (e) {
    return {error: String(e)};
  }
}
</script>`

// answer is what post() returns; nil pointers are the page's nulls.
type answer struct {
	Status     int     `json:"status"`
	Replayed   *string `json:"replayed"`
	RetryAfter *string `json:"retryAfter"`
	Key        *string `json:"key"`
	Expires    *string `json:"expires"`
	Body       string  `json:"body"`
	Error      string  `json:"error"`
}

// api is an API on its own origin: POST /orders under idem, counting its
// executions; the key "slow" holds its execution until release is closed.
type api struct {
	url        string
	executions atomic.Int64
	entered    chan struct{}
	release    chan struct{}
}

// startAPI serves the API, wrapped by wrap (idem's middleware, the CORS
// middleware, in some order), on a fresh SQLite store.
func startAPI(t *testing.T, wrap func(mw *idem.Middleware, next http.Handler) http.Handler) *api {
	t.Helper()
	ctx := context.Background()
	store, err := idemsqlite.Open(ctx, filepath.Join(t.TempDir(), "idem.db"))
	require.NoError(t, err)
	t.Cleanup(func() { store.Close() })
	require.NoError(t, store.Migrate(ctx))
	mw, err := idem.NewMiddleware(store, idem.Options{Scope: idem.SingleTenant})
	require.NoError(t, err)
	a := &api{entered: make(chan struct{}, 1), release: make(chan struct{})}
	orders := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		n := a.executions.Add(1)
		if r.Header.Get(idem.HeaderKey) == "slow" {
			a.entered <- struct{}{}
			<-a.release
		}
		w.Header().Set("Content-Type", "application/json")
		w.Header().Set("Location", fmt.Sprintf("/orders/%d", n))
		w.WriteHeader(http.StatusCreated)
		fmt.Fprintf(w, `{"order":%d}`, n)
	})
	srv := httptest.NewServer(wrap(mw, orders))
	t.Cleanup(srv.Close)
	t.Cleanup(func() {
		select {
		case <-a.release:
		default:
			close(a.release)
		}
	})
	a.url = srv.URL // http://127.0.0.1:PORT, another origin than the page's
	return a
}

// chromium returns the browser's path: $CHROMIUM, or chromium on PATH.
// Without one the test skips, or fails under CI.
func chromium(t *testing.T) string {
	t.Helper()
	if p := os.Getenv("CHROMIUM"); p != "" {
		return p
	}
	for _, name := range []string{"chromium", "chromium-browser"} {
		if p, err := exec.LookPath(name); err == nil {
			return p
		}
	}
	if os.Getenv("CI") != "" {
		t.Fatal("no chromium on PATH (apt-get install chromium), and CI is set")
	}
	t.Skip("no chromium on PATH (apt-get install chromium): skipping the browser test")
	return ""
}

// browser opens the page, served from http://localhost:PORT, in a fresh
// headless Chromium, and returns the tab's context and the page's origin.
func browser(t *testing.T) (context.Context, string) {
	t.Helper()
	exe := chromium(t)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	pageSrv := &httptest.Server{Listener: ln, Config: &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/html; charset=utf-8")
		fmt.Fprint(w, page)
	})}}
	pageSrv.Start()
	t.Cleanup(pageSrv.Close)
	origin := fmt.Sprintf("http://localhost:%d", ln.Addr().(*net.TCPAddr).Port)

	allocCtx, cancelAlloc := chromedp.NewExecAllocator(context.Background(),
		chromedp.ExecPath(exe),
		chromedp.Headless,
		chromedp.NoSandbox,
		chromedp.DisableGPU,
		chromedp.NoFirstRun,
		chromedp.NoDefaultBrowserCheck,
		chromedp.Flag("disable-background-networking", true),
		chromedp.Flag("disable-component-update", true),
		chromedp.Flag("disable-sync", true),
		chromedp.UserDataDir(t.TempDir()),
	)
	t.Cleanup(cancelAlloc)
	ctx, cancel := chromedp.NewContext(allocCtx)
	t.Cleanup(cancel)
	ctx, cancelTimeout := context.WithTimeout(ctx, 2*time.Minute)
	t.Cleanup(cancelTimeout)
	_, err = chromedp.Run(ctx, chromedp.Navigate(origin+"/"))
	require.NoError(t, err)
	return ctx, origin
}

// eval evaluates js on the page, awaiting its promise.
func eval[T any](t *testing.T, ctx context.Context, js string) T {
	t.Helper()
	v, err := chromedp.Run(ctx, chromedp.Evaluate[T](js, chromedp.EvalAwaitPromise))
	require.NoError(t, err, "evaluating %s", js)
	return v
}

// TestBrowserReadsReplayAndRetryAfter: a page on localhost calls an API on
// another origin, with idem inside the CORS middleware (WithCORS). The same
// fetch() twice: the second is the replay and the page reads
// Idempotent-Replayed: true; a fetch() while the first with its key is in
// flight gets 409 and the page reads its Retry-After. Two broken set-ups
// show what each part prevents: without Access-Control-Expose-Headers the
// page reads null for both headers; with idem outside the CORS middleware
// the replay lacks Access-Control-Allow-Origin and fetch() rejects.
func TestBrowserReadsReplayAndRetryAfter(t *testing.T) {
	ctx, origin := browser(t)
	origins := func() []string { return []string{origin} }

	good := startAPI(t, func(mw *idem.Middleware, next http.Handler) http.Handler {
		return WithCORS(mw, origins(), next)
	})
	notExposed := startAPI(t, func(mw *idem.Middleware, next http.Handler) http.Handler {
		c := cors.New(cors.Options{AllowedOrigins: origins(), AllowedMethods: []string{http.MethodPost},
			AllowedHeaders: []string{"Content-Type", idem.HeaderKey}})
		return c.Handler(mw.Handler(next))
	})
	idemOutside := startAPI(t, func(mw *idem.Middleware, next http.Handler) http.Handler {
		c := cors.New(cors.Options{AllowedOrigins: origins(), AllowedMethods: []string{http.MethodPost},
			AllowedHeaders: []string{"Content-Type", idem.HeaderKey}, ExposedHeaders: ExposedHeaders()})
		return mw.Handler(c.Handler(next))
	})
	post := func(a *api, key string) answer {
		return eval[answer](t, ctx, fmt.Sprintf("post(%q, %q)", a.url, key))
	}

	t.Run("replay", func(t *testing.T) {
		first, second := post(good, "order-1"), post(good, "order-1")
		require.Empty(t, first.Error)
		require.Empty(t, second.Error)
		assert.Equal(t, http.StatusCreated, first.Status)
		assert.Nil(t, first.Replayed)
		assert.Equal(t, http.StatusCreated, second.Status)
		require.NotNil(t, second.Replayed, "the page cannot read Idempotent-Replayed")
		assert.Equal(t, "true", *second.Replayed)
		assert.Equal(t, first.Body, second.Body)
		require.NotNil(t, second.Key, "the page cannot read Idempotency-Key")
		assert.Equal(t, "order-1", *second.Key)
		require.NotNil(t, second.Expires, "the page cannot read Idempotency-Key-Expires")
		_, err := http.ParseTime(*second.Expires)
		assert.NoError(t, err)
		assert.Equal(t, int64(1), good.executions.Load())
	})

	t.Run("in flight", func(t *testing.T) {
		eval[bool](t, ctx, fmt.Sprintf("window.slow = post(%q, 'slow'); true", good.url))
		<-good.entered // the first fetch's execution runs, holding the key
		dup := post(good, "slow")
		require.Empty(t, dup.Error)
		assert.Equal(t, http.StatusConflict, dup.Status, dup.Body)
		require.NotNil(t, dup.RetryAfter, "the page cannot read Retry-After")
		assert.Regexp(t, `^[1-9][0-9]*$`, *dup.RetryAfter)
		close(good.release)
		first := eval[answer](t, ctx, "window.slow")
		require.Empty(t, first.Error)
		assert.Equal(t, http.StatusCreated, first.Status)
		again := post(good, "slow")
		require.NotNil(t, again.Replayed)
		assert.Equal(t, "true", *again.Replayed)
		assert.Equal(t, first.Body, again.Body)
	})

	t.Run("headers not exposed", func(t *testing.T) {
		first, second := post(notExposed, "order-1"), post(notExposed, "order-1")
		require.Empty(t, first.Error)
		require.Empty(t, second.Error)
		assert.Equal(t, http.StatusCreated, second.Status)
		assert.Equal(t, first.Body, second.Body, "the server replayed")
		assert.Nil(t, second.Replayed, "Idempotent-Replayed readable without Access-Control-Expose-Headers")
		assert.Equal(t, int64(1), notExposed.executions.Load())
	})

	t.Run("idem outside CORS", func(t *testing.T) {
		first, second := post(idemOutside, "order-1"), post(idemOutside, "order-1")
		require.Empty(t, first.Error)
		assert.Equal(t, http.StatusCreated, first.Status)
		assert.NotEmpty(t, second.Error, "the browser let the page read a replay without CORS headers: %+v", second)
		assert.Equal(t, int64(1), idemOutside.executions.Load(), "the replay was answered, just not to the page")
	})
}
