package main

import (
	"context"
	"image/png"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/idemgo/idem/internal/dbtest"
)

// TestQuickReportHasEveryVariant runs --quick on embedded SQLite (and the
// naive cache on TEST_REDIS_URL) and checks that the report holds every
// variant at every concurrency, each answered as expected, with its
// allocation count, and that --docs writes the block and a readable PNG.
// No speed is asserted.
func TestQuickReportHasEveryVariant(t *testing.T) {
	redisURL := dbtest.RequireURL(t, "TEST_REDIS_URL")
	o, err := parseFlags([]string{"--quick", "--db", "sqlite", "--redis-url", redisURL, "--place", dbtest.Name("idembench")}, io.Discard)
	require.NoError(t, err)
	require.Equal(t, 1, o.rounds)
	require.Equal(t, []int{1, 8}, o.concurrency)

	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	rep, err := bench(context.Background(), o, "idembench --quick", io.Discard, log)
	require.NoError(t, err)
	require.Empty(t, rep.errors())
	require.Len(t, rep.variants, len(allVariants), "every variant, the naive ones included")
	require.Len(t, rep.targets, 1)
	md := rep.markdown(false)
	for _, v := range allVariants {
		for _, c := range o.concurrency {
			s := rep.sums[sumKey{dbSQLite, v.id, c}]
			require.NotNil(t, s, "%s at c=%d", v.id, c)
			require.Positive(t, s.n, "%s at c=%d sent no request", v.id, c)
			require.Zero(t, s.errs, "%s at c=%d: %s", v.id, c, s.firstErr)
			require.Len(t, s.ratio, 1, "%s at c=%d: one ratio per round", v.id, c)
		}
		require.Contains(t, md, "| "+v.label, v.id)
	}
	require.Contains(t, md, "ratio to the floor")
	require.Contains(t, md, "ratio to the one-commit floor")
	require.Len(t, rep.allocs, len(allVariants))
	for _, a := range rep.allocs {
		require.Positive(t, a.perReq, a.variant)
	}

	dir := t.TempDir()
	const before, after = "# Benchmarks\n\nkept before\n\n", "\n\nkept after\n"
	require.NoError(t, os.WriteFile(filepath.Join(dir, "benchmarks.md"), []byte(before+docsBegin+"\nold\n"+docsEnd+after), 0o644))
	require.NoError(t, rep.writeDocs(dir))
	doc, err := os.ReadFile(filepath.Join(dir, "benchmarks.md"))
	require.NoError(t, err)
	require.True(t, strings.HasPrefix(string(doc), before+docsBegin), "text before the block kept")
	require.True(t, strings.HasSuffix(string(doc), docsEnd+after), "text after the block kept")
	require.NotContains(t, string(doc), "\nold\n")
	require.Contains(t, string(doc), "("+plotFile(dbSQLite)+")")
	f, err := os.Open(filepath.Join(dir, plotFile(dbSQLite)))
	require.NoError(t, err)
	defer f.Close()
	img, err := png.Decode(f)
	require.NoError(t, err)
	require.Equal(t, 1600, img.Bounds().Dx())
}

