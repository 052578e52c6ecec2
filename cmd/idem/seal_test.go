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
			mw, err := idem.NewMiddleware(d, idem.Options{
				Scope:  func(*http.Request) (string, error) { return "acct", nil },
				Engine: idem.EngineOptions{Sealing: idem.SealingOptions{Keys: []seal.Key{{ID: "k2025", Secret: secret}}, KeyHashSecret: hashSecret, KeepRequestBytes: 16}},
			})
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
			// With a secret: a key not found may be a key never sent, or
			// the wrong secret; it says so (regression: it said nothing).
			const wrongSecret = "is not the server's KeyHashSecret"
			_, errOut, code = c.run(hashFlag, "inspect", "--key", "order-3")
			require.Equal(t, 1, code)
			require.Contains(t, errOut, `that is the key "order-3" hashed with --key-hash-secret: if a client sent it`)
			require.Contains(t, errOut, wrongSecret)
			otherSecret := "--key-hash-secret=" + base64.StdEncoding.EncodeToString([]byte("another secret, 26 bytes!!"))
			for _, scope := range [][]string{nil, {"--scope", "acct"}} {
				_, errOut, code = c.run(append([]string{otherSecret, "inspect", "--key", "order-1"}, scope...)...)
				require.Equal(t, 1, code)
				require.Contains(t, errOut, wrongSecret, "a wrong secret, %q", scope)
			}

			_, errOut, code = c.run("--seal-key", "k2025:c2hvcnQ", "inspect", "--key", "order-1")
			require.Equal(t, 2, code)
			require.Contains(t, errOut, "Secret is 5 bytes; AES takes 16, 24 or 32")
			require.NotContains(t, errOut, "c2hvcnQ", "the secret is never quoted")
			// Regression: a 5-byte --key-hash-secret, which idem.New and
			// paymentsd refuse, was taken (and found nothing).
			_, errOut, code = c.run("--key-hash-secret", "c2hvcnQ", "inspect", "--key", "order-1")
			require.Equal(t, 2, code)
			require.Contains(t, errOut, "--key-hash-secret: the secret is 5 bytes; it needs at least 16")
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
	c := oneRecord(t, idem.EngineOptions{}, "plain-1")
	out := c.ok("inspect", "--key", "plain-1")
	require.Contains(t, out, "no (stored in plain)\n")
	require.Contains(t, out, "replay of the stored 201 response")
	keyFlag := "--seal-key=k2025:" + base64.StdEncoding.EncodeToString(bytes.Repeat([]byte{7}, 32))
	out = c.ok(keyFlag, "inspect", "--key", "plain-1")
	require.Regexp(t, `next request\s+500 seal-broken from a server with these seal keys, which takes sealed records only: the 201 response is stored plain`, out)
	require.Contains(t, out, "no (stored in plain, where these seal keys expect a sealed record)")
	require.NotContains(t, out, "replay of the stored", "one answer: the 500")
	require.Equal(t, 1, strings.Count(out, "seal-broken"), out)
	for _, scope := range [][]string{nil, {"--scope", idem.SingleTenantScope}} {
		_, errOut, code := c.run(append([]string{"inspect", "--key", "nope"}, scope...)...)
		require.Equal(t, 1, code)
		require.Contains(t, errOut, "no record")
		require.NotContains(t, errOut, "hashed", "plain keys: no hint")

		// A key-hash secret on a table of plain keys: the hint says to
		// leave it out.
		hashFlag := "--key-hash-secret=" + base64.StdEncoding.EncodeToString([]byte("the key-hash secret"))
		_, errOut, code = c.run(append([]string{hashFlag, "inspect", "--key", "plain-1"}, scope...)...)
		require.Equal(t, 1, code)
		require.Contains(t, errOut, `the key "plain-1" is stored as sent, not hashed`)
		require.Contains(t, errOut, "leave out --key-hash-secret")
		_, errOut, code = c.run(append([]string{hashFlag, "inspect", "--key", "nope"}, scope...)...)
		require.Equal(t, 1, code)
		require.Contains(t, errOut, "the table holds no hashed key (h1_...): its server does not hash keys; leave out --key-hash-secret")
	}
}

// A sealed record inspect cannot open says one thing about its next
// request. Regression (issue 35): under a seal key whose secret does not
// authenticate it, inspect said "next request: replay of the stored 201"
// and, on its sealed line, "the server answers 500 seal-broken".
func TestInspectSealedRecordItCannotOpen(t *testing.T) {
	t.Parallel()
	c := oneRecord(t, idem.EngineOptions{Sealing: idem.SealingOptions{Keys: []seal.Key{{ID: "k2025", Secret: bytes.Repeat([]byte{7}, 32)}}}}, "sealed-1")

	otherSecret := "--seal-key=k2025:" + base64.StdEncoding.EncodeToString(bytes.Repeat([]byte{8}, 32))
	out := c.ok(otherSecret, "inspect", "--key", "sealed-1")
	require.Regexp(t, `next request\s+500 seal-broken from a server with these seal keys: the stored 201 response does not authenticate under seal key k2025\n`, out)
	require.Regexp(t, `sealed\s+yes, key k2025: NOT AUTHENTIC \(`, out)
	require.NotContains(t, out, "replay", "one answer: the 500")
	rec := c.json(otherSecret, "inspect", "--key", "sealed-1")
	require.Contains(t, rec["next_request"], "500 seal-broken")

	out = c.ok("inspect", "--key", "sealed-1") // no key: what a server gets depends on the keys it holds
	require.Contains(t, out, "replay of the stored 201 response from a server holding seal key k2025 (Idempotent-Replayed: true); "+
		"500 seal-key-missing from one without it")
	require.Contains(t, out, "yes, key k2025: not opened, give --seal-key k2025:...")
	out = c.ok("--seal-key=k2025:"+base64.StdEncoding.EncodeToString(bytes.Repeat([]byte{7}, 32)), "inspect", "--key", "sealed-1")
	require.Contains(t, out, "replay of the stored 201 response (Idempotent-Replayed: true)\n", "the server's own key")
}

// oneRecord returns a cli on a new SQLite store that holds one SUCCEEDED
// record, key's 201 to a POST, written by an engine of ec on that store.
func oneRecord(t *testing.T, ec idem.EngineOptions, key string) cli {
	t.Helper()
	url, d := sqliteBackend(t, false)
	c := cli{t, url}
	c.ok("migrate", "up")
	mw, err := idem.NewMiddleware(d, idem.Options{Scope: idem.SingleTenant, Engine: ec})
	require.NoError(t, err)
	h := mw.Handler(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { w.WriteHeader(http.StatusCreated) }))
	r := httptest.NewRequest(http.MethodPost, "/v1/payments", strings.NewReader(`{}`))
	r.Header.Set(idem.HeaderKey, key)
	w := httptest.NewRecorder()
	h.ServeHTTP(w, r)
	require.Equal(t, http.StatusCreated, w.Code)
	return c
}
