package main

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/riverqueue/river"

	"github.com/idemgo/idem"
	"github.com/idemgo/idem/internal/dbtest"
)

// notifyCounter counts the statements that call pg_notify (River's insert
// notification), as a pgx tracer.
type notifyCounter struct{ n atomic.Int64 }

func (c *notifyCounter) TraceQueryStart(ctx context.Context, _ *pgx.Conn, d pgx.TraceQueryStartData) context.Context {
	if strings.Contains(d.SQL, "pg_notify(") {
		c.n.Add(1)
	}
	return ctx
}

func (*notifyCounter) TraceQueryEnd(context.Context, *pgx.Conn, pgx.TraceQueryEndData) {}

// benchKeys numbers the benchmark's keys: each request is a first
// execution, in every run of -count.
var benchKeys atomic.Int64

// BenchmarkPayment measures POST /v1/payments with a new key each time,
// 16 at once (8 per GOMAXPROCS on 2 cores), through the example's handler
// over loopback HTTP, in an API process's configurations of River (an
// insert-only client):
//
//   - payment-only: the payment alone, no job (the floor);
//   - default: River's defaults, an insert notification at most once per
//     FetchCooldown (100 ms) per queue;
//   - poll-only: PollOnly, which stops LISTEN, not the inserts' NOTIFY;
//   - notify-each: FetchCooldown 1 ms, about one NOTIFY per insert, the
//     price of the serialised commits unbounded;
//   - no-notify: FetchCooldown and FetchPollInterval 1 h on the inserting
//     client, so its inserts notify once an hour (workers in other
//     processes find the jobs by polling, FetchPollInterval there).
//
// notifies/op counts the pg_notify statements sent.
//
//	go test -run '^$' -bench BenchmarkPayment -benchtime 2000x .
func BenchmarkPayment(b *testing.B) {
	url, _ := dbtest.PostgresURL(b)
	ctx := context.Background()
	cfg, err := pgxpool.ParseConfig(url)
	if err != nil {
		b.Fatal(err)
	}
	notifies := &notifyCounter{}
	cfg.ConnConfig.Tracer = notifies
	cfg.MaxConns = 32
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(pool.Close)
	if err := migrate(ctx, pool); err != nil {
		b.Fatal(err)
	}
	log := slog.New(slog.DiscardHandler)
	for _, v := range []struct {
		name string
		set  func(*river.Config) // nil: no job
	}{
		{"payment-only", nil},
		{"default", func(*river.Config) {}},
		{"poll-only", func(c *river.Config) { c.PollOnly = true }},
		{"notify-each", func(c *river.Config) { c.FetchCooldown = time.Millisecond }},
		{"no-notify", func(c *river.Config) { c.FetchCooldown, c.FetchPollInterval = time.Hour, time.Hour }},
	} {
		b.Run(v.name, func(b *testing.B) {
			rc := riverConfig(pool, 0, log)
			if v.set != nil {
				v.set(rc)
			}
			svc, err := newServiceWith(pool, 30*time.Second, log, rc)
			if err != nil {
				b.Fatal(err)
			}
			h := svc.handler()
			if v.set == nil {
				h = svc.mw.Handler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
					tx, err := idem.Tx[pgx.Tx](r.Context())
					if err == nil {
						_, err = tx.Exec(r.Context(), `INSERT INTO payments (amount, currency, customer) VALUES (1000, 'EUR', 'cus_42')`)
					}
					if err != nil {
						http.Error(w, err.Error(), http.StatusServiceUnavailable)
						return
					}
					w.WriteHeader(http.StatusCreated)
				}))
			}
			srv := httptest.NewServer(h)
			defer srv.Close()
			client := srv.Client()
			client.Transport.(*http.Transport).MaxIdleConnsPerHost = 64
			before := notifies.n.Load()
			b.SetParallelism(8)
			b.ResetTimer()
			b.RunParallel(func(pb *testing.PB) {
				for pb.Next() {
					req, _ := http.NewRequest(http.MethodPost, srv.URL, strings.NewReader(`{"amount":1000,"currency":"EUR","customer":"cus_42"}`))
					req.Header.Set(idem.HeaderKey, fmt.Sprintf("bench-%d", benchKeys.Add(1)))
					resp, err := client.Do(req)
					if err != nil {
						b.Error(err)
						return
					}
					_, _ = io.Copy(io.Discard, resp.Body)
					_ = resp.Body.Close()
					if resp.StatusCode != http.StatusCreated || resp.Header.Get("Idempotent-Replayed") != "" {
						b.Errorf("status %d, replayed %q: want a first execution", resp.StatusCode, resp.Header.Get("Idempotent-Replayed"))
						return
					}
				}
			})
			b.StopTimer()
			b.ReportMetric(float64(notifies.n.Load()-before)/float64(b.N), "notifies/op")
			b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "payments/s")
		})
	}
}
