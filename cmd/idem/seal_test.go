package main

import (
	"bytes"
	"encoding/base64"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/idemgo/idem"
	"github.com/idemgo/idem/internal/dbtest"
	"github.com/idemgo/idem/seal"
)

// inspect --request on a sealed store whose keys are hashed: with the
// sealing key and the key-hash secret, the plain key finds the record and
// shows its response and the kept request (cut at the cap); without the
// key it says which key the record needs and shows nothing sealed; without
// the secret the plain key finds nothing.
func TestInspectSealedRequest(t *testing.T) {
	t.Parallel()
	for _, b := range backends {
		t.Run(b.name, func(t *testing.T) {
			t.Parallel()
			url, d := b.setup(t, b.partitioned)
			c := cli{t, url}
			c.ok(b.migrateUp()...)
			secret, hashSecret := bytes.Repeat([]byte{7}, 32), []byte("the key-hash secret")
			mw, err := idem.New(idem.Config{Scope: func(*http.Request) (string, error) { return "acct", nil },
				EngineConfig: idem.EngineConfig{Store: d, SealKeys: []seal.Key{{ID: "k2025", Secret: secret}},
					KeyHashSecret: hashSecret, KeepRequestBytes: 16}})
			require.NoError(t, err)
			h := mw.Handler(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
				w.Header().Set("Location", "/v1/payments/pay_SECRET")
				w.WriteHeader(http.StatusCreated)
				_, _ = w.Write([]byte(`{"id":"pay_SECRET"}`))
			}))
			for _, key := range []string{"order-1", "order-2"} {
				body := `{"amount":1000}`
				if key == "order-2" {
					body = `{"amount":1000,"card":"4242424242424242"}`
				}
				r := httptest.NewRequest(http.MethodPost, "/v1/payments?expand=customer", strings.NewReader(body))
				r.Header.Set("Content-Type", "application/json")
				r.Header.Set(idem.HeaderKey, key)
				w := httptest.NewRecorder()
				h.ServeHTTP(w, r)
				require.Equal(t, http.StatusCreated, w.Code, w.Body.String())
			}
			keyFlag := "--seal-key=k2025:" + base64.StdEncoding.EncodeToString(secret)
			hashFlag := "--key-hash-secret=" + base64.RawURLEncoding.EncodeToString(hashSecret)

			out := c.ok(keyFlag, hashFlag, "inspect", "--scope", "acct", "--key", "order-1", "--request", "--body")
			require.Contains(t, out, seal.HashKey(hashSecret, "order-1"), "the record's stored key")
			require.Contains(t, out, "yes, key k2025 (opened)")
			require.Contains(t, out, "Location: /v1/payments/pay_SECRET")
			require.Contains(t, out, `{"id":"pay_SECRET"}`)
			require.Contains(t, out, "request (15 bytes):\n  content-type: application/json\n  query: expand=customer\n  body: {\"amount\":1000}\n")

			out = c.ok(keyFlag, hashFlag, "inspect", "--key", "order-2", "--request")
			require.Contains(t, out, "request (41 bytes, its first 16 kept):")
			require.Contains(t, out, `body: {"amount":1000,"`+"\n")
			require.NotContains(t, out, "4242")

			rec := c.json(keyFlag, hashFlag, "inspect", "--scope", "acct", "--key", "order-1", "--request")
			require.Equal(t, map[string]any{"content_type": "application/json", "query": "expand=customer", "size": 15.0,
				"truncated": false, "body": `{"amount":1000}`, "body_base64": base64.StdEncoding.EncodeToString([]byte(`{"amount":1000}`))}, rec["request"])

			out = c.ok(hashFlag, "inspect", "--scope", "acct", "--key", "order-1", "--request", "--body")
			require.Contains(t, out, "yes, key k2025: not opened, give --seal-key k2025:...")
			require.Contains(t, out, "the kept request is sealed: give --seal-key to show it")
			require.NotContains(t, out, "pay_SECRET")
			require.NotContains(t, out, "amount")

			_, errOut, code := c.run(keyFlag, "inspect", "--scope", "acct", "--key", "order-1")
			require.Equal(t, 1, code)
			require.Contains(t, errOut, `no record for scope "acct" and key "order-1"`, "the plain key is not stored")
			// Regression: that was all it said; it names the flag now.
			const hint = "the table stores its keys hashed (h1_...): give --key-hash-secret"
			require.Contains(t, errOut, hint)
			_, errOut, code = c.run("inspect", "--key", "order-1")
			require.Equal(t, 1, code)
			require.Contains(t, errOut, `no record for key "order-1" in any scope`)
			require.Contains(t, errOut, hint, "searching every scope too")
			require.Contains(t, c.ok("inspect", "--key", seal.HashKey(hashSecret, "order-1")), "state ", "the stored key, as the log shows it, needs no secret")
			_, errOut, _ = c.run(hashFlag, "inspect", "--key", "order-3")
			require.NotContains(t, errOut, "hashed", "with the secret, no hint")

			_, errOut, code = c.run("--seal-key", "k2025:c2hvcnQ", "inspect", "--key", "order-1")
			require.Equal(t, 2, code)
			require.Contains(t, errOut, "Secret is 5 bytes; AES takes 16, 24 or 32")
			require.NotContains(t, errOut, "c2hvcnQ", "the secret is never quoted")
		})
	}
}

