package idemgrpc

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

func TestWaitFor(t *testing.T) {
	t.Parallel()
	i := &Interceptor{opts: options{wait: DefaultWait}}
	require.Equal(t, DefaultWait, i.waitFor(context.Background()), "no deadline: the whole wait")

	// A deadline 10 s away: at most 9 s, so the answer reaches the
	// client before its deadline.
	ctx, cancel := context.WithDeadline(context.Background(), time.Now().Add(10*time.Second))
	defer cancel()
	w := i.waitFor(ctx)
	require.Positive(t, w)
	require.LessOrEqual(t, w, 9*time.Second)

	// A deadline past: no wait (negative, DoParams.Wait's "none").
	past, cancelPast := context.WithDeadline(context.Background(), time.Now().Add(-time.Second))
	defer cancelPast()
	require.Negative(t, i.waitFor(past))

	// Waiting off.
	off := &Interceptor{opts: options{wait: 0}}
	require.Negative(t, off.waitFor(ctx))
	require.Negative(t, off.waitFor(context.Background()))
}
