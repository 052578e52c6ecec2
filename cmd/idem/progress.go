package main

import (
	"context"
	"fmt"
	"io"
	"os"
	"sync"
	"time"

	"github.com/schollz/progressbar/v3"
	"golang.org/x/term"

	"github.com/idemgo/idem/cmd/internal/command"
)

// progressEvery is how often a long command writes a line of progress to
// stderr when stderr is not a terminal (a log, a CI job); on a terminal it
// draws a bar or a spinner instead.
const progressEvery = 2 * time.Second

// ctxKey keys the values tests put in the context given to run.
type ctxKey int

const (
	// progressEveryKey: a time.Duration to use instead of progressEvery.
	progressEveryKey ctxKey = iota
	// purgeBatchKey: a func(ctx context.Context, r purgeResult) called
	// after each batch of a purge with the totals so far and the command's
	// context (the one --timeout bounds).
	purgeBatchKey
)

func progressInterval(ctx context.Context) time.Duration {
	if d, ok := ctx.Value(progressEveryKey).(time.Duration); ok && d > 0 {
		return d
	}
	return progressEvery
}

// isTerminal reports whether w is a terminal.
func isTerminal(w io.Writer) bool {
	f, ok := w.(*os.File)
	return ok && term.IsTerminal(int(f.Fd()))
}

// progress reports a long command's progress on stderr: a progress bar (or
// a spinner, with no total) on a terminal, else a line every interval. Its
// methods are safe from any goroutine; after done nothing more is written.
type progress struct {
	mu     sync.Mutex
	w      io.Writer
	bar    *progressbar.ProgressBar // nil when w is not a terminal
	line   func(elapsed time.Duration) string
	start  time.Time
	stop   chan struct{}
	wg     sync.WaitGroup
	closed bool
}

// startProgress starts reporting to w. total is the bar's length on a
// terminal (-1: unknown, a spinner); line says what the command has done so
// far, for a line every interval elsewhere (and is called under the lock,
// so it may read what update set).
func startProgress(ctx context.Context, w io.Writer, desc string, total int64, line func(elapsed time.Duration) string) *progress {
	p := &progress{w: w, line: line, start: time.Now(), stop: make(chan struct{})}
	every := progressInterval(ctx)
	if isTerminal(w) {
		p.bar = progressbar.NewOptions64(total,
			progressbar.OptionSetWriter(w),
			progressbar.OptionSetDescription(desc),
			progressbar.OptionShowCount(),
			progressbar.OptionSetPredictTime(total > 0),
			progressbar.OptionSetElapsedTime(true),
			progressbar.OptionThrottle(100*time.Millisecond),
			progressbar.OptionClearOnFinish(),
			progressbar.OptionFullWidth(),
		)
		every = 100 * time.Millisecond // the spinner turns while a statement runs
	}
	p.wg.Add(1)
	go func() {
		defer p.wg.Done()
		t := time.NewTicker(every)
		defer t.Stop()
		for {
			select {
			case <-p.stop:
				return
			case <-t.C:
				p.tick()
			}
		}
	}()
	return p
}

func (p *progress) tick() {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed {
		return
	}
	if p.bar != nil {
		_ = p.bar.Add64(0) // redraws: the spinner and the elapsed time
		return
	}
	command.Errorf(p.w, "idem: %s", p.line(time.Since(p.start)))
}

// update runs f under the lock (to change what line reads) and moves the
// bar to n.
func (p *progress) update(n int64, f func()) {
	p.mu.Lock()
	defer p.mu.Unlock()
	f()
	if p.bar != nil && !p.closed {
		if m := p.bar.GetMax64(); m >= 0 && n > m {
			p.bar.ChangeMax64(n) // more expired while purging than counted
		}
		_ = p.bar.Set64(n)
	}
}

// done stops the reports and clears the bar.
func (p *progress) done() {
	p.mu.Lock()
	if p.closed {
		p.mu.Unlock()
		return
	}
	p.closed = true
	close(p.stop)
	if p.bar != nil {
		_ = p.bar.Clear()
	}
	p.mu.Unlock()
	p.wg.Wait()
}

// whileRunning reports that a command of one long statement (a count, a
// drop) is still running, with what it does, and returns its result.
func whileRunning[T any](ctx context.Context, w io.Writer, what string, f func() (T, error)) (T, error) {
	p := startProgress(ctx, w, what, -1, func(elapsed time.Duration) string {
		return fmt.Sprintf("%s: still running after %s", what, dur(elapsed.Truncate(time.Second)))
	})
	defer p.done()
	return f()
}
