package idempgx_test

import (
	"context"
	"fmt"
	"os"
	"sort"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/idemgo/idem/idemdriver"
	"github.com/idemgo/idem/idempgx"
	"github.com/idemgo/idem/internal/dbtest"
)

// EnvRetentionBench turns on TestRetentionRemovalBench, which is heavy: it
// writes a million rows several times. docs/benchmarks.md has its figures.
const EnvRetentionBench = "IDEM_RETENTION_BENCH"

// removal is one way of removing the expired rows.
type removal struct {
	name        string
	partitioned bool
	remove      func(ctx context.Context, d *idempgx.Driver) error
}

const (
	benchExpired = 1_000_000
	benchLive    = 100_000
	benchBatch   = 1000
	benchWorkers = 4
	// benchWindow is the least time over which claim latencies are measured.
	benchWindow = 10 * time.Second
)

// TestRetentionRemovalBench measures, on PostgreSQL, the removal of one
// million expired rows (beside 100,000 live ones): by batched DELETE (the
// purge of a plain table, batches of 1000), by one DELETE statement, and by
// dropping the partition that holds them (partitioned mode). For each: the
// wall time and the WAL written (pg_current_wal_lsn before and after) with
// nothing else running, then again while 4 workers claim and complete new
// keys, with the p50 and p99 of those requests against a baseline without
// removal. Rows are generated in SQL (INSERT ... SELECT generate_series) and
// every measurement starts after a CHECKPOINT. Run with
// IDEM_RETENTION_BENCH=1 go test -run TestRetentionRemovalBench -v ./idempgx/.
func TestRetentionRemovalBench(t *testing.T) {
	if os.Getenv(EnvRetentionBench) == "" {
		t.Skipf("set %s=1 to run (heavy: a million rows, several times)", EnvRetentionBench)
	}
	removals := []removal{
		{"batched DELETE (purge, 1000 per batch)", false, func(ctx context.Context, d *idempgx.Driver) error {
			for {
				n, err := d.PurgeExpired(ctx, idemdriver.PurgeParams{Limit: benchBatch})
				if err != nil || n < benchBatch {
					return err
				}
			}
		}},
		{"one DELETE statement", false, func(ctx context.Context, d *idempgx.Driver) error {
			_, err := d.Pool().Exec(ctx, `DELETE FROM idem_keys WHERE expires_at <= now()`)
			return err
		}},
		{"DROP of the partition (DETACH CONCURRENTLY + DROP TABLE)", true, func(ctx context.Context, d *idempgx.Driver) error {
			dropped, err := d.DropPartitions(ctx, idemdriver.PartitionParams{})
			if err == nil && len(dropped) == 0 {
				err = fmt.Errorf("nothing dropped")
			}
			return err
		}},
	}
	ctx := context.Background()
	var lines []string
	for _, r := range removals {
		for _, loaded := range []bool{false, true} {
			d := benchStore(t, r.partitioned)
			var base latencies
			if loaded {
				base = load(t, d, benchWindow, nil)
			}
			checkpoint(t, d)
			lsn0 := walLSN(t, d)
			var (
				during  latencies
				elapsed time.Duration
				wal     int64 // written while the removal ran (with the claims', when loaded)
			)
			removeAll := func() {
				start := time.Now()
				require.NoError(t, r.remove(ctx, d))
				elapsed = time.Since(start)
				wal = walDiff(t, d, lsn0)
			}
			if loaded {
				during = load(t, d, benchWindow, removeAll)
			} else {
				removeAll()
			}
			var left int64
			require.NoError(t, d.Pool().QueryRow(ctx, `SELECT count(*) FROM idem_keys WHERE expires_at <= now()`).Scan(&left))
			require.Zero(t, left)
			line := fmt.Sprintf("| %s | %s | %.1f s | %s |", r.name, map[bool]string{false: "alone", true: "with 4 claimers"}[loaded],
				elapsed.Seconds(), mib(wal))
			if loaded {
				line += fmt.Sprintf(" %s / %s / max %s (baseline %s / %s / max %s), %d requests in %.1f s |",
					ms(during.p(50)), ms(during.p(99)), ms(during.p(100)), ms(base.p(50)), ms(base.p(99)), ms(base.p(100)),
					len(during), max(elapsed, benchWindow).Seconds())
			} else if !r.partitioned {
				// What the dead tuples cost afterwards: the vacuum of the table.
				checkpoint(t, d)
				lsn1 := walLSN(t, d)
				vs := time.Now()
				_, err := d.Pool().Exec(ctx, `VACUUM idem_keys`)
				require.NoError(t, err)
				line += fmt.Sprintf(" then VACUUM: %.1f s, %s WAL |", time.Since(vs).Seconds(), mib(walDiff(t, d, lsn1)))
			} else {
				line += " no VACUUM needed |"
			}
			t.Log(line)
			lines = append(lines, line)
		}
	}
	fmt.Println("| removal of 1,000,000 expired rows | run | time | WAL | claim+complete p50 / p99 / max during |")
	fmt.Println("|---|---|---|---|---|")
	for _, l := range lines {
		fmt.Println(l)
	}
}

