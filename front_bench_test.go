package idem_test

import (
	"net/http"
	"strconv"
	"testing"

	"github.com/idemgo/idem"
)

// BenchmarkFront measures the HTTP front's answers on SQLite, each beside
// a bare handler in the same run (ns/op and allocs/op: compare the
// sub-benchmarks, never a threshold): a first execution, a replay, a 409
// for a key in flight and a 422 for a reused key.
func BenchmarkFront(b *testing.B) {
	const body = `{"amount":1000,"currency":"JPY","customer":"cus_42"}`
	pay := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusCreated)
		_, _ = w.Write([]byte(`{"id":"pay_1","amount":1000}`))
	})
	run := func(b *testing.B, h http.Handler, key func(i int) string, payload string, want int) {
		b.ReportAllocs()
		for i := 0; b.Loop(); i++ {
			if rec := send(h, http.MethodPost, "/v1/payments", key(i), payload); rec.Code != want {
				b.Fatalf("status %d: %s", rec.Code, rec.Body)
			}
		}
	}
	b.Run("Bare", func(b *testing.B) {
		run(b, pay, func(int) string { return "bare" }, body, http.StatusCreated)
	})
	b.Run("FirstExecution", func(b *testing.B) {
		h := newMiddleware(b, nil, idem.Options{}).Handler(pay)
		run(b, h, func(i int) string { return "first-" + strconv.Itoa(i) }, body, http.StatusCreated)
	})
	b.Run("Replay", func(b *testing.B) {
		h := newMiddleware(b, nil, idem.Options{}).Handler(pay)
		send(h, http.MethodPost, "/v1/payments", "replay", body)
		run(b, h, func(int) string { return "replay" }, body, http.StatusCreated)
	})
	b.Run("KeyReused", func(b *testing.B) {
		h := newMiddleware(b, nil, idem.Options{}).Handler(pay)
		send(h, http.MethodPost, "/v1/payments", "reused", body)
		run(b, h, func(int) string { return "reused" }, `{"amount":2000}`, http.StatusUnprocessableEntity)
	})
	b.Run("InFlight", func(b *testing.B) {
		started, release := make(chan struct{}), make(chan struct{})
		h := newMiddleware(b, nil, idem.Options{}).Handler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			if r.Header.Get(idem.HeaderKey) == "busy" {
				close(started)
				<-release
			}
			pay(w, r)
		}))
		done := make(chan struct{})
		go func() { defer close(done); send(h, http.MethodPost, "/v1/payments", "busy", body) }()
		<-started
		run(b, h, func(int) string { return "busy" }, body, http.StatusConflict)
		close(release)
		<-done
	})
}
