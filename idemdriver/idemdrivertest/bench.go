package idemdrivertest

import (
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

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
//     with a small JSON body, fingerprint and capture included;
//   - InFlight10k: with 10,000 other records PROCESSING under live leases,
//     a Heartbeat, Complete, Fail and Release of one execution, and a Claim
//     of a new key: each should cost what it costs on an idle table (a
//     primary-key lookup), not grow with the records in flight.
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
		m, err := idem.NewMiddleware(newDriver(b), idem.Options{Scope: idem.SingleTenant})
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

	// InFlight0 is InFlight10k on a table with no other record: the
	// figures InFlight10k's must match (cost flat with the records in
	// flight).
	for _, n := range []int{0, inFlightRecords} {
		name := "InFlight0"
		if n > 0 {
			name = "InFlight10k"
		}
		b.Run(name, func(b *testing.B) { inFlight(b, newDriver(b), n, resp, mustClaim) })
	}
}

// inFlight measures the fenced writes and the claim of one execution with
// n other records PROCESSING under live leases; Claim also reports its
// p99 latency (ns).
func inFlight(b *testing.B, d idemdriver.Driver, n int, resp idemdriver.Response,
	mustClaim func(*testing.B, idemdriver.Driver, idemdriver.ClaimParams) idemdriver.Record) {
	ctx := context.Background()
	{
		fill(b, d, n)
		// claimN claims n new keys, untimed, for the fenced writes to finish.
		claimN := func(b *testing.B, prefix string) []idemdriver.Record {
			b.StopTimer()
			defer b.StartTimer()
			recs := make([]idemdriver.Record, b.N)
			for i := range recs {
				recs[i] = mustClaim(b, d, params("acct", prefix+strconv.Itoa(i), "body"))
			}
			return recs
		}
		fenced := func(name string, write func(rec idemdriver.Record) (bool, error)) {
			b.Run(name, func(b *testing.B) {
				recs := claimN(b, fmt.Sprintf("%s-%d-", name, b.N))
				b.ReportAllocs()
				for i := 0; i < b.N; i++ {
					if ok, err := write(recs[i]); err != nil || !ok {
						b.Fatalf("%s: ok=%v err=%v", name, ok, err)
					}
				}
			})
		}
		fenced("Heartbeat", func(rec idemdriver.Record) (bool, error) { return d.Heartbeat(ctx, fence(rec)) })
		fenced("Complete", func(rec idemdriver.Record) (bool, error) {
			return d.Complete(ctx, idemdriver.CompleteParams{FenceParams: fence(rec), Response: resp})
		})
		fenced("Fail", func(rec idemdriver.Record) (bool, error) { return d.Fail(ctx, fence(rec)) })
		fenced("Release", func(rec idemdriver.Record) (bool, error) { return d.Release(ctx, fence(rec)) })
		b.Run("Claim", func(b *testing.B) {
			b.ReportAllocs()
			took := make([]time.Duration, b.N)
			for i := 0; i < b.N; i++ {
				start := time.Now()
				mustClaim(b, d, params("acct", fmt.Sprintf("claim-%d-%d", b.N, i), "body"))
				took[i] = time.Since(start)
			}
			slices.Sort(took)
			b.ReportMetric(float64(took[(len(took)*99)/100]), "p99-ns")
		})
	}
}

// inFlightRecords is how many PROCESSING records InFlight10k keeps.
const inFlightRecords = 10_000

// fill claims n records (PROCESSING, under live leases) with a few
// concurrent workers.
func fill(b *testing.B, d idemdriver.Driver, n int) {
	b.Helper()
	const workers = 8
	var (
		wg   sync.WaitGroup
		next atomic.Int64
		errs = make(chan error, workers)
	)
	for range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := next.Add(1); i <= int64(n); i = next.Add(1) {
				res, err := d.Claim(context.Background(), params("acct", "inflight-"+strconv.FormatInt(i, 10), "body"))
				if err == nil && !res.Claimed {
					err = fmt.Errorf("inflight-%d not claimed", i)
				}
				if err != nil {
					errs <- err
					return
				}
			}
		}()
	}
	wg.Wait()
	close(errs)
	if err := <-errs; err != nil {
		b.Fatal(err)
	}
}
