package idem

import (
	"context"
	"log/slog"
	"math"
	"net/http"
	"path/filepath"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/idemgo/idem/idemsqlite"
)

func TestPreferredWait(t *testing.T) {
	for _, tc := range []struct {
		prefer []string
		want   time.Duration
		ok     bool
	}{
		{nil, 0, false},
		{[]string{"wait=5"}, 5 * time.Second, true},
		{[]string{"respond-async, wait=10"}, 10 * time.Second, true},
		{[]string{"WAIT = 3"}, 3 * time.Second, true},
		{[]string{`wait="7"`}, 7 * time.Second, true},
		{[]string{"wait=2; ignored=param"}, 2 * time.Second, true},
		{[]string{"wait=0"}, 0, true},
		{[]string{"return=minimal", "wait=4"}, 4 * time.Second, true},
		{[]string{"wait=4, wait=9"}, 4 * time.Second, true}, // the first counts (RFC 7240 section 2)
		{[]string{"wait=-1"}, 0, false},
		{[]string{"wait=1.5"}, 0, false},
		{[]string{"wait=abc"}, 0, false},
		{[]string{"wait=abc, wait=5"}, 0, false}, // the first counts, even invalid (RFC 7240 section 2)
		{[]string{"wait=2147483647"}, 2147483647 * time.Second, true},
		// Regression: too large to parse was ignored (the server's Wait,
		// often none); it is the longest wait, which MaxWait caps.
		{[]string{"wait=2147483648"}, math.MaxInt64, true},
		{[]string{"wait=99999999999"}, math.MaxInt64, true},
		{[]string{"wait=99999999999999999999"}, math.MaxInt64, true},
		{[]string{"wait=-99999999999999999999"}, 0, false},
		{[]string{"waiting=5"}, 0, false},
	} {
		r, err := http.NewRequest(http.MethodPost, "/", nil)
		require.NoError(t, err)
		for _, v := range tc.prefer {
			r.Header.Add("Prefer", v)
		}
		got, ok := preferredWait(r)
		require.Equal(t, tc.ok, ok, "%q", tc.prefer)
		require.Equal(t, tc.want, got, "%q", tc.prefer)
	}
}

// An outcome recorded between a duplicate's claim and its joining the
// waiters woke nobody: the first read follows the join at once, so the
// duplicate is answered without a poll (here an hour long).
func TestWaitReadsOnceJoined(t *testing.T) {
	store, err := idemsqlite.Open(t.Context(), filepath.Join(t.TempDir(), "w.db"))
	require.NoError(t, err)
	t.Cleanup(func() { _ = store.Close() })
	require.NoError(t, store.Migrate(t.Context()))
	g, err := NewEngine(EngineConfig{Store: store, Wait: time.Hour, WaitPoll: time.Hour, Logger: slog.New(slog.DiscardHandler)})
	require.NoError(t, err)
	dp := DoParams{Scope: "s", Key: "k", Payload: []byte("a")}
	_, err = g.Do(t.Context(), dp, func(context.Context) (Result, error) { return Result{Status: 201, Body: []byte("one")}, nil })
	require.NoError(t, err)
	p, err := g.doParams(dp)
	require.NoError(t, err)
	stale := verdict{kind: answerInFlight} // what the claim saw before the owner completed
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	_, v := g.waits.await(ctx, p, time.Hour, stale, func() (claimed, verdict) { return claimed{}, stale })
	require.Equal(t, answerReplay, v.kind)
	require.Equal(t, "one", string(v.rec.Response.Body))
}
