package idem_test

import (
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/idemgo/idem"
)

func TestDeriveKey(t *testing.T) {
	t.Parallel()
	created := time.Date(2026, 11, 30, 9, 0, 0, 123456000, time.UTC)
	k := idem.DeriveKey(nil, "acme", "order-1", created, "charge")
	require.Regexp(t, `^idr1_[0-9a-f]{64}$`, k)
	require.Equal(t, k, idem.DeriveKey(nil, "acme", "order-1", created, "charge"), "stable")
	require.Equal(t, k, idem.DeriveKey(nil, "acme", "order-1", created.In(time.FixedZone("JST", 9*3600)), "charge"),
		"the same instant in another zone")
	require.NotContains(t, k, "order-1")
	for _, other := range []string{
		idem.DeriveKey(nil, "globex", "order-1", created, "charge"),
		idem.DeriveKey(nil, "acme", "order-2", created, "charge"),
		idem.DeriveKey(nil, "acme", "order-1", created, "refund"),
		idem.DeriveKey(nil, "acme", "order-1", created.Add(time.Microsecond), "charge"), // another life of the key
		idem.DeriveKey([]byte("secret"), "acme", "order-1", created, "charge"),
		idem.DeriveKey(nil, "acmeo", "rder-1", created, "charge"), // parts are length-prefixed
	} {
		require.NotEqual(t, k, other)
	}
}

func TestRelayTransport(t *testing.T) {
	t.Parallel()
	var (
		mu   sync.Mutex
		seen []string
	)
	provider := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		seen = append(seen, r.Header.Get(idem.HeaderKey))
		mu.Unlock()
		_, _ = io.WriteString(w, "ok")
	}))
	defer provider.Close()
	client := &http.Client{Transport: &idem.RelayTransport{}}

	store := openSQLite(t)
	mw := newMiddleware(t, store, idem.Options{
		Engine: idem.EngineOptions{RelaySecret: []byte("s3cret")},
		Scope:  func(r *http.Request) (string, error) { return r.Header.Get("X-Merchant"), nil },
	})
	runs := 0
	srv := httptest.NewServer(mw.Handler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		runs++
		req, _ := http.NewRequestWithContext(r.Context(), "POST", provider.URL+"/v1/charges", strings.NewReader("x"))
		req.Header.Set(idem.HeaderKey, r.Header.Get(idem.HeaderKey)) // a careless handler forwards the raw key
		resp, err := client.Do(req)
		if err == nil {
			err = resp.Body.Close()
		}
		if err != nil {
			http.Error(w, err.Error(), http.StatusBadGateway)
			return
		}
		if runs == 1 {
			w.WriteHeader(http.StatusBadGateway) // FAILED: the retry runs again
			return
		}
		w.WriteHeader(http.StatusCreated)
	})))
	defer srv.Close()
	send := func(merchant, key string) int {
		req, _ := http.NewRequest("POST", srv.URL+"/v1/payments", strings.NewReader(`{}`))
		req.Header.Set("X-Merchant", merchant)
		req.Header.Set(idem.HeaderKey, key)
		resp, err := http.DefaultClient.Do(req)
		require.NoError(t, err)
		require.NoError(t, resp.Body.Close())
		return resp.StatusCode
	}
	require.Equal(t, 502, send("acme", "order-1"))
	require.Equal(t, 201, send("acme", "order-1"))
	require.Equal(t, 201, send("globex", "order-1"))
	require.Len(t, seen, 3)
	require.Equal(t, seen[0], seen[1], "a re-execution relays the same key")
	require.NotEqual(t, seen[0], seen[2], "another scope relays another key")
	step := "POST " + strings.TrimPrefix(provider.URL, "http://") + "/v1/charges"
	require.Equal(t, idem.DeriveKey([]byte("s3cret"), "acme", "order-1", record(t, store, "acme", "order-1").CreatedAt, step), seen[0])
	for _, k := range seen {
		require.NotEqual(t, "order-1", k, "the raw client key never leaves")
	}

	// Outside a protected execution the request passes through as it is.
	req, _ := http.NewRequest("POST", provider.URL, nil)
	req.Header.Set(idem.HeaderKey, "own-key")
	resp, err := client.Do(req)
	require.NoError(t, err)
	require.NoError(t, resp.Body.Close())
	require.Equal(t, "own-key", seen[3])
	_, err = idem.RelayKey(t.Context(), "charge")
	require.ErrorIs(t, err, idem.ErrNoExecution)
}
