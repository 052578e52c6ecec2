// Package supervise runs idem's services (cmd/paymentsd, cmd/fakepsp) as
// child processes for the crash and storm proofs, e2e and cmd/idemstorm: one
// process on a fixed loopback address, started, checked healthy on GET
// /healthz, signalled (SIGKILL, SIGSTOP, ...), and restarted on the same
// address as a new generation. The callers keep their own policies (chaos,
// logs, test cleanup); the process handling is written once, here.
package supervise

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"runtime"
	"sync"
	"syscall"
	"time"
)

// DefaultHealthTimeout is how long Start waits for GET /healthz to answer
// 200 when Process.HealthTimeout is zero.
const DefaultHealthTimeout = 30 * time.Second

// ErrExited is Start's error when the new generation exits before it is
// healthy.
var ErrExited = errors.New("exited before it was healthy")

// Process is one service run as a child process: Bin with "--addr" Addr
// followed by Args, restarted on the same address. The zero value is not
// usable: set Name, Bin and Addr (FreeAddr gives one). Its methods are safe
// for concurrent use.
type Process struct {
	// Name names the process in errors, for example "paymentsd-1".
	Name string
	Bin  string
	// Args follow "--addr" Addr on the command line; Start reads them at
	// each start (set them between generations to restart with others).
	Args []string
	// Env is the child's environment; nil inherits this process's.
	Env  []string
	Addr string
	// Output returns where the generation numbered gen (1 for the first)
	// writes its stdout and stderr, and a function called once it has
	// exited (close a file); nil discards the output.
	Output func(gen int) (io.Writer, func(), error)
	// HealthTimeout bounds Start's wait for GET /healthz; zero means
	// DefaultHealthTimeout.
	HealthTimeout time.Duration
	// OnExit, when set, runs when a generation exits, before Exited's
	// channel closes.
	OnExit func(gen int)

	mu          sync.Mutex
	cmd         *exec.Cmd
	exited      chan struct{}
	state       *os.ProcessState
	generations int
}

// URL is the process's base URL, http://Addr.
func (p *Process) URL() string { return "http://" + p.Addr }

// Start launches a new generation and waits until its GET /healthz answers
// 200. When it does not (ErrExited, or not healthy within HealthTimeout),
// the generation is killed and waited for, and the error returned. The
// child gets SIGKILL if this process dies (on Linux).
func (p *Process) Start() error {
	p.mu.Lock()
	p.generations++
	gen := p.generations
	args := append([]string{"--addr", p.Addr}, p.Args...)
	p.mu.Unlock()
	out, done := io.Discard, func() {}
	if p.Output != nil {
		w, d, err := p.Output(gen)
		if err != nil {
			return err
		}
		out, done = w, d
	}
	cmd := exec.Command(p.Bin, args...)
	cmd.Env = p.Env
	cmd.Stdout, cmd.Stderr = out, out
	cmd.SysProcAttr = childProcAttr()
	if err := startCmd(cmd); err != nil {
		done()
		return err
	}
	exited := make(chan struct{})
	p.mu.Lock()
	p.cmd, p.exited, p.state = cmd, exited, nil
	p.mu.Unlock()
	go func() {
		_ = cmd.Wait()
		done()
		p.mu.Lock()
		if p.cmd == cmd {
			p.state = cmd.ProcessState
		}
		p.mu.Unlock()
		if p.OnExit != nil {
			p.OnExit(gen)
		}
		close(exited)
	}()
	timeout := p.HealthTimeout
	if timeout <= 0 {
		timeout = DefaultHealthTimeout
	}
	if err := WaitHealthy(p.URL(), exited, timeout); err != nil {
		_ = cmd.Process.Kill()
		<-exited
		return fmt.Errorf("%s: %w", p.Name, err)
	}
	return nil
}

// StartRetrying is Start, tried up to tries times, pause apart, while retry
// (given Start's error) says to try again: the address may still be taken
// by the previous generation's socket, for one.
func (p *Process) StartRetrying(tries int, pause time.Duration, retry func(error) bool) error {
	var err error
	for i := range tries {
		if err = p.Start(); err == nil || !retry(err) {
			return err
		}
		if i < tries-1 {
			time.Sleep(pause)
		}
	}
	return err
}

// Generation returns the number of the current generation (0 before the
// first Start).
func (p *Process) Generation() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.generations
}

