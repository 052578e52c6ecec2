package idemclient_test

import (
	"context"
	"fmt"
	"io"
	"log"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"time"

	"github.com/idemgo/idem/idemclient"
)

// A POST answered 503 is sent again with the same Idempotency-Key, and the
// caller sees only the 201.
func Example() {
	var (
		mu   sync.Mutex
		keys []string
	)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		keys = append(keys, r.Header.Get("Idempotency-Key"))
		n := len(keys)
		mu.Unlock()
		if n == 1 {
			w.Header().Set("Retry-After", "1")
			w.WriteHeader(http.StatusServiceUnavailable)
			return
		}
		w.WriteHeader(http.StatusCreated)
		_, _ = fmt.Fprint(w, `{"payment":"pay_1"}`) // a write error means the client is gone
	}))
	defer srv.Close()

	tr, err := idemclient.New(idemclient.Config{
		OnRetry: func(ri idemclient.RetryInfo) {
			fmt.Printf("attempt %d: %d, retrying in %s\n", ri.Attempt, ri.Status, ri.Wait)
		},
		// Record the wait instead of taking it; leave Sleep unset in real use.
		Sleep: func(ctx context.Context, d time.Duration) error { return ctx.Err() },
	})
	if err != nil {
		log.Fatal(err)
	}
	client := &http.Client{Transport: tr}

	resp, err := client.Post(srv.URL, "application/json", strings.NewReader(`{"amount":1000}`))
	if err != nil {
		log.Fatal(err)
	}
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		log.Fatal(err)
	}
	if err := resp.Body.Close(); err != nil {
		log.Fatal(err)
	}
	fmt.Println(resp.StatusCode, string(body))
	fmt.Println("attempts:", len(keys))
	fmt.Println("same key on both:", keys[0] == keys[1] && keys[0] == idemclient.KeyFromResponse(resp))
	// Output:
	// attempt 1: 503, retrying in 1s
	// 201 {"payment":"pay_1"}
	// attempts: 2
	// same key on both: true
}

// A 422 (idem's key-reused: the same key with another body) is final: it is
// returned at once, never retried.
func Example_notRetried() {
	hits := 0
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		hits++
		w.Header().Set("Content-Type", "application/problem+json")
		w.WriteHeader(http.StatusUnprocessableEntity)
		_, _ = fmt.Fprint(w, `{"type":"https://github.com/idemgo/idem/blob/main/docs/problems.md#key-reused","status":422}`) // a write error means the client is gone
	}))
	defer srv.Close()

	tr, err := idemclient.New(idemclient.Config{})
	if err != nil {
		log.Fatal(err)
	}
	req, _ := http.NewRequest(http.MethodPost, srv.URL, strings.NewReader(`{"amount":9999}`))
	req.Header.Set("Idempotency-Key", "order-1001")
	resp, err := (&http.Client{Transport: tr}).Do(req)
	if err != nil {
		log.Fatal(err)
	}
	if err := resp.Body.Close(); err != nil {
		log.Fatal(err)
	}
	fmt.Println(resp.StatusCode, "after", hits, "attempt, key", idemclient.KeyFromResponse(resp))
	// Output:
	// 422 after 1 attempt, key order-1001
}

func ExampleParseRetryAfter() {
	now := time.Date(2026, 11, 30, 9, 0, 0, 0, time.UTC)
	for _, v := range []string{"120", "Mon, 30 Nov 2026 09:00:45 GMT", "soon"} {
		d, ok := idemclient.ParseRetryAfter(http.Header{"Retry-After": {v}}, now)
		fmt.Println(d, ok)
	}
	// Output:
	// 2m0s true
	// 45s true
	// 0s false
}

// The package documentation's client: every POST gets a key, kept on every
// retry. (Compiled, not run.)
func ExampleNew() {
	url, body := "http://127.0.0.1:8080/v1/payments", `{"amount":1000}`

	tr, err := idemclient.New(idemclient.Config{})
	if err != nil {
		log.Fatal(err)
	}
	client := &http.Client{Transport: tr}
	resp, err := client.Post(url, "application/json", strings.NewReader(body))
	if err != nil {
		log.Fatal(err)
	}
	defer resp.Body.Close()
	log.Println(idemclient.KeyFromResponse(resp), idemclient.Replayed(resp))
}
