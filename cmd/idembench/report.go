package main

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"time"
)

// sumKey names the cells of one variant at one concurrency on one database.
type sumKey struct {
	db, variant string
	conc        int
}

// summary gathers a sumKey's rounds.
type summary struct {
	rps           []float64       // per round
	ratio         []float64       // per round: rps / the bare handler's rps of the same round
	floorRatio    []float64       // the variants of floorOf only: rps / their floor's rps of the same round
	contractRatio []float64       // the variants of contractFloorOf only: rps / the contract floor's rps of the same round
	p50, p99      []time.Duration // per round
	n, errs       int
	firstErr      string
}

type roundKey struct {
	db          string
	conc, round int
}

// floorOf is the floor of each answer: of each mode's first execution, its
// statements sent by hand; of a replay, a 409 and a 422, the record read by
// hand (the replay floor); with no middleware. The wait mode's first
// execution is measured against the same without the wait mode (issue 36:
// at least 0.95 while nobody waits).
var floorOf = map[string]string{vClaimTx: vFloor, vOneCommit: vFloor1c, vReplay: vFloorRead, vInFlight: vFloorRead, vKeyReused: vFloorRead,
	vWait: vClaimTx}

// contractFloorOf is the second floor of a replay, a 409 and a 422: the
// replay floor with what the contract asks of an answer (floorContract).
var contractFloorOf = map[string]string{vReplay: vContract, vInFlight: vContract, vKeyReused: vContract}

// floorRows label the ratio of each answer to its floor, in the report's
// order; contract marks the ratios to the contract floor.
var floorRows = []struct {
	variant, label string
	contract       bool
}{
	{vClaimTx, "idem durable-claim first execution, ratio to the floor", false},
	{vOneCommit, "idem one-commit first execution, ratio to the one-commit floor", false},
	{vWait, "idem wait mode first execution, nobody waiting, ratio to idem-tx (the same without wait mode)", false},
	{vReplay, "idem replay, ratio to the replay floor", false},
	{vInFlight, "idem 409, ratio to the replay floor", false},
	{vKeyReused, "idem 422, ratio to the replay floor", false},
	{vReplay, "idem replay, ratio to the contract floor", true},
	{vInFlight, "idem 409, ratio to the contract floor", true},
	{vKeyReused, "idem 422, ratio to the contract floor", true},
}

// summarize groups cells by sumKey and takes each round's ratios against
// the bare handler (and, for a first execution, its floor: floorOf) of the
// same database, concurrency and round.
func summarize(cells []cell) map[sumKey]*summary {
	type variantRound struct {
		variant string
		roundKey
	}
	rps := map[variantRound]float64{}
	for _, c := range cells {
		rps[variantRound{c.variant, roundKey{c.db, c.conc, c.round}}] = c.rps
	}
	sums := map[sumKey]*summary{}
	for _, c := range cells {
		k := sumKey{c.db, c.variant, c.conc}
		s := sums[k]
		if s == nil {
			s = &summary{}
			sums[k] = s
		}
		s.rps = append(s.rps, c.rps)
		s.p50 = append(s.p50, c.p50)
		s.p99 = append(s.p99, c.p99)
		s.n += c.n
		s.errs += c.errs
		if s.firstErr == "" {
			s.firstErr = c.firstErr
		}
		rk := roundKey{c.db, c.conc, c.round}
		if b := rps[variantRound{vBare, rk}]; b > 0 {
			s.ratio = append(s.ratio, c.rps/b)
		}
		if fl, ok := floorOf[c.variant]; ok {
			if f := rps[variantRound{fl, rk}]; f > 0 {
				s.floorRatio = append(s.floorRatio, c.rps/f)
			}
		}
		if fl, ok := contractFloorOf[c.variant]; ok {
			if f := rps[variantRound{fl, rk}]; f > 0 {
				s.contractRatio = append(s.contractRatio, c.rps/f)
			}
		}
	}
	return sums
}

func median(xs []float64) float64 {
	if len(xs) == 0 {
		return 0
	}
	s := slices.Clone(xs)
	slices.Sort(s)
	if len(s)%2 == 1 {
		return s[len(s)/2]
	}
	return (s[len(s)/2-1] + s[len(s)/2]) / 2
}

func medianDuration(ds []time.Duration) time.Duration {
	xs := make([]float64, len(ds))
	for i, d := range ds {
		xs[i] = float64(d)
	}
	return time.Duration(median(xs))
}

