package idempgx

import (
	"context"
	"strconv"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/idemgo/idem/idemdriver"
	"github.com/idemgo/idem/internal/dbtest"
)

// BenchmarkClaimShapes measures what PostgreSQL costs for each statement
// shape a claim could send (issue 21), through pgx with the package's own
// statements, 8 goroutines on one pool: the answer to an existing
// (SUCCEEDED) key as the claim's read (readSQL, what Claim sends), as the
// claim statement (claimSQL, the whole claim before issue 21) and as a
// plain INSERT ... ON CONFLICT DO NOTHING meeting the key; and the claim of
// a new key as the read and insertSQL (Claim), as the claim statement, and
// as insertSQL alone (the floor's statement). Read ns/op as the machine's
// time per claim, client included; docs/benchmarks.md has a run.
//
//	go test -run '^$' -bench ClaimShapes -benchtime 5s ./idempgx
func BenchmarkClaimShapes(b *testing.B) {
	ctx := context.Background()
	pool := dbtest.PostgresPool(b)
	d := New(pool)
	require.NoError(b, d.Migrate(ctx))
	const existing = 32
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
	var seq atomic.Int64
	// run sends the statements per iteration on 8 goroutines, as Claim
	// would: after a read that finds the record, nothing more.
	run := func(b *testing.B, key func() string, statements ...string) {
		b.SetParallelism(4) // 8 goroutines on 2 CPUs
		b.RunParallel(func(pb *testing.PB) {
			for pb.Next() {
				args := d.claimArgs(params(key()))
				for i, q := range statements {
					a := args
					if q == readSQL {
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
					if q == readSQL && len(statements) > i+1 && found {
						break // Claim sends the INSERT only after a read that found nothing
					}
				}
			}
		})
	}
	replayKey := func() string { return "done-" + strconv.FormatInt(seq.Add(1)%existing, 10) }
	newKey := func() string { return "new-" + strconv.FormatInt(seq.Add(1), 10) }
	b.Run("existing/read", func(b *testing.B) { run(b, replayKey, readSQL) })
	b.Run("existing/claim-statement", func(b *testing.B) { run(b, replayKey, claimSQL) })
	b.Run("existing/insert-do-nothing", func(b *testing.B) { run(b, replayKey, insertSQL) })
	b.Run("new/read+insert", func(b *testing.B) { run(b, newKey, readSQL, insertSQL) })
	b.Run("new/claim-statement", func(b *testing.B) { run(b, newKey, claimSQL) })
	b.Run("new/insert", func(b *testing.B) { run(b, newKey, insertSQL) })
}
