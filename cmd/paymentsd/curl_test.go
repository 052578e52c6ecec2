package main

import (
	"bytes"
	"os"
	"os/exec"
	"regexp"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// curlBinary returns the curl on PATH; without one the test skips, or
// fails under CI.
func curlBinary(t *testing.T) string {
	t.Helper()
	p, err := exec.LookPath("curl")
	if err == nil {
		return p
	}
	if os.Getenv("CI") != "" {
		t.Fatal("no curl on PATH (apt-get install curl), and CI is set")
	}
	t.Skip("no curl on PATH: skipping")
	return ""
}

// curlPost runs curl with args for the POST /v1/payments of paymentBody
// with key, and returns its output and its exit error (-i: the status line
// and headers, then the body).
func curlPost(t *testing.T, s *inFlightServer, key string, args ...string) (string, error) {
	t.Helper()
	args = append(args, "-sS", "-i", "-X", "POST", s.url+"/v1/payments",
		"-H", "Authorization: "+auth("acme"), "-H", "Idempotency-Key: "+key,
		"-H", "Content-Type: application/json", "--data-binary", paymentBody)
	var out bytes.Buffer
	cmd := exec.Command(curlBinary(t), args...)
	cmd.Stdout, cmd.Stderr = &out, &out
	err := cmd.Run()
	return out.String(), err
}

// statusLines lists the HTTP status codes in curl -i output, one per
// attempt.
func statusLines(out string) []string {
	var codes []string
	for _, m := range regexp.MustCompile(`(?m)^HTTP/[0-9.]+ ([0-9]{3})`).FindAllStringSubmatch(out, -1) {
		codes = append(codes, m[1])
	}
	return codes
}

// TestCurlRetryAllErrors: curl's --retry alone does not retry a 409 (it is
// no "transient" error to curl), so a duplicate sent while its key is in
// flight ends at the 409; with --fail-with-body --retry-all-errors it
// waits (its own doubling delay: curl reads no Retry-After on a 409) and
// gets the replay,
// with the same key: one charge (docs/clients.md).
func TestCurlRetryAllErrors(t *testing.T) {
	t.Parallel()
	s := startInFlight(t, "curl-1")

	out, err := curlPost(t, s, "curl-1", "--retry", "5")
	require.NoError(t, err, out)
	assert.Equal(t, []string{"409"}, statusLines(out), out)

	done := make(chan string, 1)
	go func() {
		out, err := curlPost(t, s, "curl-1", "--fail-with-body", "--retry", "10", "--retry-all-errors", "--retry-max-time", "60")
		if err != nil {
			out += "\ncurl: " + err.Error()
		}
		done <- out
	}()
	require.Eventually(t, func() bool { return s.conflicts.Load() >= 2 }, 30*time.Second, 10*time.Millisecond,
		"curl did not retry the 409")
	close(s.provider.gate)
	first := <-s.first
	require.Equal(t, 201, first.status, "body: %s", first.body)
	out = <-done
	codes := statusLines(out)
	require.GreaterOrEqual(t, len(codes), 2, out)
	assert.Equal(t, "201", codes[len(codes)-1], out)
	assert.Regexp(t, `(?mi)^Idempotent-Replayed: true\r?$`, out)
	assert.Contains(t, out, string(first.body))
	assert.Equal(t, 1, s.provider.Charges())
}
