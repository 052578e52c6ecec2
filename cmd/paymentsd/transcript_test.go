package main

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/idemgo/idem/internal/dbtest"
	"github.com/idemgo/idem/internal/transcript"
)

// TestTranscripts runs the console sessions of the README's demo section
// and of WALKTHROUGH.md against the real command (run, on SQLite in a
// temporary directory, the provider's 300 ms as documented), each document
// on a server of its own, through bash and curl, and compares every output
// with the one shown: status lines, the headers shown (Content-Length
// included), bodies. Masked: payment ids (renamed in order of appearance,
// so a replay must show the first id), timestamps, HTTP dates; dropped: the
// headers each document says it removes. The twenty concurrent requests
// are compared by shape (uniqueRace).
//
// WALKTHROUGH.md runs a second time on PostgreSQL (a schema of
// TEST_DATABASE_URL), as its section "The same on PostgreSQL" says: every
// command gives the same answers, and its psql query shows the rows the
// run left. Regression (issue 35): that section showed a record for the
// invalid request, whose key paymentsd gives back (4 rows, not 3).
func TestTranscripts(t *testing.T) {
	t.Parallel()
	curlBinary(t)
	if _, err := exec.LookPath("bash"); err != nil {
		t.Skip("no bash on PATH")
	}
	ids := regexp.MustCompile(`pay_[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}`)
	for _, doc := range []struct {
		file string
		trim []string
		// blocks picks the console blocks to run; skip tells a block that
		// cannot run here (it starts a server, kills one, or needs psql),
		// allowed only in the sections listed.
		blocks  func([]transcript.Code) []transcript.Code
		skipIn  []string
		minRuns int
		// args are the server's flags beyond its database, as the
		// document starts it.
		args []string
		// postgres runs the document on PostgreSQL, with the psql
		// commands of its section "The same on PostgreSQL".
		postgres bool
	}{
		{"../../README.md", []string{"Date", "Idempotency-Key", "Idempotency-Key-Expires"},
			func(b []transcript.Code) []transcript.Code {
				return transcript.InSection(b, "console", "The demo with curl")
			}, nil, 6, nil, false},
		{"WALKTHROUGH.md", []string{"Date"},
			func(b []transcript.Code) []transcript.Code { return transcript.InSection(b, "console", "") },
			[]string{"Start it", "Shutting down", "The same on PostgreSQL"}, 17, []string{"--seal-key", walkthroughSealKey, "--keep-request-bytes", "4096"}, false},
		{"WALKTHROUGH.md", []string{"Date"},
			func(b []transcript.Code) []transcript.Code { return transcript.InSection(b, "console", "") },
			[]string{"Start it", "Shutting down", "The same on PostgreSQL"}, 18, []string{"--seal-key", walkthroughSealKey, "--keep-request-bytes", "4096"}, true},
	} {
		name := filepath.Base(doc.file)
		if doc.postgres {
			name += "/postgres"
		}
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			md, err := os.ReadFile(doc.file)
			require.NoError(t, err)
			var blocks []transcript.Code
			for _, b := range transcript.Blocks(string(md)) {
				if b.Lang == "console" {
					blocks = append(blocks, b)
				}
			}
			if doc.file == "../../README.md" {
				blocks = doc.blocks(blocks)
			}
			db := filepath.Join(t.TempDir(), "p.db")
			replace := []string{"idem --database-url paymentsd.db", idemBinary(t) + " --database-url " + db}
			if doc.postgres {
				var schema string
				db, schema = dbtest.PostgresURL(t)
				replace = []string{"idem --database-url paymentsd.db", idemBinary(t) + " --database-url '" + db + "'",
					"psql -h 127.0.0.1 -U postgres test", psqlBinary(t) + " '" + os.Getenv(dbtest.EnvPostgres) + "'",
					"paymentsd_manual", schema}
			}
			var steps []transcript.Step
			for _, b := range blocks {
				bs := transcript.Steps(b)
				if doc.postgres && b.Section == "The same on PostgreSQL" {
					// Its query of the rows; not its schema's creation or drop,
					// which dbtest does.
					for _, s := range bs {
						if strings.HasPrefix(s.Command, "psql ") && s.Want != "" {
							steps = append(steps, s)
						}
					}
					continue
				}
				if unrunnable(bs) || len(bs) == 0 {
					require.Contains(t, doc.skipIn, b.Section, "%s:%d: a console block that cannot run here, outside the sections allowed to hold one", doc.file, b.Line)
					continue
				}
				steps = append(steps, bs...)
			}
			require.GreaterOrEqual(t, len(steps), doc.minRuns, "%s: too few commands found", doc.file)

			s, stop := startRun(t, append([]string{"--database-url", db}, doc.args...)...)
			defer stop()
			addr := strings.TrimPrefix(s.url, "http://")
			session := &transcript.Session{
				File:    doc.file,
				Dir:     t.TempDir(),
				Replace: strings.NewReplacer(append([]string{"127.0.0.1:8080", addr, "localhost:8080", addr}, replace...)...),
				Trim:    doc.trim,
				IDs:     ids,
				Compare: func(s transcript.Step, want, got string) (bool, error) {
					if strings.HasPrefix(s.Command, "psql ") { // psql pads its header lines; a document keeps no trailing blanks
						if trimLines(want) != trimLines(got) {
							return true, errors.New("psql's output differs")
						}
						return true, nil
					}
					return uniqueRace(s, want, got)
				},
			}
			session.Run(t, steps)
		})
	}
}

