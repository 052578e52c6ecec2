package idempgx

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"os/user"
	"path/filepath"
	"strconv"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/idemgo/idem/idemdriver"
	"github.com/idemgo/idem/internal/dbtest"
)

// BenchmarkClaimShapes measures what PostgreSQL costs for each statement
// shape a claim could send (issue 21), through pgx with the package's own
// statements, 8 goroutines on one pool: the answer to an existing
// (SUCCEEDED) key as the claim's read (readSQL, what Claim sends read
// first), as a read that decides in SQL whether the record may be claimed
// (decidingReadSQL, what it sent before), as the claim statement
// (claimSQL, the whole claim before that) and as a plain INSERT ... ON
// CONFLICT DO NOTHING meeting the key (what Claim sends first, INSERT
// first); and the claim of a new key as the read and insertSQL (read
// first), as the claim statement, and as insertSQL alone (INSERT first,
// the floor's statement). Read ns/op as the machine's time per claim,
// client included, and server-cpu-µs/op as the CPU the PostgreSQL server's
// processes used per claim, when the server runs on this machine (read
// from /proc; its background processes included); docs/benchmarks.md has
// a run.
//
//	go test -run '^$' -bench ClaimShapes -benchtime 20000x -count 3 ./idempgx
func BenchmarkClaimShapes(b *testing.B) {
	ctx := context.Background()
	pool := dbtest.PostgresPool(b)
	d := New(pool)
	params := benchCompletedKeys(b, d, existing)
	var seq atomic.Int64
	// run sends the statements per iteration on 8 goroutines, as Claim
	// would: after a read that finds the record, nothing more.
	run := func(b *testing.B, key func() string, statements ...string) {
		b.SetParallelism(4) // 8 goroutines on 2 CPUs
		before, local := serverCPU()
		defer func() {
			if after, ok := serverCPU(); ok && local {
				b.ReportMetric(float64((after-before).Microseconds())/float64(b.N), "server-cpu-µs/op")
			}
		}()
		b.RunParallel(func(pb *testing.PB) {
			for pb.Next() {
				args := d.claimArgs(params(key()))
				for i, q := range statements {
					a := args
					if q == readSQL {
						a = args[:len(readParams)]
					} else if q == decidingReadSQL {
						a = args[:6]
					}
					rows, err := pool.Query(ctx, q, a...)
					if err != nil {
						b.Error(err)
						return
					}
					found := rows.Next()
					rows.Close()
					if err := rows.Err(); err != nil {
						b.Error(err)
						return
					}
					if (q == readSQL || q == decidingReadSQL) && len(statements) > i+1 && found {
						break // Claim sends the INSERT only after a read that found nothing
					}
				}
			}
		})
	}
	replayKey := func() string { return "done-" + strconv.FormatInt(seq.Add(1)%existing, 10) }
	newKey := func() string { return "new-" + strconv.FormatInt(seq.Add(1), 10) }
	b.Run("existing/read", func(b *testing.B) { run(b, replayKey, readSQL) })
	b.Run("existing/deciding-read", func(b *testing.B) { run(b, replayKey, decidingReadSQL) })
	b.Run("existing/claim-statement", func(b *testing.B) { run(b, replayKey, claimSQL) })
	b.Run("existing/insert-do-nothing", func(b *testing.B) { run(b, replayKey, insertSQL) })
	b.Run("new/read+insert", func(b *testing.B) { run(b, newKey, readSQL, insertSQL) })
	b.Run("new/claim-statement", func(b *testing.B) { run(b, newKey, claimSQL) })
	b.Run("new/insert", func(b *testing.B) { run(b, newKey, insertSQL) })
}

// decidingReadSQL is the claim's read as it was before readSQL: whether the
// record may be claimed decided in SQL (claimable, with the method, path
// and fingerprint as parameters), the lease left as a numeric, every
// column; for BenchmarkClaimShapes.
var decidingReadSQL = bind(claimParams[:6], `SELECT `+claimable(now)+`, `+columns+`, false
	FROM idem_keys WHERE scope = @scope AND key = @key`)

