package main

import (
	"encoding/base64"
	"flag"
	"io"
	"net/http"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/idemgo/idem/cmd/internal/service"
	"github.com/idemgo/idem/seal"
)

func TestParseDatabaseURL(t *testing.T) {
	t.Parallel()
	cases := []struct{ in, kind, target string }{
		{"", "sqlite", "paymentsd.db"},
		{"payments.db", "sqlite", "payments.db"},
		{"/var/lib/paymentsd/p.db", "sqlite", "/var/lib/paymentsd/p.db"},
		{"sqlite:p.db", "sqlite", "p.db"},
		{"sqlite:///tmp/p.db", "sqlite", "/tmp/p.db"},
		{"file:p.db", "sqlite", "p.db"},
		{"file:///tmp/p.db", "sqlite", "/tmp/p.db"},
		{"postgres://u@h:5432/db?sslmode=disable", "postgres", "postgres://u@h:5432/db?sslmode=disable"},
		{"postgresql://u@h/db", "postgres", "postgresql://u@h/db"},
		{"mysql://root@h:3306/db", "mysql", "mysql://root@h:3306/db"},
		{"mariadb://root@h/db", "mysql", "mariadb://root@h/db"},
	}
	for _, tc := range cases {
		kind, target, err := parseDatabaseURL(tc.in)
		require.NoError(t, err, tc.in)
		require.Equal(t, tc.kind, kind, tc.in)
		require.Equal(t, tc.target, target, tc.in)
	}
	for _, bad := range []string{"sqlserver://h/db", "sqlite:", "file:p.db?mode=ro", "p.db#x", "p%41.db"} {
		_, _, err := parseDatabaseURL(bad)
		require.Error(t, err, bad)
	}
}

func TestParseFlags(t *testing.T) {
	t.Parallel()
	o, err := parseFlags(nil, io.Discard, nil)
	require.NoError(t, err)
	require.Equal(t, options{Flags: service.Flags{Addr: "127.0.0.1:8080", Lease: 30 * time.Second,
		ShutdownTimeout: 15 * time.Second, LogFormat: "json", Traces: "none"},
		pspLatency: 300 * time.Millisecond, pspTimeout: 5 * time.Second, writeMode: WriteInClaim, maxWait: 10 * time.Second,
		completer: true, completerGrace: 10 * time.Second, faults: o.faults}, o) // faultOptions: TestParseFaultFlags (-tags idemfaults)

	o, err = parseFlags([]string{"--addr", ":9", "--database-url", "x.db", "--psp-latency", "1s", "--lease", "5s", "--log-format", "text",
		"--psp-url", "http://127.0.0.1:8090", "--psp-timeout", "2s", "--write-mode", "separate"}, io.Discard, nil)
	require.NoError(t, err)
	require.Equal(t, ":9", o.Addr)
	require.Equal(t, "x.db", o.DatabaseURL)
	require.Equal(t, time.Second, o.pspLatency)
	require.Equal(t, 5*time.Second, o.Lease)
	require.Equal(t, "http://127.0.0.1:8090", o.pspURL)
	require.Equal(t, 2*time.Second, o.pspTimeout)
	require.Equal(t, WriteSeparate, o.writeMode)

	// The waits: --max-wait gives way to a longer --wait unless it is set.
	o, err = parseFlags([]string{"--wait", "5s"}, io.Discard, nil)
	require.NoError(t, err)
	require.Equal(t, [2]time.Duration{5 * time.Second, 10 * time.Second}, [2]time.Duration{o.wait, o.maxWait})
	o, err = parseFlags([]string{"--wait", "30s"}, io.Discard, nil)
	require.NoError(t, err)
	require.Equal(t, [2]time.Duration{30 * time.Second, 30 * time.Second}, [2]time.Duration{o.wait, o.maxWait})

	// The bound on payments in flight, per route.
	o, err = parseFlags([]string{"--max-in-flight", "200"}, io.Discard, nil)
	require.NoError(t, err)
	require.Equal(t, 200, o.maxInFlight)

	// The relay secret: the flag, else the environment.
	env := func(name string) string { return map[string]string{EnvRelaySecret: "from-env"}[name] }
	o, err = parseFlags(nil, io.Discard, env)
	require.NoError(t, err)
	require.Equal(t, "from-env", o.relaySecret)
	o, err = parseFlags([]string{"--relay-secret", "from-flag"}, io.Discard, env)
	require.NoError(t, err)
	require.Equal(t, "from-flag", o.relaySecret)

	for _, bad := range [][]string{{"--lease", "500ms"}, {"--psp-latency", "-1s"}, {"--log-format", "xml"}, {"extra"}, {"--nope"},
		{"--psp-timeout", "0s"}, {"--write-mode", "both"}, {"--psp-url", "127.0.0.1:8090"},
		{"--psp-url", "ftp://h"}, {"--psp-url", "http://h?x=1"}, {"--otel-traces", "otlp"},
		{"--wait", "-1s"}, {"--wait", "20s", "--max-wait", "5s"}, {"--max-in-flight", "-1"}} {
		_, err := parseFlags(bad, io.Discard, nil)
		require.Error(t, err, "%v", bad)
	}
}

// TestRunServesAndShutsDown runs the command as main does, on SQLite, and
// stops it by cancelling its context (as SIGINT/SIGTERM do).
func TestRunServesAndShutsDown(t *testing.T) {
	t.Parallel()
	s, stop := startRun(t, "--database-url", filepath.Join(t.TempDir(), "p.db"), "--psp-latency", "0s", "--wait", "2s", "--max-in-flight", "7")
	require.Equal(t, http.StatusCreated, s.postJSON("acme", "run-1", paymentBody).status)

	out := stop()
	require.Regexp(t, `"msg":"listening".*"write_mode":"claim","wait":"2s","max_wait":"10s","max_in_flight":7`, out, "the waits and the bound in the startup line")
	require.Contains(t, out, `"msg":"request"`)
	require.Contains(t, out, `"idempotency_key":"run-1"`)
	require.Contains(t, out, `"merchant":"acme"`)
	require.Contains(t, out, `"msg":"database closed"`)
	require.NotContains(t, out, "sk_test_", "the API key is never logged")
}

