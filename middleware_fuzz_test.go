package idem_test

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"sync"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/idemgo/idem"
)

// FuzzMiddleware runs the middleware end to end on SQLite with a fuzzed
// method, path, key, Content-Type, one more header and body, each request
// sent twice. Whatever the input: idem never answers 5xx (the handler
// answers 2xx only, and the store is healthy), a handler never runs twice
// for one key of a request protected or looking protected (a method that is
// POST or PATCH without regard to case), and a 2xx is replayed byte for
// byte.
func FuzzMiddleware(f *testing.F) {
	f.Add("POST", "/v1/payments", "k1", "application/json", "X-Other", "v", []byte(`{"amount":100}`))
	f.Add("post", "/v1/payments", "k2", "application/json", "", "", []byte(`{"amount":100}`))
	f.Add("PATCH", "/v1/payments/1", `"quoted"`, "text/plain", "Trailer", "X-T", []byte("raw body"))
	f.Add("GET", "/", "k", "", "Idempotency-Key", "k, k", []byte(nil))
	f.Add("POST", "/caf\u00e9/%zz", "k1", "application/merge-patch+json", "Content-Encoding", "gzip", []byte(`{"b":2,"a":1e400}`))
	f.Add("PoSt", "/x", "tab\tkey", "application/json; charset=utf-8", "Content-Length", "-1", []byte(`{"a":9007199254740993}`))
	f.Add("DELETE", strings.Repeat("/p", 2100), "k3", "application/json", "Host", "evil", []byte("{}"))

	store := openSQLite(f)
	var (
		mu   sync.Mutex
		runs = map[string]int{} // per parsed key
	)
	h := newMiddleware(f, store, idem.Options{}).Handler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if looksProtected(r.Method) {
			if key, err := idem.ParseKey(r.Header.Values(idem.HeaderKey)); err == nil {
				mu.Lock()
				runs[key]++
				mu.Unlock()
			}
		}
		body, _ := io.ReadAll(r.Body)
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusCreated)
		_, _ = fmt.Fprintf(w, `{"len":%d}`, len(body)) // a recorder, or idem's capture of the answer: no write fails
	}))
	f.Fuzz(func(t *testing.T, method, path, key, contentType, name, value string, body []byte) {
		build := func() *http.Request {
			req := (&http.Request{
				Method: method, URL: &url.URL{Path: path}, Proto: "HTTP/1.1", ProtoMajor: 1, ProtoMinor: 1,
				Header: http.Header{}, Body: io.NopCloser(bytes.NewReader(body)), Host: "api.test",
				ContentLength: int64(len(body)),
			}).WithContext(context.Background())
			if name != "" {
				req.Header[name] = []string{value}
			}
			if key != "" {
				req.Header[idem.HeaderKey] = append(req.Header[idem.HeaderKey], key)
			}
			if contentType != "" {
				req.Header["Content-Type"] = []string{contentType}
			}
			return req
		}
		var answers [2]*httptest.ResponseRecorder
		for i := range answers {
			answers[i] = httptest.NewRecorder()
			h.ServeHTTP(answers[i], build())
			require.Less(t, answers[i].Code, 500, "answer %d: %s", i, answers[i].Body.String())
		}
		if k, err := idem.ParseKey(build().Header.Values(idem.HeaderKey)); err == nil {
			mu.Lock()
			n := runs[k]
			mu.Unlock()
			require.LessOrEqual(t, n, 1, "key %q ran %d times", k, n)
		}
		first, again := answers[0], answers[1]
		if looksProtected(method) && first.Code == http.StatusCreated && first.Header().Get(idem.HeaderReplayed) == "" {
			require.Equal(t, "true", again.Header().Get(idem.HeaderReplayed), "the second of one request is a replay")
			require.Equal(t, first.Code, again.Code)
			require.Equal(t, first.Body.Bytes(), again.Body.Bytes())
		}
	})
}

// looksProtected reports whether method is one of the default protected
// methods without regard to case.
func looksProtected(method string) bool {
	return strings.EqualFold(method, http.MethodPost) || strings.EqualFold(method, http.MethodPatch)
}
