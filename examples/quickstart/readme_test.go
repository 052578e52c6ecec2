package main

import (
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/idemgo/idem/internal/transcript"
)

const readme = "../../README.md"

// TestREADME: the README's quick start is main.go byte for byte, and its
// "In your own server" is postgres/main.go between the README markers (one
// tab of indentation less), so what the README shows is what compiles.
func TestREADME(t *testing.T) {
	md, err := os.ReadFile(readme)
	if err != nil {
		t.Fatal(err)
	}
	blocks := transcript.Blocks(string(md))
	for _, c := range []struct{ section, file, want string }{
		{"Quick start", "main.go", ""},
		{"In your own server", "postgres/main.go", "region"},
	} {
		src, err := os.ReadFile(c.file)
		if err != nil {
			t.Fatal(err)
		}
		want := string(src)
		if c.want == "region" {
			want = region(t, c.file, want)
		}
		got := transcript.InSection(blocks, "go", c.section)
		if len(got) == 0 {
			t.Errorf("%s: no go block under %q", readme, c.section)
			continue
		}
		if got[0].Text != want {
			t.Errorf("%s:%d: the go block under %q is not %s; want:\n%s", readme, got[0].Line, c.section, c.file, want)
		}
	}
}

// region returns the lines of src between "// README begin" and
// "// README end", each without its first tab.
func region(t *testing.T, file, src string) string {
	_, after, ok := strings.Cut(src, "\t// README begin\n")
	body, _, ok2 := strings.Cut(after, "\t// README end\n")
	if !ok || !ok2 {
		t.Fatalf("%s: no README markers", file)
	}
	var b strings.Builder
	for _, line := range strings.SplitAfter(body, "\n") {
		b.WriteString(strings.TrimPrefix(line, "\t"))
	}
	return b.String()
}

// TestQuickStart builds the module's programs, runs the quick start on a
// free port in a temporary directory, and runs the README's curl session
// of the quick start against it (internal/transcript): every status line,
// header (Date aside) and body as shown.
func TestQuickStart(t *testing.T) {
	for _, tool := range []string{"go", "bash", "curl"} {
		if _, err := exec.LookPath(tool); err != nil {
			if os.Getenv("CI") != "" {
				t.Fatalf("no %s on PATH, and CI is set", tool)
			}
			t.Skipf("no %s on PATH", tool)
		}
	}
	bin := t.TempDir()
	if out, err := exec.Command("go", "build", "-o", bin, "./...").CombinedOutput(); err != nil {
		t.Fatalf("go build ./...: %v\n%s", err, out)
	}

	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := l.Addr().String()
	l.Close()
	srv := exec.Command(filepath.Join(bin, "quickstart"), "-addr", addr)
	srv.Dir = t.TempDir()
	logs, err := os.Create(filepath.Join(t.TempDir(), "log"))
	if err != nil {
		t.Fatal(err)
	}
	srv.Stdout, srv.Stderr = logs, logs
	if err := srv.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan error, 1)
	go func() { exited <- srv.Wait() }()
	t.Cleanup(func() {
		_ = srv.Process.Kill()
		<-exited
	})
	serverLog := func() string { b, _ := os.ReadFile(logs.Name()); return string(b) }

	// Wait until the port accepts, or the program exits.
	deadline := time.After(30 * time.Second)
	tick := time.NewTicker(10 * time.Millisecond)
	defer tick.Stop()
	for {
		if c, err := net.Dial("tcp", addr); err == nil {
			c.Close()
			break
		}
		select {
		case err := <-exited:
			t.Fatalf("quickstart exited: %v\n%s", err, serverLog())
		case <-deadline:
			t.Fatalf("quickstart does not accept on %s\n%s", addr, serverLog())
		case <-tick.C:
		}
	}

	md, err := os.ReadFile(readme)
	if err != nil {
		t.Fatal(err)
	}
	var steps []transcript.Step
	for _, b := range transcript.InSection(transcript.Blocks(string(md)), "console", "Quick start") {
		steps = append(steps, transcript.Steps(b)...)
	}
	var runnable []transcript.Step
	for _, s := range steps {
		if !strings.HasPrefix(s.Command, "go ") && !strings.HasPrefix(s.Command, "cd ") {
			runnable = append(runnable, s)
		}
	}
	if len(runnable) < 3 {
		t.Fatalf("%s: %d curl commands under Quick start, want the POST, its retry and the reused key", readme, len(runnable))
	}
	(&transcript.Session{
		File:    readme,
		Dir:     t.TempDir(),
		Replace: strings.NewReplacer("127.0.0.1:8080", addr),
		Trim:    []string{"Date"},
	}).Run(t, runnable)
}