// Regression: --seal-key "" (an unset variable expanded to nothing) opened
// nothing and said nothing, as if the store were not sealed; an empty
// --key-hash-secret fell back to no hashing. Both are usage errors now.
func TestEmptySealFlagsRefused(t *testing.T) {
	t.Parallel()
	c := cli{t, dbtest.SQLitePath(t)}
	for _, args := range [][]string{{"--seal-key", ""}, {"--seal-key", " "}, {"--seal-key=k:" + base64.StdEncoding.EncodeToString(make([]byte, 16)), "--seal-key", ""}} {
		_, errOut, code := c.run(append(args, "inspect", "--key", "k")...)
		require.Equal(t, 2, code, "%q: %s", args, errOut)
		require.Contains(t, errOut, "--seal-key is empty", "%q", args)
	}
	_, errOut, code := c.run("--key-hash-secret", "", "inspect", "--key", "k")
	require.Equal(t, 2, code, errOut)
	require.Contains(t, errOut, "--key-hash-secret is empty")
}

// A plain SUCCEEDED record inspected with --seal-key: inspect says that a
// server holding those keys refuses it (sealing's downgrade, docs/sealing.md).
func TestInspectPlainRecordUnderSealKeys(t *testing.T) {
	t.Parallel()
	url, d := sqliteBackend(t, false)
	c := cli{t, url}
	c.ok("migrate", "up")
	mw, err := idem.New(idem.Config{Scope: idem.SingleTenant, EngineConfig: idem.EngineConfig{Store: d}})
	require.NoError(t, err)
	h := mw.Handler(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { w.WriteHeader(http.StatusCreated) }))
	r := httptest.NewRequest(http.MethodPost, "/v1/payments", strings.NewReader(`{}`))
	r.Header.Set(idem.HeaderKey, "plain-1")
	h.ServeHTTP(httptest.NewRecorder(), r)
	require.Contains(t, c.ok("inspect", "--key", "plain-1"), "no (stored in plain)\n")
	keyFlag := "--seal-key=k2025:" + base64.StdEncoding.EncodeToString(bytes.Repeat([]byte{7}, 32))
	out := c.ok(keyFlag, "inspect", "--key", "plain-1")
	require.Contains(t, out, "no (stored in plain): a server with these seal keys answers 500 seal-broken")
	for _, scope := range [][]string{nil, {"--scope", idem.SingleTenantScope}} {
		_, errOut, code := c.run(append([]string{"inspect", "--key", "nope"}, scope...)...)
		require.Equal(t, 1, code)
		require.Contains(t, errOut, "no record")
		require.NotContains(t, errOut, "hashed", "plain keys: no hint")
	}
}