// ratioCell formats per-round ratios: the median, and the range when there
// is more than one round.
func ratioCell(rs []float64, suffix string) string {
	if len(rs) == 0 {
		return "–"
	}
	s := fmt.Sprintf("%.2f%s", median(rs), suffix)
	if len(rs) > 1 {
		s += fmt.Sprintf(" (%.2f-%.2f)", slices.Min(rs), slices.Max(rs))
	}
	return s
}

func ms(d time.Duration) string {
	return strconv.FormatFloat(float64(d.Microseconds())/1000, 'f', 2, 64)
}

// machine describes where the run happened.
type machine struct {
	cpus     int
	cpuModel string
	memory   string
	os       string
	goVer    string
	// loadStart and loadEnd are /proc/loadavg's 1, 5 and 15 minute load
	// averages when the run began and ended: others' work on the machine.
	loadStart, loadEnd string
	// revision is the repository's commit (see revision).
	revision string
}

// revision names the checked-out commit of the repository in the working
// directory ("-dirty" when files differ from it), or "" outside git.
func revision() string {
	out, err := exec.Command("git", "rev-parse", "--short", "HEAD").Output()
	if err != nil {
		return ""
	}
	rev := strings.TrimSpace(string(out))
	if st, err := exec.Command("git", "status", "--porcelain", "--untracked-files=no").Output(); err == nil && len(bytes.TrimSpace(st)) > 0 {
		rev += "-dirty"
	}
	return rev
}

// loadAverage returns the three load averages of /proc/loadavg, or "".
func loadAverage() string {
	b, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return ""
	}
	f := strings.Fields(string(b))
	if len(f) < 3 {
		return ""
	}
	return strings.Join(f[:3], " ")
}

func describeMachine() machine {
	m := machine{cpus: runtime.NumCPU(), goVer: runtime.Version(), cpuModel: "unknown CPU", os: runtime.GOOS, loadStart: loadAverage(), revision: revision()}
	if v := firstField("/proc/cpuinfo", "model name", ":"); v != "" {
		m.cpuModel = v
	}
	if v := firstField("/proc/meminfo", "MemTotal", ":"); v != "" {
		if kb, err := strconv.ParseFloat(strings.TrimSpace(strings.TrimSuffix(v, "kB")), 64); err == nil {
			m.memory = fmt.Sprintf("%.0f GiB", kb/(1<<20))
		}
	}
	if v := firstField("/etc/os-release", "PRETTY_NAME", "="); v != "" {
		m.os = strings.Trim(v, `"`)
	}
	return m
}

// firstField returns the value of the first "name<sep>value" line of file.
func firstField(file, name, sep string) string {
	f, err := os.Open(file)
	if err != nil {
		return ""
	}
	defer func() { _ = f.Close() }() // opened read-only: closing it loses nothing
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		k, v, ok := strings.Cut(sc.Text(), sep)
		if ok && strings.TrimSpace(k) == name {
			return strings.TrimSpace(v)
		}
	}
	return ""
}

// report is one run's results.
type report struct {
	started  time.Time
	elapsed  time.Duration
	command  string
	machine  machine
	redis    string // the Redis server's version, "" without the naive cache
	opts     options
	targets  []*target
	variants []variant
	cells    []cell
	sums     map[sumKey]*summary
	allocs   []allocs
}

// errors returns a line per variant and concurrency whose answers were not
// all the expected ones.
func (r *report) errors() []string {
	var out []string
	for _, t := range r.targets {
		for _, v := range r.variants {
			for _, c := range r.opts.concurrency {
				if s := r.sums[sumKey{t.slug, v.id, c}]; s != nil && s.errs > 0 {
					out = append(out, fmt.Sprintf("%s %s c=%d: %d of %d answers unexpected (first: %s)", t.name, v.id, c, s.errs, s.n, s.firstErr))
				}
			}
		}
	}
	return out
}

func (r *report) concHeader(b *strings.Builder, first string) {
	b.WriteString("| " + first + " |")
	for _, c := range r.opts.concurrency {
		fmt.Fprintf(b, " c=%d |", c)
	}
	b.WriteString("\n|---|")
	for range r.opts.concurrency {
		b.WriteString("---|")
	}
	b.WriteString("\n")
}

