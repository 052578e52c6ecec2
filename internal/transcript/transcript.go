// Package transcript checks the console sessions of the documentation
// against a real run: it reads the ```console blocks of a Markdown file
// (a line starting with "$ " is a command, continued while it ends with a
// backslash; the lines up to the next command are its output), runs the
// commands one after another in one bash process, and compares each output
// with the one shown, the volatile parts masked.
package transcript

import (
	"bufio"
	"context"
	"fmt"
	"os"
	"os/exec"
	"regexp"
	"strings"
	"testing"
	"time"
)

// Code is a fenced code block of a Markdown file.
type Code struct {
	Section string // the heading the block is under, without its #s
	Lang    string // the info string: go, console, ...
	Line    int    // of the opening fence, from 1
	Text    string // the block's lines, each ending in a newline
}

// Blocks returns the fenced code blocks of md, in order.
func Blocks(md string) []Code {
	var blocks []Code
	var cur *Code
	section := ""
	for i, line := range strings.SplitAfter(md, "\n") {
		trimmed := strings.TrimRight(line, "\n")
		switch {
		case cur != nil && trimmed == "```":
			blocks = append(blocks, *cur)
			cur = nil
		case cur != nil:
			cur.Text += trimmed + "\n"
		case strings.HasPrefix(trimmed, "```"):
			cur = &Code{Section: section, Lang: strings.TrimPrefix(trimmed, "```"), Line: i + 1}
		case strings.HasPrefix(trimmed, "#"):
			section = strings.TrimSpace(strings.TrimLeft(trimmed, "#"))
		}
	}
	return blocks
}

// InSection returns the blocks of lang under the heading section.
func InSection(blocks []Code, lang, section string) []Code {
	var out []Code
	for _, b := range blocks {
		if b.Lang == lang && b.Section == section {
			out = append(out, b)
		}
	}
	return out
}

// Step is one command of a console block and the output shown for it.
type Step struct {
	Line    int    // of the command in the Markdown file
	Command string // without the "$ ", continuation lines included
	Want    string // the lines shown after it
}

