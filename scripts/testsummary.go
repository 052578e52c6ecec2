//go:build ignore

// testsummary reads `go test -json` on stdin and writes what `go test`
// without -v would (each package's result line, the output of failing
// tests, build errors), then a count of the tests run:
//
//	N passed, N failed, N skipped
//
// alone on a line, and the skipped tests with their reasons. Subtests
// count as tests. A package that fails with no failing test (a build
// error, a panic outside a test, a TestMain exit) counts as one failure.
// It exits 1 when anything failed. Used by scripts/test:
//
//	go test -json ./... | go run scripts/testsummary.go
//
// Standard library only, and not part of any package (build tag ignore).
package main

import (
	"bufio"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"sort"
	"strings"
)

type event struct {
	Action     string
	Package    string
	Test       string
	Output     string
	ImportPath string // build-output events
}

type key struct{ pkg, test string }

type skip struct {
	name, reason string
}

func main() {
	os.Exit(summarize(os.Stdin, os.Stdout))
}

func summarize(in io.Reader, out io.Writer) int {
	var (
		output         = map[key][]string{} // a running test's output
		passed, failed int
		skips          []skip
		failedTests    = map[string]int{} // by package
		brokenPkgs     []string
		sc             = bufio.NewScanner(in)
	)
	sc.Buffer(make([]byte, 1<<20), 64<<20)
	for sc.Scan() {
		line := sc.Bytes()
		var e event
		if len(line) == 0 || line[0] != '{' || json.Unmarshal(line, &e) != nil {
			fmt.Fprintf(out, "%s\n", line) // not go test's JSON: pass it on
			continue
		}
		k := key{e.Package, e.Test}
		switch {
		case e.Action == "build-output":
			fmt.Fprint(out, e.Output)
		case e.Test == "" && e.Action == "output":
			fmt.Fprint(out, e.Output) // ok/FAIL lines, output outside tests
		case e.Test == "" && e.Action == "fail":
			if failedTests[e.Package] == 0 {
				failed++
				brokenPkgs = append(brokenPkgs, e.Package)
			}
		case e.Action == "output":
			output[k] = append(output[k], e.Output)
		case e.Action == "pass":
			passed++
			delete(output, k)
		case e.Action == "fail":
			failed++
			failedTests[e.Package]++
			fmt.Fprint(out, strings.Join(output[k], ""))
			delete(output, k)
		case e.Action == "skip":
			skips = append(skips, skip{e.Package + "." + e.Test, reason(output[k])})
			delete(output, k)
		}
	}
	if err := sc.Err(); err != nil {
		fmt.Fprintf(out, "testsummary: reading go test -json: %v\n", err)
		failed++
	}
	fmt.Fprintln(out)
	sort.Slice(skips, func(i, j int) bool { return skips[i].name < skips[j].name })
	for _, s := range skips {
		fmt.Fprintf(out, "SKIP %s: %s\n", s.name, s.reason)
	}
	for _, p := range brokenPkgs {
		fmt.Fprintf(out, "FAIL %s: the package failed outside any test (see above)\n", p)
	}
	fmt.Fprintf(out, "%d passed, %d failed, %d skipped\n", passed, failed, len(skips))
	if failed > 0 {
		return 1
	}
	return 0
}

// reason is what a skipped test logged: its t.Skip message and any t.Log
// before it, without go test's framing lines.
func reason(lines []string) string {
	var msgs []string
	for _, l := range lines {
		t := strings.TrimSpace(l)
		switch {
		case t == "", strings.HasPrefix(t, "=== "), strings.HasPrefix(t, "--- SKIP"):
			continue
		}
		msgs = append(msgs, t)
	}
	if len(msgs) == 0 {
		return "(no reason given)"
	}
	if len(msgs) > 3 {
		msgs = msgs[len(msgs)-3:]
	}
	return strings.Join(msgs, " / ")
}