// benchStore returns a migrated store on a fresh schema holding benchExpired
// rows that expired within the last hour (in the partitioned mode, all of
// them in yesterday's partition) and benchLive rows that expire later.
func benchStore(t *testing.T, partitioned bool) *idempgx.Driver {
	t.Helper()
	url, schema := dbtest.PostgresURL(t)
	cfg, err := pgxpool.ParseConfig(url)
	require.NoError(t, err)
	cfg.ConnConfig.RuntimeParams["search_path"] = schema
	cfg.MaxConns = 8
	d := storeOn(t, cfg, partitioned)
	ctx := context.Background()
	if partitioned {
		_, err := d.EnsurePartitions(ctx, idemdriver.PartitionParams{DaysAhead: 9, ClockOffset: -48 * time.Hour})
		require.NoError(t, err)
	}
	// Expired: in the hour before midnight UTC in the partitioned mode (one
	// whole partition), in the last hour otherwise.
	expiredEnd := `now()`
	if partitioned {
		expiredEnd = `date_trunc('day', now() AT TIME ZONE 'UTC') AT TIME ZONE 'UTC'`
	}
	for _, q := range []string{
		`INSERT INTO idem_keys (scope, key, method, path, fingerprint, state, fencing_token,
			response_status, response_headers, response_body, response_body_stored, response_body_size,
			created_at, updated_at, completed_at, expires_at, attempts)
		SELECT 'merchant_' || (i % 1000), 'order-' || i, 'POST', '/v1/payments', sha256(('b' || i)::bytea),
			'SUCCEEDED', 1, 201, '{"Content-Type":["application/json"]}'::bytea,
			convert_to('{"id":"pay_' || i || '","amount":1000,"currency":"JPY","status":"succeeded"}', 'UTF8'),
			true, 64, e - interval '24 hours', e - interval '24 hours', e - interval '24 hours', e, 1
		FROM generate_series(1, ` + strconv.Itoa(benchExpired) + `) AS i,
			LATERAL (SELECT ` + expiredEnd + ` - interval '1 second' - (i % 3600) * interval '1 second' AS e) AS x`,
		`INSERT INTO idem_keys (scope, key, method, path, fingerprint, state, fencing_token,
			response_status, response_headers, response_body, response_body_stored, response_body_size,
			created_at, updated_at, completed_at, expires_at, attempts)
		SELECT 'merchant_' || (i % 1000), 'live-' || i, 'POST', '/v1/payments', sha256(('b' || i)::bytea),
			'SUCCEEDED', 1, 201, '{}'::bytea, '\x7b7d'::bytea, true, 2,
			now(), now(), now(), now() + interval '24 hours' + (i % 3600) * interval '1 second', 1
		FROM generate_series(1, ` + strconv.Itoa(benchLive) + `) AS i`,
		`VACUUM (ANALYZE) idem_keys`,
	} {
		_, err := d.Pool().Exec(ctx, q)
		require.NoError(t, err)
	}
	return d
}

func checkpoint(t *testing.T, d *idempgx.Driver) {
	_, err := d.Pool().Exec(context.Background(), `CHECKPOINT`)
	require.NoError(t, err)
}

func walLSN(t *testing.T, d *idempgx.Driver) string {
	var lsn string
	require.NoError(t, d.Pool().QueryRow(context.Background(), `SELECT pg_current_wal_lsn()::text`).Scan(&lsn))
	return lsn
}

func walDiff(t *testing.T, d *idempgx.Driver, from string) int64 {
	var n int64
	require.NoError(t, d.Pool().QueryRow(context.Background(),
		`SELECT pg_wal_lsn_diff(pg_current_wal_lsn(), $1::pg_lsn)::bigint`, from).Scan(&n))
	return n
}

type latencies []time.Duration

func (l latencies) p(q int) time.Duration {
	if len(l) == 0 {
		return 0
	}
	s := append(latencies(nil), l...)
	sort.Slice(s, func(i, j int) bool { return s[i] < s[j] })
	return s[min(len(s)-1, len(s)*q/100)]
}

// load runs benchWorkers workers that claim and complete new keys (a first
// execution, two statements each) while during runs (when not nil), and for
// at least forDur in all; it returns every request's latency.
func load(t *testing.T, d *idempgx.Driver, forDur time.Duration, during func()) latencies {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var (
		mu  sync.Mutex
		all latencies
		wg  sync.WaitGroup
	)
	prefix := strconv.FormatInt(time.Now().UnixNano(), 36)
	for w := 0; w < benchWorkers; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			var mine latencies
			for i := 0; ctx.Err() == nil; i++ {
				start := time.Now()
				res, err := d.Claim(ctx, idemdriver.ClaimParams{Scope: "bench", Key: fmt.Sprintf("%s-%d-%d", prefix, w, i),
					Method: "POST", Path: "/v1/payments", Fingerprint: []byte("fp"),
					LeaseDuration: 30 * time.Second, Retention: 24 * time.Hour})
				if err != nil {
					break // cancelled
				}
				ok, err := d.Complete(ctx, idemdriver.CompleteParams{FenceParams: idemdriver.FenceParams{
					Scope: "bench", Key: res.Record.Key, FencingToken: res.Record.FencingToken, CreatedAt: res.Record.CreatedAt},
					Response: idemdriver.Response{Status: 201, Body: []byte(`{}`), BodyStored: true, BodySize: 2}})
				if err != nil || !ok {
					break
				}
				mine = append(mine, time.Since(start))
			}
			mu.Lock()
			all = append(all, mine...)
			mu.Unlock()
		}()
	}
	start := time.Now()
	if during != nil {
		during()
	}
	// A measurement window, not a clock move: at least forDur, so that a
	// removal that ends quickly is measured over as many requests as a slow one.
	time.Sleep(forDur - time.Since(start))
	cancel()
	wg.Wait()
	return all
}

func ms(d time.Duration) string { return fmt.Sprintf("%.2f ms", float64(d.Microseconds())/1000) }

func mib(n int64) string { return fmt.Sprintf("%.1f MiB", float64(n)/(1<<20)) }
