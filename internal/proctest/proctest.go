// Package proctest runs programs built for a test as real processes: each
// on a free loopback port, waited for until it accepts connections, and
// killed when the test ends, so a test can SIGKILL one mid-request and
// start another on the same database.
package proctest

import (
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"syscall"
	"testing"
	"time"
)

// Build builds each of pkgs (go build arguments: "." or an import path)
// into a new temporary directory of t, and returns that directory: the
// binaries are named after their packages.
func Build(t testing.TB, pkgs ...string) string {
	t.Helper()
	dir := t.TempDir()
	for _, pkg := range pkgs {
		out, err := exec.Command("go", "build", "-o", dir+string(filepath.Separator), pkg).CombinedOutput()
		if err != nil {
			t.Fatalf("go build %s: %v\n%s", pkg, err, out)
		}
	}
	return dir
}

// FreeAddr returns a loopback address ("127.0.0.1:PORT") whose port was
// free when it was asked for.
func FreeAddr(t testing.TB) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := l.Addr().String()
	if err := l.Close(); err != nil {
		t.Fatal(err)
	}
	return addr
}

// Process is a started program.
type Process struct {
	Cmd  *exec.Cmd
	Addr string // where it listens
	done chan struct{}
}

// Start starts cmd, whose program listens on addr, with its output on the
// test binary's stderr unless cmd sets its own, and waits, at most a
// minute, until addr accepts a connection. It fails t if the program exits
// first. The process is killed (SIGKILL) when t ends.
func Start(t testing.TB, cmd *exec.Cmd, addr string) *Process {
	t.Helper()
	if cmd.Stdout == nil {
		cmd.Stdout = os.Stderr
	}
	if cmd.Stderr == nil {
		cmd.Stderr = os.Stderr
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	p := &Process{Cmd: cmd, Addr: addr, done: make(chan struct{})}
	go func() { _ = cmd.Wait(); close(p.done) }()
	t.Cleanup(p.Kill)
	for deadline := time.Now().Add(time.Minute); ; {
		if c, err := net.Dial("tcp", addr); err == nil {
			_ = c.Close()
			return p
		}
		select {
		case <-p.done:
			t.Fatalf("%s exited before it accepted on %s: %v", filepath.Base(cmd.Path), addr, cmd.ProcessState)
		case <-time.After(10 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s does not accept on %s", filepath.Base(cmd.Path), addr)
		}
	}
}

// Kill sends SIGKILL and waits for the process to end. It may be called
// more than once.
func (p *Process) Kill() {
	_ = p.Cmd.Process.Signal(syscall.SIGKILL) // an error: it has ended already
	<-p.done
}

// Stop sends SIGTERM, waits for the process to end, and returns the error
// of an exit other than 0.
func (p *Process) Stop() error {
	if err := p.Cmd.Process.Signal(syscall.SIGTERM); err != nil {
		return err
	}
	<-p.done
	if !p.Cmd.ProcessState.Success() {
		return &exec.ExitError{ProcessState: p.Cmd.ProcessState}
	}
	return nil
}
