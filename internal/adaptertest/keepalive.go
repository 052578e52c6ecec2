package adaptertest

import (
	"io"
	"net/http"
	"net/http/httptrace"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/idemgo/idem"
)

// PostOnReusedConn posts {} with key to url on a keep-alive connection that
// already served a GET of warm, with a client of its own, and returns the
// answer or the client's error. It is the case in which Go's http.Transport
// resends a request by itself: a POST carrying an Idempotency-Key header is
// replayable for it (Request.isReplayable), and when a reused connection
// breaks before the first response byte (a server that drops it on a
// handler panic) the transport sends the request again on a new one, so one
// client call runs the handler twice unless the server answers. t fails if
// the POST did not go out on the warmed connection.
func PostOnReusedConn(t *testing.T, warm, url, key string) (Response, error) {
	t.Helper()
	tr := &http.Transport{}
	t.Cleanup(tr.CloseIdleConnections)
	client := &http.Client{Transport: tr}
	resp, err := client.Get(warm)
	require.NoError(t, err)
	_, err = io.Copy(io.Discard, resp.Body) // to EOF: the connection goes back idle
	require.NoError(t, err)
	require.NoError(t, resp.Body.Close())

	var reused []bool // one per attempt the transport made
	trace := &httptrace.ClientTrace{GotConn: func(i httptrace.GotConnInfo) { reused = append(reused, i.Reused) }}
	req, err := http.NewRequestWithContext(httptrace.WithClientTrace(t.Context(), trace), http.MethodPost, url, strings.NewReader(`{}`))
	require.NoError(t, err)
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set(idem.HeaderKey, key)
	resp, err = client.Do(req)
	require.NotEmpty(t, reused)
	require.True(t, reused[0], "the POST went out on a new connection, not the warmed one")
	if err != nil {
		return Response{}, err
	}
	defer func() { _ = resp.Body.Close() }()
	b, err := io.ReadAll(resp.Body)
	return Response{Status: resp.StatusCode, Header: resp.Header, Body: b}, err
}
