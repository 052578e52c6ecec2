package seat

import (
	"context"
	"errors"
	"testing"
	"time"
)

func TestLoopRunsCyclesThenItsEnd(t *testing.T) {
	var l Loop
	l.Stop() // before Start: nothing to stop
	cycles := make(chan struct{})
	ended := false
	if err := l.Start(context.Background(), time.Nanosecond, func(ctx context.Context) {
		select {
		case cycles <- struct{}{}:
		case <-ctx.Done():
		}
	}, func() { ended = true }); err != nil {
		t.Fatal(err)
	}
	for range 3 {
		<-cycles // the first at once, the next ones after the interval
	}
	if err := l.Start(context.Background(), time.Nanosecond, func(context.Context) {}, nil); !errors.Is(err, ErrStarted) {
		t.Fatalf("second Start: %v, want ErrStarted", err)
	}
	l.Stop()
	if !ended {
		t.Fatal("Stop returned before the loop's end ran")
	}
	l.Stop() // again: returns at once
	if err := l.Start(context.Background(), time.Nanosecond, func(context.Context) {}, nil); !errors.Is(err, ErrStarted) {
		t.Fatalf("Start after Stop: %v, want ErrStarted", err)
	}
}

func TestLoopEndsWithItsContext(t *testing.T) {
	var l Loop
	ctx, cancel := context.WithCancel(context.Background())
	ended := make(chan struct{})
	if err := l.Start(ctx, time.Hour, func(context.Context) {}, func() { close(ended) }); err != nil {
		t.Fatal(err)
	}
	cancel()
	<-ended
	l.Stop()
}
