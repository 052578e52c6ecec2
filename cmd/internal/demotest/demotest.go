// Package demotest holds what the tests of idem's demo services
// (cmd/paymentsd, cmd/fakepsp, cmd/internal/service) share: an idem store
// whose claims are slow, and waiting for a service's run to return.
package demotest

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/idemgo/idem"
	"github.com/idemgo/idem/idemdriver"
)

// SlowClaims returns s with a Claim that takes delay and then, like a
// database driver whose query is cancelled after the server committed it,
// reports the cancellation of its context (ctx.Err()) even though the claim
// was made (run under context.WithoutCancel).
// It keeps s's steps (idemdriver.Stepper), which the demo's handlers use.
func SlowClaims(s idem.Store, delay time.Duration) idem.Store {
	slow := slowClaims{Store: s, delay: delay}
	if st, ok := s.(idemdriver.Stepper); ok {
		return slowStepClaims{slow, st}
	}
	return slow
}

type slowStepClaims struct {
	slowClaims
	idemdriver.Stepper
}

type slowClaims struct {
	idem.Store
	delay time.Duration
}

func (d slowClaims) Claim(ctx context.Context, p idemdriver.ClaimParams) (idemdriver.ClaimResult, error) {
	time.Sleep(d.delay)
	res, err := d.Store.Claim(context.WithoutCancel(ctx), p)
	if ctx.Err() != nil {
		return res, ctx.Err() // committed, yet reported cancelled
	}
	return res, err
}

// RequireReturns fails t unless done delivers nil within timeout; msg says
// what did not return, for example "run did not return after its context
// was cancelled".
func RequireReturns(t testing.TB, done <-chan error, timeout time.Duration, msg string) {
	t.Helper()
	select {
	case err := <-done:
		require.NoError(t, err)
	case <-time.After(timeout):
		t.Fatal(msg)
	}
}
