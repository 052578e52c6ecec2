package idemdrivertest

import (
	"context"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"testing"

	"github.com/idemgo/idem"
	"github.com/idemgo/idem/idemdriver"
)

// Benchmark runs the per-request benchmarks of CONTRACT section 10 on the
// drivers newDriver makes (migrated, on a fresh database):
//
//   - ClaimComplete: a new key claimed and completed (a first execution);
//   - Replay: a claim on a completed key (what a retry costs);
//   - InFlight: a claim on a key under a live lease (a 409);
//   - HTTPFirstExecution and HTTPReplay: the same through the middleware,
//     with a small JSON body, fingerprint and capture included.
func Benchmark(b *testing.B, newDriver func(testing.TB) idemdriver.Driver) {
	ctx := context.Background()
	resp := okResponse(`{"id":"pay_1","amount":1000,"currency":"JPY"}`)
	mustClaim := func(b *testing.B, d idemdriver.Driver, p idemdriver.ClaimParams) idemdriver.Record {
		res, err := d.Claim(ctx, p)
		if err != nil || !res.Claimed {
			b.Fatalf("claim: claimed=%v err=%v", res.Claimed, err)
		}
		return res.Record
	}

	b.Run("ClaimComplete", func(b *testing.B) {
		d := newDriver(b)
		b.ResetTimer()
		for i := 0; i < b.N; i++ {
			rec := mustClaim(b, d, params("acct", "new-"+strconv.Itoa(i), "body"))
			ok, err := d.Complete(ctx, idemdriver.CompleteParams{FenceParams: fence(rec), Response: resp})
			if err != nil || !ok {
				b.Fatalf("complete: ok=%v err=%v", ok, err)
			}
		}
	})

	b.Run("Replay", func(b *testing.B) {
		d := newDriver(b)
		rec := mustClaim(b, d, params("acct", "done", "body"))
		if ok, err := d.Complete(ctx, idemdriver.CompleteParams{FenceParams: fence(rec), Response: resp}); err != nil || !ok {
			b.Fatalf("complete: ok=%v err=%v", ok, err)
		}
		b.ResetTimer()
		for i := 0; i < b.N; i++ {
			res, err := d.Claim(ctx, params("acct", "done", "body"))
			if err != nil || res.Claimed || res.Record.Response == nil {
				b.Fatalf("replay: %+v %v", res, err)
			}
		}
	})

	b.Run("InFlight", func(b *testing.B) {
		d := newDriver(b)
		mustClaim(b, d, params("acct", "busy", "body"))
		b.ResetTimer()
		for i := 0; i < b.N; i++ {
			res, err := d.Claim(ctx, params("acct", "busy", "body"))
			if err != nil || res.Claimed || res.Record.LeaseLeft <= 0 {
				b.Fatalf("in flight: %+v %v", res, err)
			}
		}
	})

	httpBench := func(b *testing.B, key func(i int) string, wantStatus int) {
		m, err := idem.New(idem.Config{Scope: idem.SingleTenant, Store: newDriver(b)})
		if err != nil {
			b.Fatal(err)
		}
		h := m.Handler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			w.Header().Set("Content-Type", "application/json")
			w.WriteHeader(http.StatusCreated)
			_, _ = w.Write([]byte(`{"id":"pay_1","amount":1000,"currency":"JPY"}`))
		}))
		body := `{"amount":1000,"currency":"JPY","customer":"cus_42","description":"Order #1001"}`
		b.ReportAllocs()
		b.ResetTimer()
		for i := 0; i < b.N; i++ {
			req := httptest.NewRequest(http.MethodPost, "/v1/payments", strings.NewReader(body))
			req.Header.Set("Content-Type", "application/json")
			req.Header.Set(idem.HeaderKey, key(i))
			rec := httptest.NewRecorder()
			h.ServeHTTP(rec, req)
			if rec.Code != wantStatus {
				b.Fatalf("status %d: %s", rec.Code, rec.Body)
			}
		}
	}
	b.Run("HTTPFirstExecution", func(b *testing.B) {
		httpBench(b, func(i int) string { return "http-" + strconv.Itoa(i) }, http.StatusCreated)
	})
	b.Run("HTTPReplay", func(b *testing.B) {
		httpBench(b, func(int) string { return "http-replay" }, http.StatusCreated)
	})
}