// TestRatiosArePerRound: a ratio is taken within a round, against that
// round's bare handler, then the median of the rounds is reported; not the
// ratio of the medians.
func TestRatiosArePerRound(t *testing.T) {
	cells := []cell{
		{db: dbSQLite, variant: vBare, conc: 8, round: 1, rps: 100},
		{db: dbSQLite, variant: vBare, conc: 8, round: 2, rps: 200},
		{db: dbSQLite, variant: vBare, conc: 8, round: 3, rps: 400},
		{db: dbSQLite, variant: vClaimTx, conc: 8, round: 1, rps: 90},
		{db: dbSQLite, variant: vClaimTx, conc: 8, round: 2, rps: 100},
		{db: dbSQLite, variant: vClaimTx, conc: 8, round: 3, rps: 300},
		{db: dbSQLite, variant: vFloor, conc: 8, round: 1, rps: 100},
		{db: dbSQLite, variant: vFloor, conc: 8, round: 2, rps: 250},
		{db: dbSQLite, variant: vFloor, conc: 8, round: 3, rps: 300},
		// Another concurrency's bare handler must not be the denominator.
		{db: dbSQLite, variant: vBare, conc: 1, round: 1, rps: 10},
		// The one-commit mode is measured against its own floor.
		{db: dbSQLite, variant: vOneCommit, conc: 8, round: 1, rps: 80},
		{db: dbSQLite, variant: vFloor1c, conc: 8, round: 1, rps: 160},
		// A replay, 409 and 422 are measured against the replay floor.
		{db: dbSQLite, variant: vReplay, conc: 8, round: 1, rps: 450},
		{db: dbSQLite, variant: vKeyReused, conc: 8, round: 1, rps: 300},
		{db: dbSQLite, variant: vFloorRead, conc: 8, round: 1, rps: 500},
		// And against the contract floor.
		{db: dbSQLite, variant: vContract, conc: 8, round: 1, rps: 480},
	}
	s := summarize(cells)[sumKey{dbSQLite, vClaimTx, 8}]
	require.Equal(t, []float64{0.9, 0.5, 0.75}, s.ratio)
	// The median of the rounds' ratios, not the ratio of the medians (100/200).
	require.Equal(t, "0.75x (0.50-0.90)", ratioCell(s.ratio, "x"))
	require.Equal(t, []float64{0.9, 0.4, 1}, s.floorRatio)
	require.Equal(t, "0.90 (0.40-1.00)", ratioCell(s.floorRatio, "")) // not 100/250
	require.Empty(t, summarize(cells)[sumKey{dbSQLite, vFloor, 8}].floorRatio, "a floor has no ratio to a floor")
	require.Equal(t, []float64{0.5}, summarize(cells)[sumKey{dbSQLite, vOneCommit, 8}].floorRatio, "80/160, not 80/100")
	require.Equal(t, []float64{0.9}, summarize(cells)[sumKey{dbSQLite, vReplay, 8}].floorRatio, "450/500")
	require.Equal(t, []float64{0.6}, summarize(cells)[sumKey{dbSQLite, vKeyReused, 8}].floorRatio, "300/500")
	require.Equal(t, []float64{450.0 / 480}, summarize(cells)[sumKey{dbSQLite, vReplay, 8}].contractRatio)
	require.Equal(t, []float64{300.0 / 480}, summarize(cells)[sumKey{dbSQLite, vKeyReused, 8}].contractRatio)
	require.Empty(t, summarize(cells)[sumKey{dbSQLite, vClaimTx, 8}].contractRatio, "a first execution has no contract floor")
	require.Empty(t, summarize(cells)[sumKey{dbSQLite, vContract, 8}].floorRatio, "a floor has no ratio to a floor")
}

func TestReplaceBlockNeedsTheMarkers(t *testing.T) {
	_, err := replaceBlock("# no markers\n", "x")
	require.ErrorContains(t, err, "idembench:begin")
	_, err = replaceBlock(docsEnd+"\n"+docsBegin+"\n", "x")
	require.Error(t, err, "markers out of order")
	out, err := replaceBlock("a\n"+docsBegin+"\nold\n"+docsEnd+"\nb\n", "new\n")
	require.NoError(t, err)
	require.Equal(t, "a\n"+docsBegin+"\n\nnew\n\n"+docsEnd+"\nb\n", out)
}

func TestParseFlags(t *testing.T) {
	o, err := parseFlags(nil, io.Discard)
	require.NoError(t, err)
	require.Equal(t, allDatabases, o.dbs)
	require.Equal(t, []int{1, 8, 32}, o.concurrency)
	require.Equal(t, 3, o.rounds)
	require.Equal(t, 3*time.Second, o.duration)
	require.Len(t, o.variants, len(allVariants))

	o, err = parseFlags([]string{"--quick", "--rounds", "2"}, io.Discard)
	require.NoError(t, err)
	require.Equal(t, 2, o.rounds, "an explicit flag wins over --quick")
	require.Equal(t, 300*time.Millisecond, o.duration)

	for _, args := range [][]string{
		{"--db", "oracle"}, {"--variants", "bare,fast"}, {"--concurrency", "0"}, {"--rounds", "0"}, {"--place", "a/b"}, {"extra"},
	} {
		_, err := parseFlags(args, io.Discard)
		require.Error(t, err, "%q", args)
	}
}

// TestWritePlotWithoutRedis draws a figure from made-up cells (no database,
// no Redis), so the plotting runs wherever the tests do.
func TestWritePlotWithoutRedis(t *testing.T) {
	var cells []cell
	for round := 1; round <= 2; round++ {
		for i, v := range allVariants {
			for j, c := range []int{1, 8, 32} {
				cells = append(cells, cell{db: dbSQLite, variant: v.id, conc: c, round: round,
					rps: float64(100 * (i + j + round)), p99: time.Duration(i+j+1) * time.Millisecond})
			}
		}
	}
	path := filepath.Join(t.TempDir(), "plot.png")
	require.NoError(t, writePlot(path, "SQLite", []int{1, 8, 32}, allVariants, summarize(cells), dbSQLite))
	f, err := os.Open(path)
	require.NoError(t, err)
	defer f.Close()
	cfg, err := png.DecodeConfig(f)
	require.NoError(t, err)
	require.Equal(t, [2]int{1600, 640}, [2]int{cfg.Width, cfg.Height})
}
