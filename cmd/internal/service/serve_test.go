package service

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"io"
	"log/slog"
	"net"
	"net/http"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/idemgo/idem/cmd/internal/demotest"
)

// slowServer is a Server on a free loopback port whose handler answers
// "ok", after release is closed for the path /slow (entered tells when such
// a request has arrived, finished when it has been answered). Its log can be
// read once Serve has returned and no request is running.
type slowServer struct {
	Server
	log                        bytes.Buffer
	release, entered, finished chan struct{}
}

func newSlowServer(t *testing.T, shutdownTimeout time.Duration) *slowServer {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	addr := ln.Addr().String()
	require.NoError(t, ln.Close())
	s := &slowServer{release: make(chan struct{}), entered: make(chan struct{}, 1), finished: make(chan struct{}, 1)}
	s.Server = Server{Addr: addr, Log: slog.New(slog.NewJSONHandler(&s.log, nil)), ShutdownTimeout: shutdownTimeout,
		Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			if r.URL.Path == "/slow" {
				s.entered <- struct{}{}
				<-s.release
				defer func() { s.finished <- struct{}{} }()
			}
			_, _ = io.WriteString(w, "ok")
		})}
	return s
}

// serve runs Serve in the background and waits until it answers.
func (s *slowServer) serve(t *testing.T, ctx context.Context, attrs ...any) (done chan error) {
	t.Helper()
	done = make(chan error, 1)
	go func() { done <- s.Serve(ctx, attrs...) }()
	require.Eventually(t, func() bool {
		resp, err := http.Get("http://" + s.Addr + "/")
		if err != nil {
			return false
		}
		resp.Body.Close()
		return resp.StatusCode == http.StatusOK
	}, 10*time.Second, 10*time.Millisecond)
	return done
}

// getSlow sends GET /slow in the background and waits until it has arrived;
// the channel gets the body, or the error.
func (s *slowServer) getSlow(t *testing.T) chan string {
	t.Helper()
	answer := make(chan string, 1)
	go func() {
		resp, err := http.Get("http://" + s.Addr + "/slow")
		if err != nil {
			answer <- err.Error()
			return
		}
		defer resp.Body.Close()
		b, err := io.ReadAll(resp.Body)
		if err != nil {
			answer <- err.Error()
			return
		}
		answer <- string(b)
	}()
	<-s.entered
	return answer
}

// TestServeShutsDownCleanly: once ctx is done, Serve calls Stop, stops
// accepting, lets the request in flight finish, and returns nil.
func TestServeShutsDownCleanly(t *testing.T) {
	t.Parallel()
	s := newSlowServer(t, 20*time.Second)
	stopped := make(chan struct{})
	s.Stop = func() { close(stopped) }
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	done := s.serve(t, ctx, "database", "sqlite:x.db")
	answer := s.getSlow(t)

	cancel()
	select {
	case <-stopped:
	case <-time.After(10 * time.Second):
		t.Fatal("Serve did not call Stop once ctx was done")
	}
	require.Eventually(t, func() bool {
		conn, err := net.Dial("tcp", s.Addr)
		if err == nil {
			conn.Close()
		}
		return err != nil
	}, 10*time.Second, 10*time.Millisecond, "no new connection once shutting down")
	select {
	case err := <-done:
		t.Fatalf("Serve returned (%v) before the request in flight was answered", err)
	default:
	}
	close(s.release)
	require.Equal(t, "ok", <-answer, "the request in flight is answered")
	require.NoError(t, <-done)
	<-s.finished

	lines := decodeLines(t, s.log.Bytes())
	require.Len(t, lines, 2, s.log.String())
	require.Equal(t, map[string]any{"level": "INFO", "msg": "listening", "addr": s.Addr, "database": "sqlite:x.db"}, withoutTime(lines[0]))
	require.Equal(t, map[string]any{"level": "INFO", "msg": "shutting down", "timeout": "20s"}, withoutTime(lines[1]))
}

// TestServeShutdownTimeout: a request still running after ShutdownTimeout
// loses its connection, and Serve returns nil.
func TestServeShutdownTimeout(t *testing.T) {
	t.Parallel()
	s := newSlowServer(t, 200*time.Millisecond)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	done := s.serve(t, ctx)
	answer := s.getSlow(t)

	cancel()
	demotest.RequireReturns(t, done, 10*time.Second, "Serve still waits past its shutdown timeout")
	require.NotEqual(t, "ok", <-answer, "the connection was closed")
	close(s.release)
	<-s.finished
	lines := decodeLines(t, s.log.Bytes())
	require.Len(t, lines, 3, s.log.String())
	require.Equal(t, "shutdown timed out; closing connections", lines[2]["msg"])
	require.Equal(t, "WARN", lines[2]["level"])
	require.NotEmpty(t, lines[2]["err"])
}

func TestServeListenError(t *testing.T) {
	t.Parallel()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	defer ln.Close()
	var log bytes.Buffer
	s := Server{Addr: ln.Addr().String(), Handler: http.NotFoundHandler(), Log: slog.New(slog.NewJSONHandler(&log, nil))}
	require.Error(t, s.Serve(context.Background()), "the address is taken")
	require.Empty(t, log.String(), "not listening")
}

type closer struct{ err error }

func (c closer) Close() error { return c.err }

func TestCloseDatabase(t *testing.T) {
	t.Parallel()
	var log bytes.Buffer
	CloseDatabase(slog.New(slog.NewJSONHandler(&log, nil)), closer{})
	lines := decodeLines(t, log.Bytes())
	require.Equal(t, []map[string]any{{"level": "INFO", "msg": "database closed"}}, []map[string]any{withoutTime(lines[0])})
	require.Len(t, lines, 1)

	log.Reset()
	CloseDatabase(slog.New(slog.NewJSONHandler(&log, nil)), closer{errors.New("boom")})
	lines = decodeLines(t, log.Bytes())
	require.Len(t, lines, 2)
	require.Equal(t, map[string]any{"level": "WARN", "msg": "closing the database", "err": "boom"}, withoutTime(lines[0]))
	require.Equal(t, "database closed", lines[1]["msg"])
}

// decodeLines decodes JSON log lines.
func decodeLines(t *testing.T, b []byte) []map[string]any {
	t.Helper()
	var lines []map[string]any
	for _, l := range bytes.Split(bytes.TrimSpace(b), []byte("\n")) {
		var m map[string]any
		require.NoError(t, json.Unmarshal(l, &m), "%s", l)
		lines = append(lines, m)
	}
	return lines
}

func withoutTime(m map[string]any) map[string]any {
	delete(m, "time")
	return m
}
