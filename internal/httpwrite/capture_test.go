package httpwrite

import (
	"net/http"
	"net/http/httptest"
	"testing"

	"github.com/stretchr/testify/require"
)

func TestCaptureWriterHoldsResponseUntilSent(t *testing.T) {
	t.Parallel()
	rec := httptest.NewRecorder()
	c := NewCapture(rec)
	var w http.ResponseWriter = c
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(http.StatusCreated)
	w.Header().Set("X-Late", "ignored, as net/http ignores it") // after WriteHeader
	_, _ = w.Write([]byte(`{"a":1}`))
	require.NoError(t, http.NewResponseController(w).Flush(), "deferred, not an error")
	w.WriteHeader(http.StatusTeapot) // superfluous, ignored

	require.Equal(t, 200, rec.Code, "nothing reaches the client before send")
	require.Empty(t, rec.Body.Bytes())
	require.False(t, rec.Flushed)

	c.Send(nil)
	require.Equal(t, http.StatusCreated, rec.Code)
	require.Equal(t, `{"a":1}`, rec.Body.String())
	require.Equal(t, "application/json", rec.Header().Get("Content-Type"))
	require.Equal(t, "7", rec.Header().Get("Content-Length"))
	require.Empty(t, rec.Header().Get("X-Late"))
	require.True(t, rec.Flushed)
}

func TestCaptureWriterDefaults(t *testing.T) {
	t.Parallel()
	rec := httptest.NewRecorder()
	c := NewCapture(rec)
	c.Send(nil) // a handler that wrote nothing answers 200, as net/http would
	require.Equal(t, http.StatusOK, rec.Code)
	require.Equal(t, rec, c.Unwrap())

	rec = httptest.NewRecorder()
	c = NewCapture(rec)
	c.WriteHeader(http.StatusNoContent)
	c.Send(nil)
	require.Equal(t, http.StatusNoContent, rec.Code)
	require.Empty(t, rec.Header().Get("Content-Length"), "no Content-Length on 204")
}

// A protected handler cannot hijack the connection. Regression:
// http.ResponseController reached the client's writer through Unwrap, the
// handler answered on the raw connection, idem recorded "200" with an empty
// body and replayed that, and net/http panicked on idem's own answer.
func TestCaptureWriterRefusesHijack(t *testing.T) {
	t.Parallel()
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		c := NewCapture(w)
		_, _, err := http.NewResponseController(c).Hijack()
		require.ErrorIs(t, err, http.ErrNotSupported)
		c.WriteHeader(http.StatusAccepted)
		c.Send(nil)
	}))
	defer srv.Close()
	resp, err := http.Get(srv.URL)
	require.NoError(t, err)
	require.NoError(t, resp.Body.Close())
	require.Equal(t, http.StatusAccepted, resp.StatusCode)
}