// Steps splits a console block into its commands and their outputs.
func Steps(b Code) []Step {
	var steps []Step
	lines := strings.Split(strings.TrimSuffix(b.Text, "\n"), "\n")
	for i := 0; i < len(lines); i++ {
		cmd, ok := strings.CutPrefix(lines[i], "$ ")
		if !ok {
			if len(steps) == 0 {
				continue // output with no command: not runnable
			}
			steps[len(steps)-1].Want += lines[i] + "\n"
			continue
		}
		s := Step{Line: b.Line + 1 + i, Command: cmd}
		for strings.HasSuffix(s.Command, `\`) && i+1 < len(lines) {
			i++
			s.Command += "\n" + lines[i]
		}
		steps = append(steps, s)
	}
	return steps
}

// Session runs steps against a real server.
type Session struct {
	File string // the Markdown file's name, for messages
	Dir  string // the working directory of the shell

	// Replace rewrites each command before it runs (the documented address
	// into the test server's).
	Replace *strings.Replacer

	// Trim names the response headers the transcript leaves out (as its
	// text says), dropped from the real output.
	Trim []string

	// IDs matches the generated identifiers: each is renamed id1, id2, ...
	// in order of first appearance, in the transcript and in the run each,
	// so that the same id must appear where the transcript repeats one.
	IDs *regexp.Regexp

	// Compare, when not nil, may compare a step itself (handled true), for
	// an output that varies from run to run in more than the masked parts.
	Compare func(s Step, want, got string) (handled bool, err error)
}

// volatile are masked in both the transcript and the run.
var volatile = []struct {
	re   *regexp.Regexp
	with string
}{
	{regexp.MustCompile(`\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(\.\d+)?Z`), "<time>"},
	{regexp.MustCompile(`[A-Z][a-z]{2}, \d\d [A-Z][a-z]{2} \d{4} \d\d:\d\d:\d\d GMT`), "<http-date>"},
}

var statusLine = regexp.MustCompile(`^HTTP/[0-9.]+ \d{3}`)

// Run runs steps in one bash process, in order (a step sees the files and
// shell functions of the steps before it), and reports every output that
// differs from the transcript's. An id the transcript shows in a command is
// replaced by the run's id of the same name.
func (s *Session) Run(t *testing.T, steps []Step) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	sh := exec.CommandContext(ctx, "bash", "--noprofile", "--norc")
	sh.Dir = s.Dir
	stdin, err := sh.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	r, w, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	sh.Stdout, sh.Stderr = w, w
	if err := sh.Start(); err != nil {
		t.Fatal(err)
	}
	_ = w.Close()
	defer func() {
		_ = stdin.Close()
		_ = sh.Wait()
		_ = r.Close()
	}()
	out := bufio.NewReader(r)
	wantIDs, gotIDs := map[string]string{}, map[string]string{}
	for i, st := range steps {
		cmd := s.realIDs(st.Command, wantIDs, gotIDs)
		if s.Replace != nil {
			cmd = s.Replace.Replace(cmd)
		}
		marker := fmt.Sprintf("\036step %d\036\n", i)
		if _, err := fmt.Fprintf(stdin, "%s\nprintf '\\n\\036step %d\\036\\n'\n", cmd, i); err != nil {
			t.Fatalf("%s:%d: bash: %v", s.File, st.Line, err)
		}
		var got strings.Builder
		for {
			line, err := out.ReadString('\n')
			if line == marker {
				break
			}
			got.WriteString(line)
			if err != nil {
				t.Fatalf("%s:%d: $ %s\nbash: %v; its output:\n%s", s.File, st.Line, st.Command, err, got.String())
			}
		}
		want := s.mask(st.Want, wantIDs)
		masked := s.mask(s.trim(got.String()), gotIDs)
		if s.Compare != nil {
			if handled, err := s.Compare(st, want, masked); handled {
				if err != nil {
					t.Errorf("%s:%d: $ %s\n%v\nshown:\n%s\nrun:\n%s", s.File, st.Line, st.Command, err, want, masked)
				}
				continue
			}
		}
		if want != masked {
			t.Errorf("%s:%d: the transcript differs from a real run of\n$ %s\nshown (masked):\n%s\nrun (masked):\n%s", s.File, st.Line, st.Command, want, masked)
		}
	}
}

// realIDs replaces in cmd each id the transcript showed before by the id
// of the same name in the run; an id not shown before keeps its text and
// takes the next name on both sides.
func (s *Session) realIDs(cmd string, wantIDs, gotIDs map[string]string) string {
	if s.IDs == nil {
		return cmd
	}
	return s.IDs.ReplaceAllStringFunc(cmd, func(id string) string {
		name, ok := wantIDs[id]
		if !ok {
			name = fmt.Sprintf("<id%d>", len(wantIDs)+1)
			wantIDs[id] = name
		}
		for real, n := range gotIDs {
			if n == name {
				return real
			}
		}
		gotIDs[id] = name
		return id
	})
}

// trim drops the \r of the header lines, and the headers of s.Trim.
func (s *Session) trim(out string) string {
	var b strings.Builder
	inHeader := false
	for _, line := range strings.SplitAfter(out, "\n") {
		line = strings.Replace(line, "\r\n", "\n", 1)
		switch {
		case statusLine.MatchString(line):
			inHeader = true
		case line == "\n":
			inHeader = false
		case inHeader:
			name, _, _ := strings.Cut(line, ":")
			if s.trimmed(name) {
				continue
			}
		}
		b.WriteString(line)
	}
	return b.String()
}

func (s *Session) trimmed(name string) bool {
	for _, n := range s.Trim {
		if strings.EqualFold(n, name) {
			return true
		}
	}
	return false
}

// mask renames the ids (names keeps the names given so far), masks the
// volatile parts, and drops trailing newlines.
func (s *Session) mask(out string, names map[string]string) string {
	if s.IDs != nil {
		out = s.IDs.ReplaceAllStringFunc(out, func(id string) string {
			if _, ok := names[id]; !ok {
				names[id] = fmt.Sprintf("<id%d>", len(names)+1)
			}
			return names[id]
		})
	}
	for _, v := range volatile {
		out = v.re.ReplaceAllString(out, v.with)
	}
	return strings.TrimRight(out, "\n")
}
