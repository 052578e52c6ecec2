package idemclient_test

import (
	"context"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/idemgo/idem"
	"github.com/idemgo/idem/idemclient"
)

// ProblemOf reads idem's problems as a real middleware sends them: 422
// key-reused of another path says a new key is safe, 409 in flight says it
// is not; the body
// stays readable, and a response that is no problem is left alone.
func TestProblemOfIdemAnswers(t *testing.T) {
	t.Parallel()
	mw := newMiddleware(t)
	held, release := make(chan struct{}), make(chan struct{})
	srv := httptest.NewServer(mw.Handler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/held" {
			close(held)
			<-release
		}
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusCreated)
		_, _ = io.WriteString(w, `{"id":1}`) // a write error means the client is gone
	})))
	t.Cleanup(srv.Close)
	tr, err := idemclient.New(idemclient.Config{MaxAttempts: 1})
	require.NoError(t, err)
	client := &http.Client{Transport: tr}
	post := func(path, key, body string) *http.Response {
		req, err := http.NewRequestWithContext(t.Context(), http.MethodPost, srv.URL+path, strings.NewReader(body))
		require.NoError(t, err)
		req.Header.Set(idemclient.HeaderKey, key)
		resp, err := client.Do(req)
		require.NoError(t, err)
		t.Cleanup(func() { _ = resp.Body.Close() })
		return resp
	}

	ok := post("/pay", "k1", `{"a":1}`)
	_, isProblem, err := idemclient.ProblemOf(ok)
	require.NoError(t, err)
	require.False(t, isProblem)
	require.Equal(t, `{"id":1}`, readBody(t, ok))

	reused := post("/refund", "k1", `{"a":2}`)
	p, isProblem, err := idemclient.ProblemOf(reused)
	require.NoError(t, err)
	require.True(t, isProblem)
	require.Equal(t, idem.ProblemTypeBase+"key-reused", p.Type)
	require.Equal(t, http.StatusUnprocessableEntity, p.Status)
	require.True(t, p.NewKeySafe, "the key is another path's")
	require.Contains(t, readBody(t, reused), `"new_key_safe":true`, "the body is given back whole")

	first := make(chan int, 1)
	go func() {
		req, _ := http.NewRequestWithContext(context.Background(), http.MethodPost, srv.URL+"/held", strings.NewReader(`{}`))
		req.Header.Set(idemclient.HeaderKey, "k2")
		resp, err := client.Do(req)
		if err != nil {
			first <- 0
			return
		}
		_ = resp.Body.Close()
		first <- resp.StatusCode
	}()
	<-held
	inFlight := post("/held", "k2", `{}`)
	p, isProblem, err = idemclient.ProblemOf(inFlight)
	close(release)
	require.NoError(t, err)
	require.True(t, isProblem)
	require.Equal(t, http.StatusConflict, p.Status)
	require.False(t, p.NewKeySafe, "the first attempt may be charging")
	require.Equal(t, http.StatusCreated, <-first)
}

// A problem's members of the wrong type are ignored (RFC 9457 section
// 3.1); new_key_safe named twice is true only when both say so; what is no
// JSON object is an error, its bytes still readable.
func TestProblemOfMembers(t *testing.T) {
	t.Parallel()
	for body, want := range map[string]idemclient.Problem{
		`{"type":"t","status":"422","new_key_safe":true}`:       {Type: "t", NewKeySafe: true},
		`{"status":409,"detail":7,"new_key_safe":"yes"}`:        {Status: 409},
		`{"new_key_safe":false,"new_key_safe":true}`:            {},
		`{"new_key_safe":true,"new_key_safe":true,"extra":[1]}`: {NewKeySafe: true},
	} {
		p, ok, err := idemclient.ProblemOf(problemResponse(body))
		require.NoError(t, err, body)
		require.True(t, ok)
		require.Equal(t, want, p, body)
	}
	resp := problemResponse(`["not", "an", "object"]`)
	_, ok, err := idemclient.ProblemOf(resp)
	require.Error(t, err)
	require.False(t, ok)
	require.Equal(t, `["not", "an", "object"]`, readBody(t, resp))
}

func problemResponse(body string) *http.Response {
	return &http.Response{StatusCode: 422, Header: http.Header{"Content-Type": {"application/problem+json; charset=utf-8"}},
		Body: io.NopCloser(strings.NewReader(body))}
}