// ratioTable is the ratio table for one database: the bare handler in
// requests per second, every other variant as a ratio to it (median of the
// rounds, and their range), and each mode's first execution as a ratio to
// its floor (floorRows).
func (r *report) ratioTable(t *target) string {
	var b strings.Builder
	r.concHeader(&b, t.name)
	for _, v := range r.variants {
		if v.id == vBare {
			b.WriteString("| " + v.label + ", req/s |")
			for _, c := range r.opts.concurrency {
				if s := r.sums[sumKey{t.slug, v.id, c}]; s != nil {
					fmt.Fprintf(&b, " %.0f |", median(s.rps))
				} else {
					b.WriteString(" – |")
				}
			}
			b.WriteString("\n")
			continue
		}
		r.ratioRow(&b, t, v.label+", ratio to bare", v.id, "x", func(s *summary) []float64 { return s.ratio })
	}
	for _, row := range floorRows {
		floor, pick := floorOf[row.variant], func(s *summary) []float64 { return s.floorRatio }
		if row.contract {
			floor, pick = contractFloorOf[row.variant], func(s *summary) []float64 { return s.contractRatio }
		}
		if r.measured(row.variant) && r.measured(floor) {
			r.ratioRow(&b, t, row.label, row.variant, "", pick)
		}
	}
	return b.String()
}

// ratioRow writes one row of t's ratio table: label, then per concurrency
// the ratios pick takes from variant's summary, with unit after each.
func (r *report) ratioRow(b *strings.Builder, t *target, label, variant, unit string, pick func(*summary) []float64) {
	b.WriteString("| " + label + " |")
	for _, c := range r.opts.concurrency {
		var rs []float64
		if s := r.sums[sumKey{t.slug, variant, c}]; s != nil {
			rs = pick(s)
		}
		fmt.Fprintf(b, " %s |", ratioCell(rs, unit))
	}
	b.WriteString("\n")
}

// measured reports whether the run measures the variant id.
func (r *report) measured(id string) bool {
	return slices.ContainsFunc(r.variants, func(v variant) bool { return v.id == id })
}

// latencyTable gives each cell's median throughput, p50 and p99.
func (r *report) latencyTable(t *target) string {
	var b strings.Builder
	r.concHeader(&b, t.name+": req/s, p50 / p99 ms")
	for _, v := range r.variants {
		b.WriteString("| " + v.label + " |")
		for _, c := range r.opts.concurrency {
			s := r.sums[sumKey{t.slug, v.id, c}]
			if s == nil {
				b.WriteString(" – |")
				continue
			}
			fmt.Fprintf(&b, " %.0f, %s / %s |", median(s.rps), ms(medianDuration(s.p50)), ms(medianDuration(s.p99)))
		}
		b.WriteString("\n")
	}
	return b.String()
}

// allocTable gives the allocations per request of each variant per database.
func (r *report) allocTable() string {
	if len(r.allocs) == 0 {
		return ""
	}
	idx := map[[2]string]allocs{}
	for _, a := range r.allocs {
		idx[[2]string{a.db, a.variant}] = a
	}
	var b strings.Builder
	b.WriteString("| allocations per request, B per request |")
	for _, t := range r.targets {
		b.WriteString(" " + t.name + " |")
	}
	b.WriteString("\n|---|")
	for range r.targets {
		b.WriteString("---|")
	}
	b.WriteString("\n")
	for _, v := range r.variants {
		b.WriteString("| " + v.label + " |")
		for _, t := range r.targets {
			if a, ok := idx[[2]string{t.slug, v.id}]; ok {
				fmt.Fprintf(&b, " %.0f, %.1f KiB |", a.perReq, a.bytesPerReq/1024)
			} else {
				b.WriteString(" – |")
			}
		}
		b.WriteString("\n")
	}
	return b.String()
}

// plotFile is the PNG of target slug, relative to the docs directory.
func plotFile(slug string) string { return "img/idembench-" + slug + ".png" }

