package main

import (
	"bytes"
	"io"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

func TestParseFlagsDefaults(t *testing.T) {
	t.Parallel()
	o, err := parseFlags(nil, io.Discard)
	require.NoError(t, err)
	require.Equal(t, 1000, o.payments)
	require.Equal(t, 4, o.duplicates)
	require.Equal(t, 50, o.merchants, "one per 20 payments")
	require.Equal(t, 1, o.servers)
	require.Equal(t, 3*time.Second, o.lease)
	require.Equal(t, time.Second, o.maxRetryAfter)
	require.False(t, o.chaos)
	require.Empty(t, o.urls)
	require.Empty(t, o.paymentsdArgs)

	o, err = parseFlags([]string{"--payments", "30"}, io.Discard)
	require.NoError(t, err)
	require.Equal(t, 4, o.merchants, "at least 4")
	o, err = parseFlags([]string{"--payments", "2"}, io.Discard)
	require.NoError(t, err)
	require.Equal(t, 2, o.merchants, "no more merchants than payments")
}

func TestParseFlagsPassThrough(t *testing.T) {
	t.Parallel()
	o, err := parseFlags([]string{"--servers", "3", "--chaos", "--psp-url", "http://127.0.0.1:8090/", "--",
		"--crash-after-charge", "0.05", "--psp-latency", "50ms"}, io.Discard)
	require.NoError(t, err)
	require.Equal(t, 3, o.servers)
	require.True(t, o.chaos)
	require.Equal(t, "http://127.0.0.1:8090", o.pspURL)
	require.Equal(t, []string{"--crash-after-charge", "0.05", "--psp-latency", "50ms"}, o.paymentsdArgs)

	_, err = parseFlags([]string{"--servers", "3", "stray"}, io.Discard)
	require.ErrorContains(t, err, "after --")
}

func TestParseFlagsURLs(t *testing.T) {
	t.Parallel()
	o, err := parseFlags([]string{"--url", "http://127.0.0.1:8080/,http://127.0.0.1:8081", "--url", "http://[::1]:8082"}, io.Discard)
	require.NoError(t, err)
	require.Equal(t, []string{"http://127.0.0.1:8080", "http://127.0.0.1:8081", "http://[::1]:8082"}, o.urls)

	for _, bad := range [][]string{
		{"--url", "127.0.0.1:8080"},
		{"--url", "http://127.0.0.1:8080/v1"},
		{"--url", "http://127.0.0.1:8080", "--chaos"},
		{"--url", "http://127.0.0.1:8080", "--", "--psp-latency", "1s"},
		{"--url", "http://127.0.0.1:8080", "--naive"},
		{"--redis-url", "redis://127.0.0.1:6379/0"},
		{"--payments", "0"},
		{"--duplicates", "0"},
		{"--timeout-rate", "0.7", "--cancel-rate", "0.5"},
		{"--max-retry-after", "0s"},
		{"--lease", "500ms"},
		{"--psp-url", "127.0.0.1:8090"},
		{"--burst", "--chaos"}, // without --psp-url
		{"--burst", "--chaos", "--psp-url", "http://127.0.0.1:8090", "--naive"},
	} {
		_, err := parseFlags(bad, io.Discard)
		require.Error(t, err, "%q", bad)
	}
}

func TestRunUsageErrors(t *testing.T) {
	t.Parallel()
	require.Equal(t, exitError, run(t.Context(), []string{"--payments", "-1"}, io.Discard, io.Discard))
	require.Equal(t, exitOK, run(t.Context(), []string{"--help"}, io.Discard, io.Discard))
}

// A --psp-url where no provider answers fails before the storm, not after
// it (regression: the storm ran to its --deadline, 10 minutes by default,
// and only then failed to read the provider's stats).
func TestUnreachableProviderFailsFirst(t *testing.T) {
	t.Parallel()
	var stderr bytes.Buffer
	code := run(t.Context(), []string{"--url", "http://127.0.0.1:1", "--psp-url", "http://127.0.0.1:1", "--progress=false"}, io.Discard, &stderr)
	require.Equal(t, exitError, code)
	require.Contains(t, stderr.String(), "the provider does not answer GET /v1/charges/stats")
}
