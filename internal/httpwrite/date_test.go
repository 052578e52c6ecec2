package httpwrite

import (
	"net/http"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// Dates keeps the last date it wrote; every answer is t's own second,
// whatever came before it.
func TestHTTPDateIsEachTimesOwn(t *testing.T) {
	t.Parallel()
	var d Dates
	base := time.Date(2026, 12, 3, 16, 41, 28, 0, time.FixedZone("JST", 9*3600))
	for _, t0 := range []time.Time{base, base.Add(999 * time.Millisecond), base.Add(time.Second), base, base.Add(-time.Nanosecond),
		base.Add(24 * time.Hour), base.UTC()} {
		require.Equal(t, t0.UTC().Format(http.TimeFormat), d.Format(t0), t0.String())
	}
}