// walkthroughSealKey is the sealing key WALKTHROUGH.md starts paymentsd
// with (a demo key, printed in the document).
const walkthroughSealKey = "demo-2025:ZGVtbyBrZXkgb25seTogbm90IGZvciByZWFsIHVzZSE="

// idemBinary builds the idem command (cmd/idem) into a temporary directory,
// for the transcripts that inspect a record, once per test binary.
var idemBinary = func() func(t *testing.T) string {
	var (
		once sync.Once
		path string
		err  error
		out  []byte
	)
	return func(t *testing.T) string {
		t.Helper()
		once.Do(func() {
			dir, derr := os.MkdirTemp("", "idem-bin-")
			if derr != nil {
				err = derr
				return
			}
			path = filepath.Join(dir, "idem")
			out, err = exec.Command("go", "build", "-o", path, "../idem").CombinedOutput()
		})
		require.NoError(t, err, "go build ../idem: %s", out)
		return path
	}
}()

// trimLines is out without the blanks at the end of its lines.
func trimLines(out string) string {
	lines := strings.Split(out, "\n")
	for i, l := range lines {
		lines[i] = strings.TrimRight(l, " ")
	}
	return strings.Join(lines, "\n")
}

// psqlBinary is psql's path; without it the test skips, or fails under CI.
func psqlBinary(t *testing.T) string {
	t.Helper()
	p, err := exec.LookPath("psql")
	if err != nil {
		if os.Getenv("CI") != "" {
			t.Fatal("no psql on PATH (apt-get install postgresql-client), and CI is set")
		}
		t.Skip("no psql on PATH: skipping")
	}
	return p
}

// unrunnable tells steps that start or stop a server, or need psql.
func unrunnable(steps []transcript.Step) bool {
	for _, s := range steps {
		first, _, _ := strings.Cut(s.Command, " ")
		if slices.Contains([]string{"go", "cd", "kill", "psql", "paymentsd"}, first) {
			return true
		}
	}
	return false
}

// The lines of the race of twenty, counts aside.
const (
	raceRan      = "201 replayed= retry-after="
	raceReplayed = "201 replayed=true retry-after="
	raceInFlight = "409 replayed= retry-after=1"
)

// uniqueRace compares the output of the twenty concurrent requests (a
// command ending in uniq -c) by shape, since the counts vary: in the
// transcript and in the run, exactly one request ran (201, not replayed)
// and every other got the replay or 409 with Retry-After: 1, as many in
// all; the run shows no kind of answer the transcript does not.
func uniqueRace(s transcript.Step, want, got string) (bool, error) {
	if !strings.Contains(s.Command, "uniq -c") {
		return false, nil
	}
	w, err := uniqCounts(want)
	if err != nil {
		return true, fmt.Errorf("the transcript: %w", err)
	}
	g, err := uniqCounts(got)
	if err != nil {
		return true, fmt.Errorf("the run: %w", err)
	}
	sum := func(m map[string]int) (n int) {
		for _, c := range m {
			n += c
		}
		return n
	}
	switch {
	case w[raceRan] != 1 || g[raceRan] != 1:
		return true, fmt.Errorf("want exactly one %q in each", raceRan)
	case sum(w) != sum(g):
		return true, fmt.Errorf("%d requests shown, %d in the run", sum(w), sum(g))
	}
	for kind := range w {
		if kind != raceRan && kind != raceReplayed && kind != raceInFlight {
			return true, fmt.Errorf("the transcript shows %q", kind)
		}
	}
	for kind := range g {
		if _, ok := w[kind]; !ok {
			return true, fmt.Errorf("the run has %q, which the transcript does not show", kind)
		}
	}
	return true, nil
}

// uniqCounts reads uniq -c output.
func uniqCounts(out string) (map[string]int, error) {
	counts := map[string]int{}
	for _, line := range strings.Split(out, "\n") {
		n, kind, ok := strings.Cut(strings.TrimSpace(line), " ")
		c, err := strconv.Atoi(n)
		if !ok || err != nil {
			return nil, fmt.Errorf("not uniq -c output: %q", line)
		}
		counts[kind] += c
	}
	return counts, nil
}