// serverCPU is the CPU time the processes of the user postgres have used,
// their waited-for children included (PostgreSQL's backends), read from
// /proc; false when there are none (the server is elsewhere, or not Linux).
func serverCPU() (time.Duration, bool) {
	u, err := user.Lookup("postgres")
	if err != nil {
		return 0, false
	}
	procs, _ := filepath.Glob("/proc/[0-9]*/stat")
	var ticks int64
	found := false
	for _, stat := range procs {
		fi, err := os.Stat(filepath.Dir(stat))
		if err != nil || strconv.FormatUint(uint64(fi.Sys().(*syscall.Stat_t).Uid), 10) != u.Uid {
			continue
		}
		b, err := os.ReadFile(stat)
		i := bytes.LastIndexByte(b, ')')
		if err != nil || i < 0 {
			continue
		}
		f := strings.Fields(string(b[i+1:]))
		if len(f) < 15 {
			continue
		}
		for _, n := range f[11:15] { // utime, stime, cutime, cstime
			v, _ := strconv.ParseInt(n, 10, 64)
			ticks += v
		}
		found = true
	}
	return time.Duration(ticks) * 10 * time.Millisecond, found // USER_HZ is 100 on Linux
}

// BenchmarkClaimOrders measures Claim in each ClaimOrder against traffic
// of every mix: the share of claims whose key exists (a SUCCEEDED record,
// answered as a replay) against new keys, 8 goroutines on one pool. Read
// ns/op as the machine's time per claim, client included: at 0% the INSERT
// first is the cheaper order, at 100% the read first, and ClaimAdaptive
// should be within noise of the cheaper one at both ends and not worse than
// both in between.
//
//	go test -run '^$' -bench ClaimOrders -benchtime 20000x -count 3 ./idempgx
func BenchmarkClaimOrders(b *testing.B) {
	ctx := context.Background()
	pool := dbtest.PostgresPool(b)
	params := benchCompletedKeys(b, New(pool), existing)
	var seq atomic.Int64
	for _, pct := range []int64{0, 10, 50, 90, 100} {
		for _, order := range []ClaimOrder{ClaimReadFirst, ClaimInsertFirst, ClaimAdaptive} {
			name := map[ClaimOrder]string{ClaimReadFirst: "read-first", ClaimInsertFirst: "insert-first", ClaimAdaptive: "adaptive"}[order]
			b.Run(fmt.Sprintf("existing=%d%%/%s", pct, name), func(b *testing.B) {
				d := New(pool)
				d.order.pinned = order
				b.SetParallelism(4) // 8 goroutines on 2 CPUs
				b.RunParallel(func(pb *testing.PB) {
					for pb.Next() {
						n := seq.Add(1)
						key := "new-" + strconv.FormatInt(n, 10)
						if n*7919%100 < pct { // spread over every 100 claims
							key = "done-" + strconv.FormatInt(n%existing, 10)
						}
						if _, err := d.Claim(ctx, params(key)); err != nil {
							b.Error(err)
							return
						}
					}
				})
			})
		}
	}
}

// existing is how many completed keys (done-0 ...) the claim benchmarks
// answer from.
const existing = 32

// benchCompletedKeys migrates d's table and completes existing keys
// (done-0 ...) through d, each with a 176-byte JSON response; it returns
// the claim parameters the benchmarks use for a key.
func benchCompletedKeys(b *testing.B, d *Driver, existing int) func(key string) idemdriver.ClaimParams {
	ctx := context.Background()
	require.NoError(b, d.Migrate(ctx))
	params := func(key string) idemdriver.ClaimParams {
		return idemdriver.ClaimParams{Scope: "bench", Key: key, Method: "POST", Path: "/v1/payments", Fingerprint: []byte{1},
			LeaseDuration: 30 * time.Second, Retention: 24 * time.Hour, Owner: "bench"}
	}
	for i := range existing {
		p := params("done-" + strconv.Itoa(i))
		res, err := d.Claim(ctx, p)
		require.NoError(b, err)
		ok, err := d.Complete(ctx, idemdriver.CompleteParams{
			FenceParams: idemdriver.FenceParams{Scope: p.Scope, Key: p.Key, FencingToken: res.Record.FencingToken, CreatedAt: res.Record.CreatedAt},
			Response:    idemdriver.Response{Status: 201, Header: map[string][]string{"Content-Type": {"application/json"}}, Body: make([]byte, 176), BodyStored: true, BodySize: 176},
		})
		require.NoError(b, err)
		require.True(b, ok)
	}
	return params
}
