package main

import (
	"bufio"
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// A client that stops sending its body mid-way gets a 400 that says so,
// without the server's or the client's address (regression: the detail was
// Go's read error, "read tcp 127.0.0.1:PORT->127.0.0.1:PORT: i/o timeout").
func TestStalledBodyDetailNamesNoAddress(t *testing.T) {
	t.Parallel()
	h, err := newHandler(handlerConfig{Store: newSQLiteStore(t), Provider: NewFakeProvider(0), Logger: discardLogger()})
	require.NoError(t, err)
	srv := httptest.NewUnstartedServer(h)
	srv.Config.ReadTimeout = 300 * time.Millisecond // service.Server's is a minute
	srv.Start()
	t.Cleanup(srv.Close)

	conn, err := net.Dial("tcp", srv.Listener.Addr().String())
	require.NoError(t, err)
	defer conn.Close()
	body := paymentBody
	_, err = fmt.Fprintf(conn, "POST /v1/payments HTTP/1.1\r\nHost: x\r\nAuthorization: %s\r\nIdempotency-Key: stall-1\r\n"+
		"Content-Type: application/json\r\nContent-Length: %d\r\n\r\n%s", auth("acme"), len(body)+100, body)
	require.NoError(t, err) // and the 100 bytes more never come
	require.NoError(t, conn.SetReadDeadline(time.Now().Add(30*time.Second)))
	resp, err := http.ReadResponse(bufio.NewReader(conn), nil)
	require.NoError(t, err)
	defer resp.Body.Close()
	require.Equal(t, http.StatusBadRequest, resp.StatusCode)
	var p struct{ Detail string }
	require.NoError(t, json.NewDecoder(resp.Body).Decode(&p))
	require.NotEmpty(t, p.Detail)
	host, _, _ := net.SplitHostPort(srv.Listener.Addr().String())
	for _, leak := range []string{host, "tcp", "->"} {
		require.False(t, strings.Contains(p.Detail, leak), "detail %q names %q", p.Detail, leak)
	}
	require.Contains(t, p.Detail, "body")
}
