package main

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/idemgo/idem/cmd/internal/command"
	"github.com/idemgo/idem/cmd/internal/supervise"
)

// Bounds of the fleet's loops.
const (
	healthTimeout   = 30 * time.Second // for one start to answer GET /healthz
	startTries      = 50               // starts of one generation while its address is still taken
	maxRestarts     = 10000            // restarts of one server in a run
	stopGracePeriod = 15 * time.Second // SIGTERM, then SIGKILL
)

// fleet is the paymentsd processes idemstorm started, all on one database.
type fleet struct {
	bin     string
	args    []string // every server's arguments but --addr
	dir     string   // temporary directory (binary, SQLite file, logs), "" when none
	logDir  string
	servers []*server
	rnd     *lockedRand
	stderr  io.Writer

	kills    atomic.Int64 // SIGKILLs sent by --chaos
	exits    atomic.Int64 // exits not caused by idemstorm (self-inflicted crashes)
	restarts atomic.Int64

	mu   sync.Mutex
	errs []string // restarts that failed
}

// server is one paymentsd process on a fixed address, restarted there
// (cmd/internal/supervise runs the process), its generations' output appended
// to logPath.
type server struct {
	name    string
	logPath string
	proc    *supervise.Process

	mu         sync.Mutex
	up         bool // answered GET /healthz and not known dead
	killedByUs bool // the current generation got our SIGKILL
	stopping   bool
}

