package service

import (
	"bytes"
	"encoding/json"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/idemgo/idem"
	"github.com/idemgo/idem/seal"
)

// logLine serves one request through LogRequests(unanswered, h) and returns
// its log line, decoded, and the raw line.
func logLine(t *testing.T, unanswered int, h http.Handler, r *http.Request) (map[string]any, string) {
	t.Helper()
	var buf bytes.Buffer
	LogRequests(slog.New(slog.NewJSONHandler(&buf, nil)), unanswered, nil, h).ServeHTTP(httptest.NewRecorder(), r)
	var line map[string]any
	require.NoError(t, json.Unmarshal(buf.Bytes(), &line), buf.String())
	require.Equal(t, "request", line["msg"])
	return line, buf.String()
}

func TestLogRequests(t *testing.T) {
	t.Parallel()
	h := testAPI.Authenticate(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		info := RequestInfoFrom(r.Context())
		info.Attrs = append(info.Attrs, slog.Bool("own", true))
		w.Header().Set(idem.HeaderReplayed, "true")
		w.WriteHeader(http.StatusCreated)
		_, _ = w.Write([]byte("hello"))
		w.WriteHeader(http.StatusTeapot) // superfluous: the first one counts
	}))
	r := httptest.NewRequest(http.MethodPost, "/v1/things?x=1", strings.NewReader("{}"))
	r.Header.Set("Authorization", "Bearer sk_test_acme")
	r.Header.Set(idem.HeaderKey, `"k-1"`)
	line, raw := logLine(t, 0, h, r)
	require.Equal(t, "INFO", line["level"])
	require.Equal(t, http.MethodPost, line["method"])
	require.Equal(t, "/v1/things", line["path"])
	require.EqualValues(t, http.StatusCreated, line["status"])
	require.Contains(t, line, "duration_ms")
	require.EqualValues(t, 5, line["bytes"])
	require.Equal(t, "k-1", line["idempotency_key"], "as idem stores it")
	require.Equal(t, true, line["replayed"])
	require.Equal(t, true, line["own"])
	require.Equal(t, "acme", line["merchant"])
	require.NotContains(t, raw, "sk_test_", "the API key is never logged")
	order := []string{`"method"`, `"path"`, `"status"`, `"duration_ms"`, `"bytes"`, `"idempotency_key"`, `"replayed"`, `"own"`, `"merchant"`}
	for i := 1; i < len(order); i++ {
		require.Less(t, strings.Index(raw, order[i-1]), strings.Index(raw, order[i]), "%s before %s", order[i-1], order[i])
	}
}

func TestLogRequestsStatus(t *testing.T) {
	t.Parallel()
	get := func() *http.Request { return httptest.NewRequest(http.MethodGet, "/", nil) }
	nothing := http.HandlerFunc(func(http.ResponseWriter, *http.Request) {})
	line, _ := logLine(t, 0, nothing, get())
	require.EqualValues(t, 0, line["status"], "no answer sent")
	require.Equal(t, false, line["replayed"])
	require.Equal(t, "", line["merchant"])
	require.Equal(t, "", line["idempotency_key"])
	line, _ = logLine(t, http.StatusOK, nothing, get())
	require.EqualValues(t, http.StatusOK, line["status"], "what net/http sends")

	line, _ = logLine(t, 0, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { _, _ = w.Write([]byte("x")) }), get())
	require.EqualValues(t, http.StatusOK, line["status"], "a body without a status is a 200")
	require.Equal(t, "INFO", line["level"])

	line, _ = logLine(t, 0, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { w.WriteHeader(http.StatusBadGateway) }), get())
	require.EqualValues(t, http.StatusBadGateway, line["status"])
	require.Equal(t, "WARN", line["level"], "5xx")
}

// TestLogRequestsUnwrap: http.ResponseController reaches the real writer.
func TestLogRequestsUnwrap(t *testing.T) {
	t.Parallel()
	var flushErr error
	h := LogRequests(slog.New(slog.DiscardHandler), 0, nil, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		flushErr = http.NewResponseController(w).Flush()
	}))
	w := httptest.NewRecorder()
	h.ServeHTTP(w, httptest.NewRequest(http.MethodGet, "/", nil))
	require.NoError(t, flushErr)
	require.True(t, w.Flushed)
}

// Regression: the log showed the raw header ("\"q1\"") while idem stores
// and `idem inspect --key` wants the key itself (q1).
func TestLoggedKeyIsTheStoredKey(t *testing.T) {
	t.Parallel()
	for header, want := range map[string]string{`"q1"`: "q1", `q1`: "q1", `"p1";x=1`: "p1", `a, b`: "a, b"} {
		r := httptest.NewRequest("POST", "/v1/payments", nil)
		r.Header.Set(idem.HeaderKey, header)
		require.Equal(t, want, LoggedKey(r, nil), header)
	}
}

// Regression: with a key-hash secret, idem stores the key's HMAC, but the
// log showed the client's key in plain. storedKey (idem.Engine.StoredKey)
// gives the stored form, also of a header that does not parse.
func TestLoggedKeyHashed(t *testing.T) {
	t.Parallel()
	secret := []byte("a key-hash secret of 32 bytes...")
	storedKey := func(key string) string { return seal.HashKey(secret, key) } // idem.Engine.StoredKey's
	for header, want := range map[string]string{`"q1"`: seal.HashKey(secret, "q1"), `a, b`: seal.HashKey(secret, "a, b")} {
		r := httptest.NewRequest("POST", "/v1/payments", nil)
		r.Header.Set(idem.HeaderKey, header)
		require.Equal(t, want, LoggedKey(r, storedKey), header)
		var buf bytes.Buffer
		LogRequests(slog.New(slog.NewJSONHandler(&buf, nil)), 0, storedKey, http.NotFoundHandler()).ServeHTTP(httptest.NewRecorder(), r)
		require.Contains(t, buf.String(), `"idempotency_key":"`+want+`"`)
		require.NotContains(t, buf.String(), `q1"`, "the client's key is not logged")
	}
	r := httptest.NewRequest("POST", "/v1/payments", nil)
	require.Empty(t, LoggedKey(r, storedKey), "no header, no key")
}

func TestNewLogger(t *testing.T) {
	t.Parallel()
	var buf bytes.Buffer
	NewLogger(&buf, "json").Info("hi", "k", 1)
	require.Contains(t, buf.String(), `"msg":"hi","k":1`)
	buf.Reset()
	NewLogger(&buf, "text").Info("hi", "k", 1)
	require.Contains(t, buf.String(), `msg=hi k=1`)
	buf.Reset()
	NewLogger(&buf, "json").Debug("not at the default level")
	require.Empty(t, buf.String())
}
