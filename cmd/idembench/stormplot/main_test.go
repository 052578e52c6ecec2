package main

import (
	"image/png"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

// The committed scrapes of the storm render, and their numbers agree: every
// execution (executed, taken_over) is one handler-duration observation.
func TestRenderCommittedStorm(t *testing.T) {
	t.Parallel()
	before, after := "../../../docs/img/storm-metrics-before.prom", "../../../docs/img/storm-metrics-after.prom"
	out := filepath.Join(t.TempDir(), "storm.png")
	var listing strings.Builder
	require.NoError(t, run([]string{"-before", before, "-after", after, "-o", out}, &listing))
	f, err := os.Open(out)
	require.NoError(t, err)
	defer f.Close()
	img, err := png.Decode(f)
	require.NoError(t, err)
	require.Equal(t, 1200, img.Bounds().Dx())

	b, err := parse(before)
	require.NoError(t, err)
	a, err := parse(after)
	require.NoError(t, err)
	counts := decisionIncrease(b, a)
	_, buckets := handlerIncrease(b, a)
	var observed float64
	for _, n := range buckets {
		require.GreaterOrEqual(t, n, 0.0)
		observed += n
	}
	require.Positive(t, counts["executed"])
	require.Equal(t, counts["executed"]+counts["taken_over"]+counts["released"]+counts["lease_lost"]+counts["completion_failed"], observed)
	require.Contains(t, listing.String(), "taken_over")

	require.Error(t, run([]string{"-before", before}, &listing), "-after is required")
}
