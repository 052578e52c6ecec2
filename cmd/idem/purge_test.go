package main

import (
	"bytes"
	"context"
	"encoding/json"
	"os"
	"os/signal"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/idemgo/idem/idemdriver"
)

// syncBuffer is a stderr that the progress goroutine writes while the test
// reads it; changed is signalled after each write.
type syncBuffer struct {
	mu      sync.Mutex
	buf     bytes.Buffer
	changed chan struct{}
}

func newSyncBuffer() *syncBuffer { return &syncBuffer{changed: make(chan struct{}, 1)} }

func (b *syncBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	n, err := b.buf.Write(p)
	select {
	case b.changed <- struct{}{}:
	default:
	}
	return n, err
}

func (b *syncBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}

// waitFor blocks until s has been written (by the progress goroutine).
func (b *syncBuffer) waitFor(s string) {
	for !strings.Contains(b.String(), s) {
		<-b.changed
	}
}

const (
	purgeRecords = 200
	purgeBatch   = 20
)

// purgeRun runs `idem purge --batch 20 --json args...` with ctx, on a store
// of purgeRecords expired records, calling hook after each batch. It
// returns the purge's JSON, stderr, the exit status and how many records
// are expired still.
func purgeRun(t *testing.T, b backend, ctx context.Context, hook func(context.Context, purgeResult), stderr *syncBuffer, args ...string) (map[string]any, string, int, int64) {
	t.Helper()
	url, d := b.setup(t, b.partitioned)
	c := cli{t: t, url: url}
	c.ok(b.migrateUp()...)
	if p, ok := d.(idemdriver.Partitioner); ok && p.Partitioned() {
		_, err := p.EnsurePartitions(context.Background(), idemdriver.PartitionParams{DaysAhead: 3, ClockOffset: -48 * time.Hour})
		require.NoError(t, err)
	}
	expire(t, d, "acct_9", purgeRecords) // expired an hour ago, by ClockOffset
	if hook != nil {
		ctx = context.WithValue(ctx, purgeBatchKey, hook)
	}
	if stderr == nil {
		stderr = newSyncBuffer()
	}
	var out bytes.Buffer
	code := run(ctx, append([]string{"--database-url", url, "purge", "--batch", "20", "--json"}, args...), &out, stderr)
	var v map[string]any
	require.NoError(t, json.Unmarshal(out.Bytes(), &v), "stdout %q, stderr %q", out.String(), stderr.String())
	left, err := d.(idemdriver.Purger).CountExpired(context.Background(), idemdriver.PurgeParams{Limit: 1})
	require.NoError(t, err)
	return v, stderr.String(), code, left
}

// A purge stopped between batches (issue 20 item 6) reports what it
// deleted: the count it prints is the records gone from the table, and it
// exits 1 saying why it stopped; one that finishes says so.
func TestPurgeReportsWhatItDid(t *testing.T) {
	for _, b := range backends {
		t.Run(b.name, func(t *testing.T) {
			t.Parallel()

			t.Run("Interrupted", func(t *testing.T) {
				ctx, cancel := context.WithCancel(context.Background())
				defer cancel()
				v, errOut, code, left := purgeRun(t, b, ctx, func(_ context.Context, r purgeResult) {
					if r.Batches == 3 {
						cancel() // as SIGINT does through command.Main's context
					}
				}, nil)
				require.Equal(t, 1, code, errOut)
				require.EqualValues(t, 3*purgeBatch, v["purged"])
				require.EqualValues(t, 3, v["batches"])
				require.Equal(t, "interrupted", v["stopped"])
				require.Equal(t, false, v["complete"])
				require.EqualValues(t, purgeRecords-3*purgeBatch, left, "the count printed is what was deleted")
				require.Contains(t, errOut, "purge interrupted after 60 records: expired records remain")
			})

			t.Run("Timeout", func(t *testing.T) {
				v, errOut, code, left := purgeRun(t, b, context.Background(), func(ctx context.Context, r purgeResult) {
					if r.Batches == 2 {
						<-ctx.Done() // until --timeout passes
					}
				}, nil, "--timeout", "2s")
				require.Equal(t, 1, code, errOut)
				require.Equal(t, "timeout", v["stopped"])
				require.Equal(t, false, v["complete"])
				require.LessOrEqual(t, v["batches"], float64(2), "stopped between batches")
				require.EqualValues(t, purgeRecords-left, v["purged"], "the count printed is what was deleted")
				require.Positive(t, v["duration_seconds"], "the duration is the purge's, on every path")
				require.Contains(t, errOut, "purge stopped by --timeout 2s after")
			})

			t.Run("ProgressLines", func(t *testing.T) {
				stderr := newSyncBuffer()
				ctx := context.WithValue(context.Background(), progressEveryKey, time.Millisecond)
				v, errOut, code, left := purgeRun(t, b, ctx, func(_ context.Context, r purgeResult) {
					if r.Batches == 2 {
						stderr.waitFor("idem: purge: purged 40 records in 2 batches so far")
					}
				}, stderr)
				require.Zero(t, code, errOut)
				require.EqualValues(t, purgeRecords, v["purged"])
				require.EqualValues(t, purgeRecords/purgeBatch+1, v["batches"], "the last batch comes back empty")
				require.Equal(t, true, v["complete"])
				require.Nil(t, v["stopped"])
				require.Zero(t, left)
			})
		})
	}
}

// SIGINT, caught as command.Main catches it, stops the purge between
// batches; it reports the true count. Not parallel: the signal goes to the
// whole test process.
func TestPurgeSIGINT(t *testing.T) {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	defer stop()
	v, errOut, code, left := purgeRun(t, backends[0], ctx, func(ctx context.Context, r purgeResult) {
		if r.Batches == 2 {
			require.NoError(t, syscall.Kill(os.Getpid(), syscall.SIGINT))
			<-ctx.Done()
		}
	}, nil)
	require.Equal(t, 1, code, errOut)
	require.EqualValues(t, 2*purgeBatch, v["purged"])
	require.Equal(t, "interrupted", v["stopped"])
	require.EqualValues(t, purgeRecords-2*purgeBatch, left)
}

// The table's summary says why a purge stopped.
func TestPurgeSummaryLine(t *testing.T) {
	url, d := sqliteBackend(t, false)
	c := cli{t: t, url: url}
	c.ok("migrate", "up")
	expire(t, d, "acct_9", 5)
	require.Contains(t, c.ok("purge", "--batch", "2", "--max-batches", "1"),
		"purged 2 records in 1 batches of at most 2 (every expired record) in ")
	require.Contains(t, c.ok("purge", "--batch", "2", "--max-batches", "1"), "; stopped: --max-batches reached, expired records may remain")
	out := c.ok("purge", "--batch", "2")
	require.Contains(t, out, "purged 1 records in 1 batches of at most 2")
	require.NotContains(t, out, "stopped")

}