// newServer is server i (from 1) of the fleet, on addr.
func (f *fleet) newServer(i int, addr string) *server {
	s := &server{name: fmt.Sprintf("paymentsd-%d", i), logPath: filepath.Join(f.logDir, fmt.Sprintf("paymentsd-%d.log", i))}
	s.proc = &supervise.Process{Name: s.name, Bin: f.bin, Args: f.args, Addr: addr, HealthTimeout: healthTimeout,
		Output: func(gen int) (io.Writer, func(), error) {
			logf, err := os.OpenFile(s.logPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
			if err != nil {
				return nil, nil, err
			}
			if _, err := fmt.Fprintf(logf, "--- idemstorm: %s generation %d on %s ---\n", s.name, gen, addr); err != nil {
				return nil, nil, errors.Join(err, logf.Close())
			}
			return logf, func() {
				if err := logf.Close(); err != nil { // the log may lack the generation's last lines
					command.Errorf(f.stderr, "idemstorm: %s: %v", s.logPath, err)
				}
			}, nil
		},
		OnExit: func(int) {
			s.mu.Lock()
			s.up = false
			s.mu.Unlock()
		}}
	return s
}

// startFleet builds (or takes) the paymentsd binary and starts o.servers
// processes on o.databaseURL (a new SQLite file when empty; o.databaseURL
// is set to it). cleanup stops them and removes the temporary directory,
// keeping the logs (and the SQLite file) when failed.
func startFleet(ctx context.Context, o *options, stderr io.Writer) (*fleet, func(failed bool), error) {
	dir, err := os.MkdirTemp("", "idemstorm-")
	if err != nil {
		return nil, nil, err
	}
	f := &fleet{dir: dir, logDir: o.logDir, rnd: newLockedRand(uint64(time.Now().UnixNano())), stderr: stderr}
	if f.logDir == "" {
		f.logDir = filepath.Join(dir, "logs")
	}
	built := ""
	cleanup := func(failed bool) {
		f.stop()
		if failed && o.logDir == "" {
			if built != "" {
				if err := os.Remove(built); err != nil {
					command.Errorf(stderr, "idemstorm: removing the paymentsd binary: %v", err)
				}
			}
			command.Errorf(stderr, "idemstorm: paymentsd logs kept in %s", f.logDir)
			return
		}
		if err := os.RemoveAll(dir); err != nil {
			command.Errorf(stderr, "idemstorm: removing the temporary directory: %v", err)
		}
	}
	fail := func(err error) (*fleet, func(bool), error) {
		cleanup(false) // the error carries the log's tail
		return nil, nil, err
	}
	if err := os.MkdirAll(f.logDir, 0o755); err != nil {
		return fail(err)
	}
	f.bin = o.paymentsdBin
	if f.bin == "" {
		if f.bin, err = buildPaymentsd(ctx, dir, stderr); err != nil {
			return fail(err)
		}
		built = f.bin
	}
	if o.databaseURL == "" {
		o.databaseURL = "sqlite:" + filepath.Join(dir, "storm.db")
	}
	f.args = []string{"--database-url", o.databaseURL, "--log-format", "json"}
	if o.lease > 0 {
		f.args = append(f.args, "--lease", o.lease.String())
	}
	if o.pspURL != "" {
		f.args = append(f.args, "--psp-url", o.pspURL)
	}
	if o.naive {
		f.args = append(f.args, "--naive")
		if o.redisURL != "" {
			f.args = append(f.args, "--redis-url", o.redisURL)
		}
	}
	if o.burst && o.chaos {
		// Its completer finishes what the kills leave, soon after.
		f.args = append(f.args, "--completer-grace", completerGrace.String())
	}
	f.args = append(f.args, o.paymentsdArgs...) // last: a flag given twice takes the last value
	for i := range o.servers {
		var (
			s   *server
			err error
		)
		for range 5 { // a free port may be taken before we bind it
			addr, aerr := supervise.FreeAddr()
			if aerr != nil {
				err = aerr
				break
			}
			s = f.newServer(i+1, addr)
			if err = f.start(s); err == nil || !f.addrInUse(s) {
				break
			}
		}
		if s == nil {
			return fail(err)
		}
		f.servers = append(f.servers, s)
		if err != nil {
			return fail(fmt.Errorf("%s did not start: %w\n%s", s.name, err, tail(s.logPath, 4096)))
		}
	}
	return f, cleanup, nil
}

// buildPaymentsd builds ./cmd/paymentsd of the idem module into dir, with
// -tags idemfaults (its --crash-* and --stall-after-charge fault injection,
// which a normal build does not carry) and without -race (the storm
// measures the service, not its race detector; e2e builds it with -race).
func buildPaymentsd(ctx context.Context, dir string, stderr io.Writer) (string, error) {
	command.Errorf(stderr, "idemstorm: building paymentsd")
	paths, err := supervise.Build(ctx, dir, false, "paymentsd")
	switch {
	case errors.Is(err, supervise.ErrNoGo):
		return "", fmt.Errorf("%w (give --paymentsd-bin)", err)
	case err != nil:
		return "", fmt.Errorf("building paymentsd (run idemstorm inside the idem module, or give --paymentsd-bin): %w", err)
	}
	return paths[0], nil
}

func (f *fleet) urls() []string {
	var out []string
	for _, s := range f.servers {
		out = append(out, s.proc.URL())
	}
	return out
}

// addrInUse reports whether s's last start failed on its address still
// being taken.
func (f *fleet) addrInUse(s *server) bool {
	return strings.Contains(tail(s.logPath, 4096), "address already in use")
}

// start launches a new generation of s and waits until it is healthy.
func (f *fleet) start(s *server) error {
	s.mu.Lock()
	s.killedByUs, s.up = false, false
	s.mu.Unlock()
	if err := s.proc.Start(); err != nil {
		return errors.Join(err, appendLine(s.logPath, fmt.Sprintf("--- idemstorm: %s did not start: %v ---", s.name, err)))
	}
	s.mu.Lock()
	s.up = true
	s.mu.Unlock()
	return nil
}

// restart starts a new generation of s on its address, retrying while the
// old socket is still taken.
func (f *fleet) restart(s *server) error {
	var err error
	for range startTries {
		if err = f.start(s); err == nil {
			f.restarts.Add(1)
			return nil
		}
		if !f.addrInUse(s) {
			break
		}
		time.Sleep(100 * time.Millisecond)
	}
	return err
}

// supervise restarts every server that dies, and with chaos kills a random
// healthy one every killEvery on average, until ctx ends. A server that
// cannot be restarted (maxStartFailures in a row) is fatal: onFatal is
// called, and its watch ends.
func (f *fleet) supervise(ctx context.Context, chaos bool, killEvery time.Duration, onFatal func(error)) {
	var wg sync.WaitGroup
	for _, s := range f.servers {
		wg.Go(func() { f.watch(ctx, s, onFatal) })
	}
	if chaos {
		wg.Go(func() { f.chaos(ctx, killEvery) })
	}
	wg.Wait()
}

// maxStartFailures bounds the failed restarts in a row of one server.
const maxStartFailures = 10

// watch restarts s whenever it exits, until ctx ends.
func (f *fleet) watch(ctx context.Context, s *server, onFatal func(error)) {
	failures := 0
	for range maxRestarts {
		select {
		case <-ctx.Done():
			return
		case <-s.proc.Exited():
		}
		s.mu.Lock()
		stopping := s.stopping
		s.mu.Unlock()
		if stopping {
			return
		}
		if failures == 0 {
			f.noteDeath(s)
		}
		if err := f.restart(s); err != nil {
			failures++
			f.addErr(fmt.Sprintf("%s: restart failed: %v", s.name, err))
			if failures >= maxStartFailures {
				onFatal(fmt.Errorf("%s could not be restarted %d times in a row: %w\n%s", s.name, failures, err, tail(s.logPath, 4096)))
				return
			}
			if !sleepCtx(ctx, time.Second) {
				return
			}
			continue
		}
		failures = 0
	}
}

// noteDeath counts the exit of s's current generation when idemstorm did
// not cause it.
func (f *fleet) noteDeath(s *server) {
	s.mu.Lock()
	byUs := s.killedByUs
	s.mu.Unlock()
	if !byUs {
		f.exits.Add(1)
	}
}

// chaos SIGKILLs a random healthy server at random moments until ctx ends.
func (f *fleet) chaos(ctx context.Context, every time.Duration) {
	for {
		if !sleepCtx(ctx, f.rnd.duration(every/2, every*3/2)) {
			return
		}
		var up []*server
		for _, s := range f.servers {
			s.mu.Lock()
			if s.up {
				up = append(up, s)
			}
			s.mu.Unlock()
		}
		if len(up) == 0 {
			continue
		}
		s := up[f.rnd.intN(len(up))]
		s.mu.Lock()
		if s.up {
			s.killedByUs, s.up = true, false
			_ = s.proc.Signal(syscall.SIGKILL)
			f.kills.Add(1)
		}
		s.mu.Unlock()
	}
}

// waitAllHealthy restarts the servers that are down and waits until every
// one answers GET /healthz, all within timeout. A server may die while it
// is being waited for (the last SIGKILL of --chaos lands just before chaos
// stops, or a handler still running for a request the client gave up on
// reaches paymentsd's --crash-after-charge): it is restarted too, as the
// watchers would have done.
func (f *fleet) waitAllHealthy(ctx context.Context, timeout time.Duration) error {
	deadline := time.Now().Add(timeout)
	for _, s := range f.servers {
		for {
			if err := ctx.Err(); err != nil {
				return err
			}
			left := time.Until(deadline)
			if left <= 0 {
				return fmt.Errorf("%s: not healthy after %s\n%s", s.name, timeout, tail(s.logPath, 4096))
			}
			exited := s.proc.Exited()
			select {
			case <-exited:
				f.noteDeath(s)
				if err := f.restart(s); err != nil {
					return fmt.Errorf("%s did not restart: %w\n%s", s.name, err, tail(s.logPath, 4096))
				}
				continue // check the new generation like any other
			default:
			}
			err := supervise.WaitHealthy(s.proc.URL(), exited, left)
			if err == nil {
				break
			}
			if !errors.Is(err, supervise.ErrExited) {
				return fmt.Errorf("%s: %w\n%s", s.name, err, tail(s.logPath, 4096))
			}
		}
	}
	return ctx.Err()
}

// stop ends every server: SIGTERM, then SIGKILL after stopGracePeriod.
func (f *fleet) stop() {
	var wg sync.WaitGroup
	for _, s := range f.servers {
		s.mu.Lock()
		s.stopping = true
		s.mu.Unlock()
		wg.Go(func() { s.proc.Stop(stopGracePeriod) })
	}
	wg.Wait()
}

func (f *fleet) addErr(s string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.errs = append(f.errs, s)
}

// ServersSummary is the fleet's part of the report.
type ServersSummary struct {
	Count int `json:"count"`
	// Kills counts --chaos SIGKILLs; Crashes the exits idemstorm did not
	// cause (paymentsd's --crash-* fault injection); InjectedCrashes the
	// "fault injected" lines in the logs; Restarts every restart.
	Kills           int64    `json:"kills"`
	Crashes         int64    `json:"crashes"`
	InjectedCrashes int      `json:"injected_crashes"`
	Restarts        int64    `json:"restarts"`
	Generations     []int    `json:"generations"`
	Errors          []string `json:"errors,omitempty"`
	Args            []string `json:"args"`
}

func (f *fleet) summary() *ServersSummary {
	sum := &ServersSummary{Count: len(f.servers), Kills: f.kills.Load(), Crashes: f.exits.Load(),
		Restarts: f.restarts.Load(), Args: redactArgs(f.args)}
	for _, s := range f.servers {
		sum.Generations = append(sum.Generations, s.proc.Generation())
		if b, err := os.ReadFile(s.logPath); err == nil {
			sum.InjectedCrashes += bytes.Count(b, []byte("fault injected: crashing now"))
		}
	}
	f.mu.Lock()
	sum.Errors = append(sum.Errors, f.errs...)
	f.mu.Unlock()
	return sum
}

// redactArgs hides passwords in URL arguments.
func redactArgs(args []string) []string {
	out := make([]string, len(args))
	for i, a := range args {
		out[i] = redactURL(a)
	}
	return out
}

// appendLine appends line and a newline to the file at path, which must
// exist.
func appendLine(path, line string) error {
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return err
	}
	_, err = fmt.Fprintln(f, line)
	return errors.Join(err, f.Close())
}

// tail returns the last n bytes of the file at path ("" when it cannot be
// read).
func tail(path string, n int64) string {
	f, err := os.Open(path)
	if err != nil {
		return ""
	}
	defer func() { _ = f.Close() }() // opened read-only: closing it loses nothing
	st, err := f.Stat()
	if err != nil {
		return ""
	}
	off := max(st.Size()-n, 0)
	b := make([]byte, st.Size()-off)
	_, _ = f.ReadAt(b, off)
	return string(b)
}
