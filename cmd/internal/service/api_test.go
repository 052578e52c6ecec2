package service

import (
	"context"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/google/uuid"
	"github.com/stretchr/testify/require"
)

var testAPI = &API{
	Name:            "svctest",
	ProblemTypeBase: "https://example.com/svctest#",
	ProblemTitles:   map[string]string{"own-kind": "Own title", ProblemNotFound: "Overridden"},
}

func TestParseAuthorization(t *testing.T) {
	t.Parallel()
	for _, ok := range []string{"a", "acme", "ACME_inc-2", strings.Repeat("x", 64)} {
		got, err := ParseAuthorization([]string{"Bearer sk_test_" + ok})
		require.NoError(t, err, ok)
		require.Equal(t, ok, got)
	}
	for _, bad := range []string{"", "a.b", "a b", "a/b", "ä", strings.Repeat("x", 65)} {
		_, err := ParseAuthorization([]string{"Bearer sk_test_" + bad})
		require.Error(t, err, bad)
	}
	for header, want := range map[string]string{"bearer sk_test_m": "m", " BEARER   sk_test_m ": "m"} {
		got, err := ParseAuthorization([]string{header})
		require.NoError(t, err, header)
		require.Equal(t, want, got, header)
	}
	for _, bad := range [][]string{nil, {"Bearer sk_test_a", "Bearer sk_test_b"}, {"Basic c2tfdGVzdF9hOg=="}, {"Bearer"},
		{"Bearer sk_live_a"}, {"sk_test_a"}} {
		_, err := ParseAuthorization(bad)
		require.Error(t, err, "%q", bad)
		require.NotContains(t, err.Error(), "sk_test_a", "the credentials are never echoed")
	}
	// Bearer with no key says so (it used to say "the scheme must be Bearer").
	for _, header := range []string{"Bearer", "Bearer ", "bearer    "} {
		_, err := ParseAuthorization([]string{header})
		require.EqualError(t, err, "the Authorization header has no API key after Bearer", "%q", header)
	}
}

func TestAuthenticate(t *testing.T) {
	t.Parallel()
	var got []string
	h := testAPI.Authenticate(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		m, ok := Merchant(r.Context())
		require.True(t, ok)
		scope, err := Scope(r)
		require.NoError(t, err)
		require.Equal(t, m, scope)
		require.Equal(t, m, RequestInfoFrom(r.Context()).Merchant)
		got = append(got, m)
	}))
	serve := func(authz ...string) *httptest.ResponseRecorder {
		r := httptest.NewRequest(http.MethodGet, "/x", nil)
		r = r.WithContext(context.WithValue(r.Context(), requestInfoKey{}, &RequestInfo{}))
		for _, v := range authz {
			r.Header.Add("Authorization", v)
		}
		w := httptest.NewRecorder()
		h.ServeHTTP(w, r)
		return w
	}

	require.Equal(t, http.StatusOK, serve("Bearer sk_test_acme").Code)
	require.Equal(t, []string{"acme"}, got)

	for _, c := range []struct {
		authz     []string
		challenge string
	}{
		{nil, `Bearer realm="svctest"`},
		{[]string{"Bearer sk_live_acme"}, `Bearer realm="svctest", error="invalid_token"`},
		{[]string{"Bearer sk_test_a", "Bearer sk_test_b"}, `Bearer realm="svctest", error="invalid_token"`},
	} {
		w := serve(c.authz...)
		require.Equal(t, http.StatusUnauthorized, w.Code)
		require.Equal(t, c.challenge, w.Header().Get("WWW-Authenticate"))
		require.Equal(t, "application/problem+json", w.Header().Get("Content-Type"))
		var p map[string]any
		require.NoError(t, json.Unmarshal(w.Body.Bytes(), &p))
		require.Equal(t, "https://example.com/svctest#unauthorized", p["type"])
		require.Equal(t, "Missing or invalid API key", p["title"])
		require.EqualValues(t, http.StatusUnauthorized, p["status"])
		require.NotEmpty(t, p["detail"])
		// Not HTML: the detail's <merchant> reads as written, not \u003c.
		require.NotContains(t, w.Body.String(), `\u003c`)
	}
	require.Contains(t, serve().Body.String(), "sk_test_<merchant>")
	require.Len(t, got, 1, "next never ran for a 401")

	_, err := Scope(httptest.NewRequest(http.MethodGet, "/", nil))
	require.Error(t, err, "no merchant, no scope")
}

func TestProblem(t *testing.T) {
	t.Parallel()
	p := testAPI.Problem(ProblemUnavailable, http.StatusServiceUnavailable, "d")
	require.Equal(t, "https://example.com/svctest#unavailable", p.Type)
	require.Equal(t, "Service unavailable", p.Title)
	require.Equal(t, http.StatusServiceUnavailable, p.Status)
	require.Equal(t, "d", p.Detail)
	require.Equal(t, "Own title", testAPI.Problem("own-kind", 400, "").Title)
	require.Equal(t, "Overridden", testAPI.Problem(ProblemNotFound, 404, "").Title)

	w := httptest.NewRecorder()
	testAPI.WriteProblem(w, ProblemInvalidRequest, http.StatusBadRequest, "bad")
	require.Equal(t, http.StatusBadRequest, w.Code)
	require.Equal(t, "application/problem+json", w.Header().Get("Content-Type"))
	require.JSONEq(t, `{"type":"https://example.com/svctest#invalid-request","title":"The request is not valid","status":400,"detail":"bad"}`,
		w.Body.String())
}

func TestWriteJSON(t *testing.T) {
	t.Parallel()
	w := httptest.NewRecorder()
	testAPI.WriteJSON(w, http.StatusCreated, map[string]int{"a": 1})
	require.Equal(t, http.StatusCreated, w.Code)
	require.Equal(t, "application/json", w.Header().Get("Content-Type"))
	require.Equal(t, "{\"a\":1}\n", w.Body.String())

	w = httptest.NewRecorder()
	testAPI.WriteJSON(w, http.StatusOK, func() {})
	require.Equal(t, http.StatusInternalServerError, w.Code)
	require.Contains(t, w.Body.String(), `"type":"https://example.com/svctest#internal-error"`)
}

func TestNewID(t *testing.T) {
	t.Parallel()
	id := NewID("pay")
	rest, ok := strings.CutPrefix(id, "pay_")
	require.True(t, ok, id)
	u, err := uuid.Parse(rest)
	require.NoError(t, err)
	require.EqualValues(t, 7, u.Version())
	require.NotEqual(t, id, NewID("pay"))
}
