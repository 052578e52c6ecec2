// Command stormplot renders the picture of idem's metrics after a storm
// (docs/img/storm-metrics.png, docs/observability.md): given two scrapes of
// a paymentsd's GET /metrics, before and after, it draws the increase of
// idem_decisions_total by decision and the distribution of the
// idem_handler_duration_seconds observations made in between.
//
//	go run ./cmd/idembench/stormplot -before before.txt -after after.txt -o docs/img/storm-metrics.png
//
// storm.sh beside it runs the storm and the scrapes.
package main

import (
	"errors"
	"flag"
	"fmt"
	"image/color"
	"io"
	"math"
	"os"
	"slices"
	"strconv"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
	"gonum.org/v1/plot"
	"gonum.org/v1/plot/plotter"
	"gonum.org/v1/plot/vg"
	"gonum.org/v1/plot/vg/draw"
	"gonum.org/v1/plot/vg/vgimg"
)

// decisions is the order of the bars: idem.EventKind's names.
var decisions = []string{"executed", "replayed", "in_flight", "key_reused", "released", "taken_over",
	"lease_lost", "store_unavailable", "completion_failed"}

func main() {
	if err := run(os.Args[1:], os.Stdout); err != nil {
		fmt.Fprintln(os.Stderr, "stormplot:", err)
		os.Exit(1)
	}
}

func run(args []string, out io.Writer) error {
	fs := flag.NewFlagSet("stormplot", flag.ContinueOnError)
	before := fs.String("before", "", "scrape of /metrics before the storm (Prometheus text format)")
	after := fs.String("after", "", "scrape of /metrics after the storm")
	png := fs.String("o", "storm-metrics.png", "PNG to write")
	title := fs.String("title", "", "title above the decisions panel")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if *before == "" || *after == "" {
		return errors.New("-before and -after are required")
	}
	b, err := parse(*before)
	if err != nil {
		return err
	}
	a, err := parse(*after)
	if err != nil {
		return err
	}
	counts := decisionIncrease(b, a)
	bounds, buckets := handlerIncrease(b, a)
	for _, d := range decisions {
		if _, err := fmt.Fprintf(out, "%-18s %6.0f\n", d, counts[d]); err != nil {
			return err
		}
	}
	return render(*png, *title, counts, bounds, buckets)
}

func parse(path string) (map[string]*dto.MetricFamily, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer func() { _ = f.Close() }() // opened read-only: closing it loses nothing
	p := expfmt.NewTextParser(model.UTF8Validation)
	mfs, err := p.TextToMetricFamilies(f)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	return mfs, nil
}

func label(m *dto.Metric, name string) string {
	for _, l := range m.GetLabel() {
		if l.GetName() == name {
			return l.GetValue()
		}
	}
	return ""
}

// decisionIncrease is after - before of idem_decisions_total, summed by
// idem_decision.
func decisionIncrease(before, after map[string]*dto.MetricFamily) map[string]float64 {
	out := map[string]float64{}
	for _, m := range after["idem_decisions_total"].GetMetric() {
		out[label(m, "idem_decision")] += m.GetCounter().GetValue()
	}
	for _, m := range before["idem_decisions_total"].GetMetric() {
		out[label(m, "idem_decision")] -= m.GetCounter().GetValue()
	}
	return out
}

// handlerIncrease is after - before of idem_handler_duration_seconds, all
// series summed, per bucket (not cumulative): counts[i] observations in
// (bounds[i-1], bounds[i]], the last one past the last bound.
func handlerIncrease(before, after map[string]*dto.MetricFamily) (bounds, counts []float64) {
	cumulative := map[float64]float64{}
	var total float64
	add := func(mf *dto.MetricFamily, sign float64) {
		for _, m := range mf.GetMetric() {
			h := m.GetHistogram()
			total += sign * float64(h.GetSampleCount())
			for _, b := range h.GetBucket() {
				if math.IsInf(b.GetUpperBound(), 1) {
					continue // the total, counted above
				}
				cumulative[b.GetUpperBound()] += sign * float64(b.GetCumulativeCount())
			}
		}
	}
	add(after["idem_handler_duration_seconds"], 1)
	add(before["idem_handler_duration_seconds"], -1)
	for b := range cumulative {
		bounds = append(bounds, b)
	}
	slices.Sort(bounds)
	var prev float64
	for _, b := range bounds {
		counts = append(counts, cumulative[b]-prev)
		prev = cumulative[b]
	}
	counts = append(counts, total-prev)
	return bounds, counts
}

