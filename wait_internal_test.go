package idem

import (
	"context"
	"log/slog"
	"path/filepath"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/idemgo/idem/idemsqlite"
)

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
