package protocol

import (
	"context"
	"log/slog"
	"path/filepath"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/idemgo/idem/idemdriver"
	"github.com/idemgo/idem/idemsqlite"
	"github.com/idemgo/idem/seal"
)

// An outcome recorded between a duplicate's claim and its joining the
// waiters woke nobody: the first read follows the join at once, so the
// duplicate is answered without a poll (here an hour long).
func TestWaitReadsOnceJoined(t *testing.T) {
	store, err := idemsqlite.Open(t.Context(), filepath.Join(t.TempDir(), "w.db"))
	require.NoError(t, err)
	t.Cleanup(func() { _ = store.Close() })
	require.NoError(t, store.Migrate(t.Context()))
	eng := New(Config{Store: store, LeaseDuration: 30 * time.Second, Retention: time.Hour, ClaimTimeout: 5 * time.Second,
		CompleteTimeout: 5 * time.Second, MaxExecution: time.Minute, InFlightRetryAfter: time.Second, Notify: true,
		MaxWaiters: 10, WaitPoll: time.Hour, Outcome: func(int) Outcome { return Succeeded }, Logger: slog.New(slog.DiscardHandler)})
	p := idemdriver.ClaimParams{Scope: "s", Key: "k", Method: "DO", Fingerprint: make([]byte, 32), LeaseDuration: 30 * time.Second, Retention: time.Hour}
	a := eng.Run(t.Context(), p, "k", 0, doneJob{})
	require.Equal(t, KindRan, a.Kind, "%v", a.Err)
	stale := Answer{Kind: KindInFlight} // what the claim saw before the owner completed
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	_, v := eng.waits.await(ctx, p, time.Hour, stale, func() (claimed, Answer) { return claimed{}, stale })
	require.Equal(t, KindReplay, v.Kind)
	require.Equal(t, "one", string(v.Record.Response.Body))
}

// doneJob answers 201 "one".
type doneJob struct{}

func (doneJob) Run(context.Context) (int, Override) { return 201, ByPolicy }
func (doneJob) Response() idemdriver.Response {
	return idemdriver.Response{Status: 201, Header: map[string][]string{}, Body: []byte("one"), BodyStored: true, BodySize: 3}
}
func (doneJob) Kept(int64) seal.Request       { return seal.Request{} }
func (doneJob) Redrive() (seal.Request, bool) { return seal.Request{}, false }
