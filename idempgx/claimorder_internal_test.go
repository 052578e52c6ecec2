package idempgx

import (
	"testing"

	"github.com/stretchr/testify/require"
)

// ClaimAdaptive's score: a majority of the recent claims, bounded, so that
// a long run of one kind is undone by at most orderWindow+1 of the other;
// a pinned order ignores the claims.
func TestClaimOrderScore(t *testing.T) {
	t.Parallel()
	var o claimOrder
	require.False(t, o.readFirst(), "a new driver sends the INSERT first")
	o.met(true)
	require.True(t, o.readFirst(), "more claims met a record than not")
	o.met(false)
	require.False(t, o.readFirst(), "a tie: the INSERT first")
	for range 1000 {
		o.met(true)
	}
	require.EqualValues(t, orderWindow, o.score.Load())
	for i := range orderWindow {
		require.True(t, o.readFirst(), "after %d new keys", i)
		o.met(false)
	}
	require.False(t, o.readFirst(), "orderWindow new keys undo any run of existing ones")
	for range 1000 {
		o.met(false)
	}
	require.EqualValues(t, -orderWindow, o.score.Load())
	for range orderWindow {
		o.met(true)
	}
	require.False(t, o.readFirst())
	o.met(true)
	require.True(t, o.readFirst(), "orderWindow+1 existing keys undo any run of new ones")

	for _, pinned := range []ClaimOrder{ClaimReadFirst, ClaimInsertFirst} {
		o := claimOrder{pinned: pinned}
		for range 100 {
			o.met(pinned == ClaimInsertFirst)
			require.Equal(t, pinned == ClaimReadFirst, o.readFirst())
		}
	}
}