// The sealing flags. Regression: --seal-key "" (an unset variable expanded
// to nothing) started paymentsd without sealing, silently; an empty
// --key-hash-secret started it without hashing, which makes hashed records
// unfindable (their retries run again). Both are refused, naming the flag.
// --seal-replay-plain reaches idem's ReplayPlain, and only with a key.
func TestParseSealFlags(t *testing.T) {
	t.Parallel()
	key := "k1:" + base64.StdEncoding.EncodeToString(make([]byte, 32))
	env := func(name string) string { return map[string]string{EnvSealKeys: key}[name] }
	for _, bad := range []struct {
		args []string
		want string
	}{
		{[]string{"--seal-key", ""}, "-seal-key: empty: give id:base64secret"},
		{[]string{"--seal-key", "  "}, "-seal-key: empty"},
		{[]string{"--seal-key", key, "--seal-key", ""}, "-seal-key: empty"},
		{[]string{"--key-hash-secret", ""}, "--key-hash-secret is empty"},
		// The minimum the idem CLI takes too (seal.ParseHashSecret).
		{[]string{"--key-hash-secret", "c2hvcnQ"}, "--key-hash-secret: the secret is 5 bytes; it needs at least 16"},
		{[]string{"--seal-replay-plain"}, "--seal-replay-plain needs --seal-key"},
	} {
		_, err := parseFlags(bad.args, io.Discard, nil)
		require.ErrorContains(t, err, bad.want, "%q", bad.args)
	}
	o, err := parseFlags(nil, io.Discard, env)
	require.NoError(t, err)
	require.Len(t, o.sealKeys, 1, "the keys from the environment")
	require.False(t, o.replayPlain)
	o, err = parseFlags([]string{"--seal-key", key, "--seal-replay-plain"}, io.Discard, nil)
	require.NoError(t, err)
	require.True(t, o.replayPlain)
}

// --help names each flag's value in one word (the flag package takes a
// back-quoted word of the usage for it). Regression (issue 35): it printed
// "-keep-request-bytes idem inspect --request".
func TestHelpNamesEachValue(t *testing.T) {
	t.Parallel()
	var out strings.Builder
	_, err := parseFlags([]string{"-h"}, &out, nil)
	require.ErrorIs(t, err, flag.ErrHelp)
	var flags int
	for _, line := range strings.Split(out.String(), "\n") {
		if !strings.HasPrefix(line, "  -") {
			continue
		}
		flags++
		require.LessOrEqual(t, len(strings.Fields(line)), 2, "a flag and at most one word for its value: %q", line)
	}
	require.Greater(t, flags, 10, "the flags' lines:\n%s", out.String())
	require.Contains(t, out.String(), "\n  -keep-request-bytes N\n")
}

// A payment recorded by a paymentsd without sealing is refused by one with
// --seal-key (500 seal-broken, nothing charged again) and replayed by one
// with --seal-replay-plain too: the flag reaches idem.
func TestRunSealedOnly(t *testing.T) {
	t.Parallel()
	db := filepath.Join(t.TempDir(), "p.db")
	key := "k1:" + base64.StdEncoding.EncodeToString(make([]byte, 32))
	s, stop := startRun(t, "--database-url", db, "--psp-latency", "0s")
	first := s.postJSON("acme", "plain-1", paymentBody)
	require.Equal(t, http.StatusCreated, first.status)
	stop()

	s, stop = startRun(t, "--database-url", db, "--psp-latency", "0s", "--seal-key", key)
	refused := s.postJSON("acme", "plain-1", paymentBody)
	require.Equal(t, http.StatusInternalServerError, refused.status, "%s", refused.body)
	require.Contains(t, string(refused.body), "seal-broken")
	require.Equal(t, int64(1), s.balance("acme").Payments, "nothing charged again")
	out := stop()
	require.Contains(t, out, `"seal_key":"k1"`)

	s, stop = startRun(t, "--database-url", db, "--psp-latency", "0s", "--seal-key", key, "--seal-replay-plain")
	again := s.postJSON("acme", "plain-1", paymentBody)
	require.Equal(t, http.StatusCreated, again.status, "%s", again.body)
	require.Equal(t, first.body, again.body)
	require.Contains(t, stop(), `"seal_replay_plain":true`)
}

// Regression: with --key-hash-secret the request log printed the client's
// Idempotency-Key, which idem stores only as its HMAC; it prints the stored
// key now (idem inspect --key-hash-secret finds the record from either).
func TestRunLogsTheHashedKey(t *testing.T) {
	t.Parallel()
	secret := []byte("paymentsd key-hash secret, 32 b.")
	s, stop := startRun(t, "--database-url", filepath.Join(t.TempDir(), "p.db"), "--psp-latency", "0s",
		"--key-hash-secret", base64.StdEncoding.EncodeToString(secret))
	require.Equal(t, http.StatusCreated, s.postJSON("acme", "order-CLIENTKEY-1", paymentBody).status)
	out := stop()
	require.Contains(t, out, `"idempotency_key":"`+seal.HashKey(secret, "order-CLIENTKEY-1")+`"`)
	require.NotContains(t, out, "CLIENTKEY", "the client's key is never logged")
}
