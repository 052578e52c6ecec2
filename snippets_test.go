package idem_test

import (
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"github.com/idemgo/idem/internal/transcript"
)

// snippet is a piece of Go code shown in the documentation.
type snippet struct {
	where string   // file:line of its first line
	what  string   // "```go block" or "doc comment code"
	lines []string // normalized (see normalize)
}

// callsIdem matches a code block of a Go comment that uses an idem package
// (idem.NewMiddleware, idemclient.New, ...): those are the ones checked;
// the others are URLs, SQL, tables or diagrams.
var callsIdem = regexp.MustCompile(`\bidem[a-z]*\.[A-Z]`)

// TestSnippets: every ```go block of the repository's Markdown files
// (README.md, docs/*.md, the examples' READMEs) and every code block of a
// Go comment that uses an idem package (the package docs: doc.go, the
// adapters', idemotel's, idemclient's) is code the build compiles. Its
// lines, each without its leading and trailing spaces and the blank ones
// dropped, must be a contiguous run of the lines, trimmed the same way, of
// one .go file of the repository (not a //go:build ignore one): an Example
// of the package it shows, a program under examples/, or the package's own
// code (idemdriver's `var _ idemdriver.Maintainable = (*Driver)(nil)` is
// idemsqlite's line). go vet and go test compile those, so a snippet that
// names a removed API or does not compile fails there, and one edited in
// the documentation alone fails here.
//
// The files of every module are read as text, not built: the adapters,
// idemotel, cmd and the examples are modules of their own, compiled by
// their own go vet and go test.
func TestSnippets(t *testing.T) {
	t.Parallel()
	if _, err := os.Stat("cmd/go.mod"); err != nil {
		t.Skip("not in the repository (the root module alone, as in the module cache): the other modules' examples are not here")
	}
	var snippets []snippet
	corpus := map[string][]line{} // .go file -> its normalized lines
	err := filepath.WalkDir(".", func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() {
			name := d.Name()
			if path != "." && (strings.HasPrefix(name, ".") || name == "testdata" || name == "node_modules") {
				return filepath.SkipDir
			}
			return nil
		}
		switch {
		case strings.HasSuffix(path, ".md"):
			s, indented, err := markdownSnippets(path)
			if err != nil {
				return err
			}
			snippets = append(snippets, s...)
			for _, where := range indented {
				t.Errorf("%s: an indented ```go fence, which the block parser (internal/transcript) does not see: "+
					"start the fence at the start of its line", where)
			}
		case strings.HasSuffix(path, ".go"):
			src, err := os.ReadFile(path)
			if err != nil {
				return err
			}
			if strings.HasPrefix(string(src), "//go:build ignore\n") || strings.Contains(string(src), "\n//go:build ignore\n") {
				return nil // never compiled
			}
			var lines []line
			for i, l := range strings.Split(string(src), "\n") {
				if l = strings.TrimSpace(l); l != "" {
					lines = append(lines, line{l, i + 1})
				}
			}
			corpus[path] = lines
			if !strings.HasSuffix(path, "_test.go") {
				snippets = append(snippets, commentSnippets(path, string(src))...)
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}

	counts := map[string]int{}
	for _, s := range snippets {
		counts[s.what]++
		if len(s.lines) == 0 {
			t.Errorf("%s: an empty %s", s.where, s.what)
			continue
		}
		found, closest := find(corpus, s.lines)
		if found {
			continue
		}
		t.Errorf("%s: this %s is in no .go file of the repository, so nothing compiles it.\n"+
			"Put it, verbatim (only the indentation may differ), into an Example of the package it shows "+
			"(its example_test.go; a program of examples/ will do), with what it needs declared before it, "+
			"and make it compile; if it does not, fix the snippet here too.%s",
			s.where, s.what, closest)
	}
	if counts["```go block"] == 0 || counts["doc comment code"] == 0 {
		t.Fatalf("found %v: the walk missed the Markdown files or the doc comments", counts)
	}
	t.Logf("checked %v", counts)
}

// markdownSnippets returns the ```go blocks of a Markdown file, and where
// a ```go fence is indented (in a list item), which transcript.Blocks,
// reading fences at the start of a line only, would pass over.
func markdownSnippets(path string) (snippets []snippet, indented []string, err error) {
	md, err := os.ReadFile(path)
	if err != nil {
		return nil, nil, err
	}
	for i, line := range strings.Split(string(md), "\n") {
		if strings.HasPrefix(strings.TrimLeft(line, " \t"), "```go") && !strings.HasPrefix(line, "```") {
			indented = append(indented, location(path, i+1))
		}
	}
	for _, b := range transcript.Blocks(string(md)) {
		if strings.TrimSpace(b.Lang) == "go" {
			snippets = append(snippets, snippet{where: location(path, b.Line), what: "```go block", lines: normalize(strings.Split(b.Text, "\n"))})
		}
	}
	return snippets, indented, nil
}

// commentSnippets returns the code blocks (runs of lines indented with a
// tab, "//\t...") of the top-level comments of a Go file that use an idem
// package.
func commentSnippets(path, src string) []snippet {
	var out []snippet
	lines := strings.Split(src, "\n")
	for i := 0; i < len(lines); i++ {
		if !strings.HasPrefix(lines[i], "//\t") {
			continue
		}
		start := i
		var code []string
		for ; i < len(lines) && strings.HasPrefix(lines[i], "//\t"); i++ {
			code = append(code, strings.TrimPrefix(lines[i], "//"))
		}
		if callsIdem.MatchString(strings.Join(code, "\n")) {
			out = append(out, snippet{where: location(path, start+1), what: "doc comment code", lines: normalize(code)})
		}
	}
	return out
}

// normalize trims each line's surrounding spaces and drops the blank lines.
func normalize(lines []string) []string {
	var out []string
	for _, l := range lines {
		if l = strings.TrimSpace(l); l != "" {
			out = append(out, l)
		}
	}
	return out
}

// find reports whether want is a contiguous run of one file's lines; when
// it is not, closest describes the file that comes nearest (the most
// leading lines of want in a row), for the failure message.
func find(corpus map[string][]line, want []string) (found bool, closest string) {
	best, bestFile, bestAt := 0, "", 0
	for file, lines := range corpus {
		for i := range lines {
			n := 0
			for n < len(want) && i+n < len(lines) && lines[i+n].text == want[n] {
				n++
			}
			if n == len(want) {
				return true, ""
			}
			if n > best || (n == best && n > 0 && file < bestFile) {
				best, bestFile, bestAt = n, file, i
			}
		}
	}
	if best == 0 {
		return false, fmt.Sprintf("\nNo .go file has its first line:\n\t%s", want[0])
	}
	lines := corpus[bestFile]
	next := "(the end of the file)"
	if bestAt+best < len(lines) {
		next = fmt.Sprintf("%s:%d: %s", bestFile, lines[bestAt+best].n, lines[bestAt+best].text)
	}
	return false, fmt.Sprintf("\nClosest: %s:%d has its first %d line(s) in a row, then\n\t%s\nwhere the snippet has\n\t%s",
		bestFile, lines[bestAt].n, best, next, want[best])
}

// line is a normalized line of a .go file and its number.
type line struct {
	text string
	n    int
}

func location(path string, line int) string {
	return fmt.Sprintf("%s:%d", filepath.ToSlash(path), line)
}