// markdown renders the whole report. withPlots adds the figures' image
// links (written next to the document by writeDocs).
func (r *report) markdown(withPlots bool) string {
	var b strings.Builder
	m := r.machine
	fmt.Fprintf(&b, "Run on %s UTC (%s)", r.started.UTC().Format("2006-01-02 15:04"), r.elapsed.Round(time.Second))
	if m.revision != "" {
		fmt.Fprintf(&b, " at commit `%s`", m.revision)
	}
	fmt.Fprintf(&b, ": `%s`.\n\n", r.command)
	fmt.Fprintf(&b, "Machine: %d CPUs (%s)", m.cpus, m.cpuModel)
	if m.memory != "" {
		fmt.Fprintf(&b, ", %s", m.memory)
	}
	fmt.Fprintf(&b, ", %s, %s.", m.os, m.goVer)
	for _, t := range r.targets {
		fmt.Fprintf(&b, " %s.", t.version)
	}
	if r.redis != "" {
		fmt.Fprintf(&b, " %s.", r.redis)
	}
	fmt.Fprintf(&b, " The servers and the load generator share the machine")
	if m.loadStart != "" {
		fmt.Fprintf(&b, ", and so does whatever else ran then: load average (1, 5, 15 min) %s at the start, %s at the end", m.loadStart, m.loadEnd)
	}
	b.WriteString(".\n\n")
	rounds := fmt.Sprintf("%d rounds", r.opts.rounds)
	if r.opts.rounds == 1 {
		rounds = "1 round"
	}
	fmt.Fprintf(&b, "%s; in each, every database and concurrency runs every variant for %s (closed loop: each of c workers sends its next request when the last is answered, over HTTP/1.1 keep-alive on loopback), in two halves: the variants in order, then in the reverse order, the order rotated from round to round. A ratio is taken within a round, against the bare handler of the same database, concurrency and round; tables give the median of the rounds and, in brackets, their range. Pools: %d connections.\n\n",
		rounds, r.opts.duration, poolSize)
	for _, t := range r.targets {
		fmt.Fprintf(&b, "### %s\n\n", t.version)
		if t.filled != "" {
			fmt.Fprintf(&b, "%s.\n\n", t.filled)
		}
		if withPlots {
			fmt.Fprintf(&b, "![%s: throughput and p99 per concurrency](%s)\n\n", t.name, plotFile(t.slug))
		}
		b.WriteString(r.ratioTable(t))
		b.WriteString("\n")
		b.WriteString(r.latencyTable(t))
		b.WriteString("\n")
	}
	if at := r.allocTable(); at != "" {
		fmt.Fprintf(&b, "### Allocations per request\n\n")
		fmt.Fprintf(&b, "Measured by the same command: %d requests of each variant served in process, one at a time (`ServeHTTP`, no network), the runtime's malloc counters divided by the count; the handler's and the driver's allocations included, so idem's own share of a first execution is its row less the bare handler's.\n\n", r.opts.allocRequests)
		b.WriteString(at)
		b.WriteString("\n")
	}
	if errs := r.errors(); len(errs) > 0 {
		b.WriteString("**Unexpected answers** (these cells are not valid):\n\n")
		for _, e := range errs {
			b.WriteString("- " + e + "\n")
		}
		b.WriteString("\n")
	}
	return b.String()
}

// Markers of the block of docs/benchmarks.md that the command rewrites.
const (
	docsBegin = "<!-- idembench:begin: written by cmd/idembench --docs; change the command, not this block -->"
	docsEnd   = "<!-- idembench:end -->"
)

// replaceBlock returns doc with the text between the markers replaced by
// block; the markers must each appear once, in order.
func replaceBlock(doc, block string) (string, error) {
	i, j := strings.Index(doc, docsBegin), strings.Index(doc, docsEnd)
	if i < 0 || j < i || strings.Count(doc, docsBegin) != 1 || strings.Count(doc, docsEnd) != 1 {
		return "", errors.New("the document needs one line " + docsBegin + " and, after it, one line " + docsEnd)
	}
	return doc[:i+len(docsBegin)] + "\n\n" + strings.TrimSpace(block) + "\n\n" + doc[j:], nil
}

// writeDocs writes the plots into dir/img and the report into
// dir/benchmarks.md's block.
func (r *report) writeDocs(dir string) error {
	path := filepath.Join(dir, "benchmarks.md")
	doc, err := os.ReadFile(path)
	if err != nil {
		return err
	}
	out, err := replaceBlock(string(doc), r.markdown(true))
	if err != nil {
		return fmt.Errorf("%s: %w", path, err)
	}
	if err := os.MkdirAll(filepath.Join(dir, "img"), 0o755); err != nil {
		return err
	}
	for _, t := range r.targets {
		if err := writePlot(filepath.Join(dir, plotFile(t.slug)), t.name, r.opts.concurrency, r.variants, r.sums, t.slug); err != nil {
			return err
		}
	}
	return os.WriteFile(path, []byte(out), 0o644)
}
