package idemdrivertest

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/idemgo/idem/idemdriver"
)

// driverNotifyWhenMarked: a driver that notifies this process
// (idemdriver.Notifier) and marks records waited for
// (idemdriver.WaitMarker) sends the notification of an end with
// FenceParams.NotifyMarked only when a waiter marked the record first, and
// a mark holds for the execution it names, PROCESSING. Notifications are
// delivered in commit order, so the marked end's arriving before any of
// the unmarked one's (ended first) tells that the latter sent none, with
// no wait.
func driverNotifyWhenMarked(t *testing.T, d idemdriver.Driver) {
	n, notifies := d.(idemdriver.Notifier)
	m, marks := d.(idemdriver.WaitMarker)
	if !notifies || !marks || !n.Notifies() {
		t.Skipf("%T does not notify this process and mark records (idemdriver.Notifier, idemdriver.WaitMarker)", d)
	}
	tag := fmt.Sprintf("%x", time.Now().UnixNano()) // hex, as FenceParams.Notify is
	ctx, cancel := context.WithCancel(context.Background())
	listening, got := make(chan struct{}, 1), make(chan string, 16)
	done := make(chan struct{})
	go func() {
		defer close(done)
		_ = n.Listen(ctx, func(on bool) {
			if on {
				select {
				case listening <- struct{}{}:
				default:
				}
			}
		}, func(payload string) {
			if strings.HasPrefix(payload, tag) { // other tests may share the channel
				got <- payload
			}
		})
	}()
	t.Cleanup(func() { cancel(); <-done })
	select {
	case <-listening:
	case <-time.After(time.Minute):
		t.Fatal("the driver's Listen did not start listening within a minute")
	}

	end := func(key string, mark bool) idemdriver.FenceParams {
		res := claim(t, d, params("acct", key, "body"))
		require.True(t, res.Claimed)
		f := fence(res.Record)
		f.Notify, f.NotifyMarked = tag+"0"+fmt.Sprint(len(key)), true
		if mark {
			for range 2 { // marked, then found marked
				marked, err := m.MarkWaited(context.Background(), f)
				require.NoError(t, err)
				require.True(t, marked, "a PROCESSING record of this execution is marked")
			}
		}
		ok, err := d.Complete(context.Background(), idemdriver.CompleteParams{FenceParams: f, Response: okResponse(`{}`)})
		require.NoError(t, err)
		require.True(t, ok)
		return f
	}
	unmarked := end("u", false)
	marked := end("mm", true)
	select {
	case p := <-got:
		require.Equal(t, marked.Notify, p, "the unmarked end sent a notification")
	case <-time.After(time.Minute):
		t.Fatal("the marked end's notification did not arrive within a minute")
	}
	require.NotEqual(t, unmarked.Notify, marked.Notify)

	ok, err := m.MarkWaited(context.Background(), marked)
	require.NoError(t, err)
	require.False(t, ok, "an ended execution is not marked")
	res := claim(t, d, params("acct", "stale", "body"))
	stale := fence(res.Record)
	stale.FencingToken++
	ok, err = m.MarkWaited(context.Background(), stale)
	require.NoError(t, err)
	require.False(t, ok, "another execution's token is not marked")
}