// Exited returns a channel closed when the current generation exits (nil
// before the first Start).
func (p *Process) Exited() <-chan struct{} {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.exited
}

// State returns the current generation's exit state, nil while it runs.
func (p *Process) State() *os.ProcessState {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.state
}

// Running reports whether the current generation is alive.
func (p *Process) Running() bool {
	ch := p.Exited()
	if ch == nil {
		return false
	}
	select {
	case <-ch:
		return false
	default:
		return true
	}
}

// Signal sends sig to the current generation.
func (p *Process) Signal(sig os.Signal) error {
	p.mu.Lock()
	cmd := p.cmd
	p.mu.Unlock()
	if cmd == nil {
		return fmt.Errorf("%s: not started", p.Name)
	}
	return cmd.Process.Signal(sig)
}

// Kill sends SIGKILL to the current generation and waits for it to exit, at
// most timeout; false if it did not.
func (p *Process) Kill(timeout time.Duration) bool {
	ch := p.Exited()
	if ch == nil {
		return true
	}
	_ = p.Signal(syscall.SIGKILL)
	select {
	case <-ch:
		return true
	case <-time.After(timeout):
		return false
	}
}

// Stop ends the current generation: SIGTERM (and SIGCONT, in case it was
// stopped), then SIGKILL once grace has passed, and waits for it to exit.
func (p *Process) Stop(grace time.Duration) {
	ch := p.Exited()
	if ch == nil {
		return
	}
	select {
	case <-ch:
		return
	default:
	}
	_ = p.Signal(syscall.SIGTERM)
	_ = p.Signal(syscall.SIGCONT)
	select {
	case <-ch:
	case <-time.After(grace):
		_ = p.Signal(syscall.SIGKILL)
		<-ch
	}
}

// healthClient checks GET /healthz, one connection per check.
var healthClient = &http.Client{Timeout: 2 * time.Second, Transport: &http.Transport{DisableKeepAlives: true}}

// WaitHealthy polls base + "/healthz" until it answers 200: ErrExited when
// exited closes first, an error once timeout has passed.
func WaitHealthy(base string, exited <-chan struct{}, timeout time.Duration) error {
	deadline := time.Now().Add(timeout)
	for time.Now().Before(deadline) {
		select {
		case <-exited:
			return ErrExited
		default:
		}
		if resp, err := healthClient.Get(base + "/healthz"); err == nil {
			// Only the status is read, and with keep-alives off the
			// connection is closed whatever Close returns.
			_ = resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return nil
			}
		}
		time.Sleep(20 * time.Millisecond)
	}
	return fmt.Errorf("not healthy after %s", timeout)
}

// FreeAddr returns a loopback address with a port free right now (another
// process may take it before the child binds it: retry the start).
func FreeAddr() (string, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return "", err
	}
	addr := ln.Addr().String()
	if err := ln.Close(); err != nil { // the port would stay taken
		return "", err
	}
	return addr, nil
}

// Buffer keeps what is written to it, safe for concurrent use: the output
// of generations that a test reads while they run. The zero value is an
// empty Buffer.
type Buffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

// Write appends p; it never fails.
func (b *Buffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.b.Write(p)
}

// String returns everything written so far.
func (b *Buffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.b.String()
}

// Output is a Process.Output that writes every generation to b.
func (b *Buffer) Output(int) (io.Writer, func(), error) { return b, func() {}, nil }

// spawner starts the child processes from one goroutine locked to its OS
// thread for the life of the process: the parent-death signal of
// childProcAttr is sent when the thread that forked the child ends, not the
// process (go.dev/issue/27505), and a thread the runtime may retire would
// kill a healthy child at random.
var spawner struct {
	once sync.Once
	reqs chan spawnRequest
}

type spawnRequest struct {
	cmd  *exec.Cmd
	done chan error
}

// startCmd runs cmd.Start on the spawner's thread.
func startCmd(cmd *exec.Cmd) error {
	spawner.once.Do(func() {
		spawner.reqs = make(chan spawnRequest)
		go func() {
			runtime.LockOSThread() // never unlocked: the thread lives as long as the process
			for r := range spawner.reqs {
				r.done <- r.cmd.Start()
			}
		}()
	})
	done := make(chan error, 1)
	spawner.reqs <- spawnRequest{cmd: cmd, done: done}
	return <-done
}