// seconds prints a bucket bound.
func seconds(s float64) string {
	if s < 1 {
		return strconv.FormatFloat(s*1000, 'f', -1, 64) + "ms"
	}
	return strconv.FormatFloat(s, 'f', -1, 64) + "s"
}

func render(path, title string, counts map[string]float64, bounds, buckets []float64) error {
	dtitle := "idem_decisions_total: increase during the storm"
	if title != "" {
		dtitle = title
	}
	vals := make(plotter.Values, len(decisions))
	for i, d := range decisions {
		vals[i] = counts[d]
	}
	dec, err := barPlot(dtitle, "decisions", decisions, vals, 22, color.RGBA{R: 0x2b, G: 0x6c, B: 0xb0, A: 0xff})
	if err != nil {
		return err
	}
	labels, err := plotter.NewLabels(plotter.XYLabels{XYs: barTops(vals), Labels: texts(vals)})
	if err != nil {
		return err
	}
	dec.Add(labels)

	names := make([]string, len(buckets))
	for i := range buckets {
		switch {
		case i < len(bounds):
			names[i] = "≤" + seconds(bounds[i])
		default:
			names[i] = ">" + seconds(bounds[len(bounds)-1])
		}
	}
	hist, err := barPlot("idem_handler_duration_seconds: executions by bucket", "executions", names, buckets, 14,
		color.RGBA{R: 0xd9, G: 0x6c, B: 0x1e, A: 0xff})
	if err != nil {
		return err
	}

	w, h := 12*vg.Inch, 4.8*vg.Inch
	img := vgimg.NewWith(vgimg.UseWH(w, h), vgimg.UseDPI(100), vgimg.UseBackgroundColor(color.White))
	dc := draw.New(img)
	tiles := plot.Align([][]*plot.Plot{{dec, hist}}, draw.Tiles{Rows: 1, Cols: 2, PadX: vg.Points(16), PadTop: vg.Points(6),
		PadBottom: vg.Points(6), PadLeft: vg.Points(6), PadRight: vg.Points(6)}, dc)
	dec.Draw(tiles[0][0])
	hist.Draw(tiles[0][1])
	f, err := os.Create(path)
	if err != nil {
		return err
	}
	if _, err := (vgimg.PngCanvas{Canvas: img}).WriteTo(f); err != nil {
		return errors.Join(err, f.Close())
	}
	return f.Close()
}

func barTops(v plotter.Values) plotter.XYs {
	xys := make(plotter.XYs, len(v))
	for i, y := range v {
		xys[i] = plotter.XY{X: float64(i) - 0.15, Y: y}
	}
	return xys
}

func texts(v plotter.Values) []string {
	out := make([]string, len(v))
	for i, y := range v {
		out[i] = strconv.FormatFloat(y, 'f', 0, 64)
	}
	return out
}

// barPlot is a bar chart of vals named by names (slanted labels), bars
// width points wide.
func barPlot(title, ylabel string, names []string, vals plotter.Values, width float64, c color.Color) (*plot.Plot, error) {
	p := plot.New()
	p.Title.Text = title
	p.Y.Label.Text = ylabel
	bars, err := plotter.NewBarChart(vals, vg.Points(width))
	if err != nil {
		return nil, err
	}
	bars.Color = c
	p.Add(bars)
	p.NominalX(names...)
	p.X.Tick.Label.Rotation = 0.6
	p.X.Tick.Label.XAlign = draw.XRight
	return p, nil
}
