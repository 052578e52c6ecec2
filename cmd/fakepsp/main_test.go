package main

import (
	"context"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/idemgo/idem/cmd/internal/demotest"
	"github.com/idemgo/idem/cmd/internal/service"
	"github.com/idemgo/idem/cmd/internal/supervise"
)

func TestParseFlags(t *testing.T) {
	t.Parallel()
	o, err := parseFlags(nil, io.Discard)
	require.NoError(t, err)
	require.Equal(t, options{Flags: service.Flags{Addr: "127.0.0.1:8090", Lease: 30 * time.Second,
		ShutdownTimeout: 15 * time.Second, LogFormat: "json", Traces: "none"}, hang: time.Minute, idempotency: true}, o)
	o, err = parseFlags([]string{"--latency", "20ms", "--fail-rate", "0.1", "--timeout-rate", "1", "--hang", "5s", "--lease", "2s", "--idempotency=false"}, io.Discard)
	require.NoError(t, err)
	require.Equal(t, 20*time.Millisecond, o.latency)
	require.Equal(t, 0.1, o.failRate)
	require.Equal(t, 1.0, o.timeoutRate)
	require.Equal(t, 5*time.Second, o.hang)
	require.Equal(t, 2*time.Second, o.Lease)
	require.False(t, o.idempotency)
	for _, bad := range [][]string{{"--fail-rate", "2"}, {"--timeout-rate", "-1"}, {"--lease", "10ms"}, {"--latency", "-1s"}, {"x"}, {"--otel-traces", "otlp"}} {
		_, err := parseFlags(bad, io.Discard)
		require.Error(t, err, "%v", bad)
	}
}

func TestParseDatabaseURL(t *testing.T) {
	t.Parallel()
	for in, want := range map[string][2]string{
		"":                    {"sqlite", "fakepsp.db"},
		"x.db":                {"sqlite", "x.db"},
		"sqlite:///tmp/x.db":  {"sqlite", "/tmp/x.db"},
		"file:x.db":           {"sqlite", "x.db"},
		"postgres://u@h/db":   {"postgres", "postgres://u@h/db"},
		"postgresql://u@h/db": {"postgres", "postgresql://u@h/db"},
	} {
		kind, target, err := parseDatabaseURL(in)
		require.NoError(t, err, in)
		require.Equal(t, want, [2]string{kind, target}, in)
	}
	for _, bad := range []string{"mysql://h/db", "sqlite:", "x.db?mode=ro"} {
		_, _, err := parseDatabaseURL(bad)
		require.Error(t, err, bad)
	}
}

func TestRunServesAndShutsDown(t *testing.T) {
	t.Parallel()
	addr, err := supervise.FreeAddr()
	require.NoError(t, err)

	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	logs, err := os.Create(filepath.Join(t.TempDir(), "log")) // safe for concurrent writes
	require.NoError(t, err)
	defer logs.Close()
	done := make(chan error, 1)
	go func() {
		done <- run(ctx, []string{"--addr", addr, "--database-url", filepath.Join(t.TempDir(), "f.db")}, logs)
	}()
	require.Eventually(t, func() bool {
		resp, err := http.Get("http://" + addr + "/healthz")
		if err != nil {
			return false
		}
		resp.Body.Close()
		return resp.StatusCode == http.StatusOK
	}, 10*time.Second, 20*time.Millisecond)

	p := &testPSP{t: t, url: "http://" + addr}
	require.Equal(t, http.StatusCreated, p.charge("acme", "run-1", "application/json", chargeBody).status)

	cancel()
	demotest.RequireReturns(t, done, 20*time.Second, "run did not return after its context was cancelled")
	b, err := os.ReadFile(logs.Name())
	require.NoError(t, err)
	out := string(b)
	require.Contains(t, out, `"msg":"charged"`)
	require.Contains(t, out, `"idempotency_key":"run-1"`)
	require.Contains(t, out, `"msg":"database closed"`)
	require.NotContains(t, out, "sk_test_")
}
