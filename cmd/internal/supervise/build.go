package supervise

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
)

// Build builds the idem module's commands names (cmd/paymentsd is
// "paymentsd") into dir with -tags idemfaults (paymentsd's --crash-* and
// --stall-after-charge fault injection, which a normal build does not
// carry), and with -race when race; it returns their paths, dir/NAME, in
// the order of names. The go command must be on PATH and the working
// directory inside the idem module (or a workspace using it). Its error is
// ErrNoGo, wrapped, when there is no go command; a failed build's error
// carries go's output.
func Build(ctx context.Context, dir string, race bool, names ...string) ([]string, error) {
	goTool, err := exec.LookPath("go")
	if err != nil {
		return nil, fmt.Errorf("%w: %w", ErrNoGo, err)
	}
	var paths []string
	for _, name := range names {
		args := []string{"build", "-tags", "idemfaults"}
		if race {
			args = append(args, "-race")
		}
		out := filepath.Join(dir, name)
		cmd := exec.CommandContext(ctx, goTool, append(args, "-o", out, "github.com/idemgo/idem/cmd/"+name)...)
		var b bytes.Buffer
		cmd.Stdout, cmd.Stderr = &b, &b
		if err := cmd.Run(); err != nil {
			return nil, fmt.Errorf("go %s: %v\n%s", strings.Join(cmd.Args[1:], " "), err, b.String())
		}
		paths = append(paths, out)
	}
	return paths, nil
}

// ErrNoGo is Build's error when no go command is on PATH.
var ErrNoGo = errors.New("no go command to build with")

// Binaries builds idem's commands Names (see Build) on the first call of
// Paths, once per process, into a temporary directory that Remove deletes:
// the services a test binary runs, built for all its tests. Set Names and
// Race before the first Paths; its methods are then safe for concurrent
// use.
type Binaries struct {
	Names []string
	Race  bool

	once  sync.Once
	mu    sync.Mutex
	dir   string
	paths []string
	err   error
}

// Paths builds the binaries on its first call and returns their paths, in
// the order of Names, or the build's error (every call returns the first
// call's result).
func (b *Binaries) Paths() ([]string, error) {
	b.once.Do(func() {
		dir, err := os.MkdirTemp("", "idem-bin-")
		b.mu.Lock()
		b.dir = dir
		b.mu.Unlock()
		if err == nil {
			b.paths, err = Build(context.Background(), dir, b.Race, b.Names...)
		}
		b.err = err
	})
	return b.paths, b.err
}

// Remove deletes the binaries' directory, if Paths made one.
func (b *Binaries) Remove() error {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.dir == "" {
		return nil
	}
	return os.RemoveAll(b.dir)
}
