package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"time"

	"github.com/idemgo/idem/idemdriver"
)

// purgeGrace is how long a batch under way may still run once the command
// is told to stop (--timeout passed, SIGINT): it is finished, so that the
// count printed is what was deleted; past this it is abandoned.
const purgeGrace = 10 * time.Second

// Why a purge stopped before no expired record was left.
const (
	stopTimeout     = "timeout"
	stopInterrupted = "interrupted"
	stopMaxBatches  = "max_batches"
)

// purge deletes expired records in batches of params.Limit until a batch
// comes back short, maxBatches (0: no bound), or ctx ends (--timeout, a
// signal): it checks ctx between batches and lets the batch under way
// finish (for up to purgeGrace), so what it prints is what it deleted. It
// shows its progress on g.stderr. A purge stopped by ctx prints its result
// and returns an error (exit 1: expired records remain).
func purge(ctx context.Context, g *globals, s *store, out io.Writer, params idemdriver.PurgeParams, maxBatches int) error {
	res := purgeResult{OlderThan: params.OlderThan, Batch: params.Limit, Timeout: g.timeout}
	total := int64(-1)
	if isTerminal(g.stderr) {
		// The bar's length; a failed count leaves a spinner.
		if n, err := s.Driver.CountExpired(ctx, params); err == nil {
			total = n
			if maxBatches > 0 {
				total = min(total, int64(maxBatches)*int64(params.Limit))
			}
		}
	}
	start := time.Now()
	prog := startProgress(ctx, g.stderr, "purging", total, func(elapsed time.Duration) string {
		return fmt.Sprintf("purge: purged %d records in %d batches so far (%s)", res.Purged, res.Batches, dur(elapsed.Truncate(time.Second)))
	})
	defer prog.done()

	// The batches run on a context that ctx's end does not cancel at once.
	bctx, cancelBatch := context.WithCancel(context.WithoutCancel(ctx))
	defer cancelBatch()
	defer context.AfterFunc(ctx, func() { time.AfterFunc(purgeGrace, cancelBatch) })()
	hook, _ := ctx.Value(purgeBatchKey).(func(context.Context, purgeResult))

	finish := func(err error) error {
		prog.done()
		res.Duration = time.Since(start)
		return errors.Join(err, printPurge(out, g.json, res))
	}
	for {
		if maxBatches > 0 && res.Batches >= maxBatches {
			res.Stopped = stopMaxBatches
			return finish(nil)
		}
		if ctx.Err() != nil {
			res.Stopped = stopReason(ctx)
			return finish(stopError(res, g.timeout))
		}
		n, err := s.Driver.PurgeExpired(bctx, params)
		if err != nil {
			if ctx.Err() != nil {
				res.Stopped = stopReason(ctx)
				return finish(fmt.Errorf("%w; the batch under way was abandoned after %s: it deleted nothing, or its records (at most %d) are gone too",
					stopError(res, g.timeout), purgeGrace, params.Limit))
			}
			// What was purged before the failure is printed; the failure is
			// the error, with the print's own after it.
			return finish(fmt.Errorf("after %d records: %w", res.Purged, err))
		}
		prog.update(res.Purged+n, func() { res.Batches++; res.Purged += n })
		if hook != nil {
			hook(ctx, res)
		}
		if n < int64(params.Limit) {
			return finish(nil)
		}
	}
}

func stopReason(ctx context.Context) string {
	if errors.Is(ctx.Err(), context.DeadlineExceeded) {
		return stopTimeout
	}
	return stopInterrupted
}

func stopError(res purgeResult, timeout time.Duration) error {
	if res.Stopped == stopTimeout {
		return fmt.Errorf("purge stopped by --timeout %s after %d records: expired records remain (run it again, or give a longer --timeout)", timeout, res.Purged)
	}
	return fmt.Errorf("purge interrupted after %d records: expired records remain (run it again)", res.Purged)
}
