package seat

import (
	"context"
	"errors"
	"sync"
	"time"
)

// ErrStarted is Loop.Start's error on a loop started before: a stopped
// loop does not start again.
var ErrStarted = errors.New("already started")

// Loop runs one role's cycles in a goroutine of its own: the first at
// once, each next one Interval after the last ended, from Start until Stop
// or the end of Start's context. The zero Loop is ready to start.
type Loop struct {
	mu     sync.Mutex
	cancel context.CancelFunc
	done   chan struct{}
}

// Start runs cycle as above, and end (nil for none) once the last cycle
// has returned, before Stop returns. Errors: ErrStarted.
func (l *Loop) Start(ctx context.Context, interval time.Duration, cycle func(context.Context), end func()) error {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.done != nil {
		return ErrStarted
	}
	ctx, l.cancel = context.WithCancel(ctx)
	l.done = make(chan struct{})
	go func(done chan struct{}) {
		defer close(done)
		if end != nil {
			defer end()
		}
		t := time.NewTimer(0)
		defer t.Stop()
		for {
			select {
			case <-ctx.Done():
				return
			case <-t.C:
			}
			cycle(ctx)
			t.Reset(interval)
		}
	}(l.done)
	return nil
}

// Stop cancels the loop's context and waits for its cycle and its end to
// return. It may be called more than once, and before Start.
func (l *Loop) Stop() {
	l.mu.Lock()
	cancel, done := l.cancel, l.done
	l.mu.Unlock()
	if cancel == nil {
		return
	}
	cancel()
	<-done
}
