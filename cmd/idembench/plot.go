package main

import (
	"errors"
	"fmt"
	"image/color"
	"os"
	"strconv"

	"gonum.org/v1/plot"
	"gonum.org/v1/plot/plotter"
	"gonum.org/v1/plot/vg"
	"gonum.org/v1/plot/vg/draw"
	"gonum.org/v1/plot/vg/vgimg"
)

// palette gives each variant (in allVariants order) its colour: idem's
// variants in blues and greens, the bare handler grey, the naive cache red.
var palette = map[string]color.RGBA{
	vBare:      {R: 0x55, G: 0x55, B: 0x55, A: 0xff},
	vClaimTx:   {R: 0x1f, G: 0x77, B: 0xb4, A: 0xff},
	vOwnTx:     {R: 0x6b, G: 0xae, B: 0xd6, A: 0xff},
	vOneCommit: {R: 0x17, G: 0xbe, B: 0xcf, A: 0xff},
	vFloor:     {R: 0x00, G: 0x00, B: 0x00, A: 0xff},
	vFloor1c:   {R: 0x7f, G: 0x7f, B: 0x7f, A: 0xff},
	vFloorRead: {R: 0x8c, G: 0x56, B: 0x4b, A: 0xff},
	vContract:  {R: 0xc4, G: 0x9c, B: 0x94, A: 0xff},
	vReplay:    {R: 0x2c, G: 0xa0, B: 0x2c, A: 0xff},
	vInFlight:  {R: 0x98, G: 0xdf, B: 0x8a, A: 0xff},
	vKeyReused: {R: 0xbc, G: 0xbd, B: 0x22, A: 0xff},
	vCached:    {R: 0x94, G: 0x67, B: 0xbd, A: 0xff},
	vCached422: {R: 0xc5, G: 0xb0, B: 0xd5, A: 0xff},
	vNaiveMiss: {R: 0xd6, G: 0x27, B: 0x28, A: 0xff},
	vNaiveHit:  {R: 0xff, G: 0x98, B: 0x96, A: 0xff},
}

// writePlot draws one database's figure into path (PNG, 1600x640 px): the
// median throughput per concurrency on the left, the median p99 latency on
// the right (log scale), a colour per variant, the legend beside them.
func writePlot(path, title string, concs []int, vs []variant, sums map[sumKey]*summary, db string) error {
	names := make([]string, len(concs))
	for i, c := range concs {
		names[i] = "c=" + strconv.Itoa(c)
	}
	const barWidth = vg.Length(11)
	thr, lat := plot.New(), plot.New()
	thr.Title.Text = title + ": throughput (median of rounds)"
	thr.Y.Label.Text = "requests per second"
	lat.Title.Text = title + ": p99 latency (median of rounds)"
	lat.Y.Label.Text = "milliseconds (log scale)"
	legend := plot.NewLegend()
	legend.TextStyle.Font.Size = vg.Points(11)
	legend.Left, legend.Top = true, true
	legend.Padding = vg.Points(3)
	thr.Y.Min = 0
	for _, p := range []*plot.Plot{thr, lat} {
		p.NominalX(names...)
		grid := plotter.NewGrid()
		grid.Vertical.Color = nil
		p.Add(grid)
		p.X.Min, p.X.Max = -0.5, float64(len(concs))-0.5
		p.Title.TextStyle.Font.Size = vg.Points(13)
	}
	for i, v := range vs {
		rps := make(plotter.Values, len(concs))
		var p99 plotter.XYs
		for j, c := range concs {
			if s := sums[sumKey{db, v.id, c}]; s != nil {
				rps[j] = median(s.rps)
				// Nudged sideways a little so that equal values stay visible.
				x := float64(j) + (float64(i)-float64(len(vs)-1)/2)*0.025
				p99 = append(p99, plotter.XY{X: x, Y: max(float64(medianDuration(s.p99).Microseconds())/1000, 0.01)})
			}
		}
		bars, err := plotter.NewBarChart(rps, barWidth)
		if err != nil {
			return err
		}
		bars.Color = palette[v.id]
		bars.LineStyle.Width = 0
		bars.Offset = vg.Length(float64(i)-float64(len(vs)-1)/2) * barWidth
		thr.Add(bars)
		legend.Add(v.label, bars)
		if len(p99) > 0 {
			line, points, err := plotter.NewLinePoints(p99)
			if err != nil {
				return err
			}
			line.Color = palette[v.id]
			line.Width = vg.Points(1.5)
			points.Color = palette[v.id]
			points.Shape = draw.CircleGlyph{}
			points.Radius = vg.Points(3.5)
			lat.Add(line, points)
		}
	}
	thr.Y.Max *= 1.08 // headroom above the tallest bar
	thr.Y.Tick.Marker = wholeTicks{}
	lat.Y.Scale = plot.LogScale{}
	lat.Y.Tick.Marker = plot.LogTicks{Prec: -1}
	lat.Y.Min, lat.Y.Max = lat.Y.Min/1.5, lat.Y.Max*1.5

	const w, h = 16 * vg.Inch, 6.4 * vg.Inch
	img := vgimg.NewWith(vgimg.UseWH(w, h), vgimg.UseDPI(100), vgimg.UseBackgroundColor(color.White))
	dc := draw.New(img)
	const legendWidth = 4.6 * vg.Inch
	plots := draw.Crop(dc, 0, -legendWidth, 0, 0)
	tiles := plot.Align([][]*plot.Plot{{thr, lat}}, draw.Tiles{Rows: 1, Cols: 2, PadX: vg.Points(12), PadTop: vg.Points(6), PadBottom: vg.Points(6), PadLeft: vg.Points(6)}, plots)
	thr.Draw(tiles[0][0])
	lat.Draw(tiles[0][1])
	legendArea := draw.Crop(dc, w-legendWidth+vg.Points(8), 0, 0, -vg.Points(40))
	legend.Draw(legendArea)

	f, err := os.Create(path)
	if err != nil {
		return err
	}
	if _, err := (vgimg.PngCanvas{Canvas: img}).WriteTo(f); err != nil {
		return fmt.Errorf("%s: %w", path, errors.Join(err, f.Close()))
	}
	return f.Close()
}

// wholeTicks are plot.DefaultTicks labelled without decimals (requests per
// second are whole numbers).
type wholeTicks struct{}

func (wholeTicks) Ticks(lo, hi float64) []plot.Tick {
	ticks := plot.DefaultTicks{}.Ticks(lo, hi)
	for i := range ticks {
		if ticks[i].Label != "" {
			ticks[i].Label = strconv.FormatFloat(ticks[i].Value, 'f', 0, 64)
		}
	}
	return ticks
}
