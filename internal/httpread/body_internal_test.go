package httpread

import (
	"testing"

	"github.com/stretchr/testify/require"
)

// A declared length is allocated up front only up to presizedBody: a client
// that declares MaxRequestBytes and sends nothing holds no megabyte.
func TestBodyBufferTrustsTheDeclaredLengthOnlySoFar(t *testing.T) {
	t.Parallel()
	for _, c := range []struct{ n, limit, cap int64 }{
		{-1, 1 << 20, 0}, {0, 1 << 20, 1}, {300, 1 << 20, 301}, {presizedBody, 1 << 20, presizedBody + 1},
		{1 << 20, 1 << 20, presizedBody + 1}, {1<<20 + 1, 1 << 20, 0}, {10, 5, 0},
	} {
		b := bodyBuffer(c.n, c.limit)
		require.Zero(t, len(b))
		require.EqualValues(t, c.cap, cap(b), "declared %d, limit %d", c.n, c.limit)
	}
}
