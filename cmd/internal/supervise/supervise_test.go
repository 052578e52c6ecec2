package supervise

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"net/http"
	"os"
	"sync/atomic"
	"syscall"
	"testing"
	"time"
)

// The test binary is its own child: with SUPERVISE_CHILD set it serves GET
// /healthz on --addr (or, with SUPERVISE_CHILD=exit, exits at once).
func TestMain(m *testing.M) {
	switch os.Getenv("SUPERVISE_CHILD") {
	case "":
		os.Exit(m.Run())
	case "exit":
		fmt.Println("exiting")
		os.Exit(3)
	}
	fs := flag.NewFlagSet("child", flag.ExitOnError)
	addr := fs.String("addr", "", "")
	_ = fs.Parse(os.Args[1:])
	fmt.Println("child listening on", *addr)
	http.HandleFunc("GET /healthz", func(w http.ResponseWriter, _ *http.Request) { _, _ = io.WriteString(w, "ok") })
	fmt.Println(http.ListenAndServe(*addr, nil))
	os.Exit(1)
}

func child(t *testing.T, mode string, out *Buffer) (*Process, *atomic.Int32) {
	t.Helper()
	addr, err := FreeAddr()
	if err != nil {
		t.Fatal(err)
	}
	bin, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	exits := new(atomic.Int32)
	p := &Process{Name: "child", Bin: bin, Addr: addr, Env: append(os.Environ(), "SUPERVISE_CHILD="+mode),
		HealthTimeout: 20 * time.Second,
		Output:        out.Output,
		OnExit:        func(int) { exits.Add(1) }}
	t.Cleanup(func() { p.Stop(5 * time.Second) })
	return p, exits
}

func TestStartKillRestartStop(t *testing.T) {
	var out Buffer
	p, exits := child(t, "serve", &out)
	if p.Running() || p.Exited() != nil || p.Generation() != 0 {
		t.Fatal("running before Start")
	}
	if err := p.Start(); err != nil {
		t.Fatalf("Start: %v\n%s", err, out.String())
	}
	if !p.Running() || p.Generation() != 1 || p.State() != nil {
		t.Fatalf("after Start: running %v, generation %d", p.Running(), p.Generation())
	}
	if !p.Kill(10 * time.Second) {
		t.Fatal("SIGKILL did not end the child")
	}
	ws, ok := p.State().Sys().(syscall.WaitStatus)
	if !ok || !ws.Signaled() || ws.Signal() != syscall.SIGKILL {
		t.Fatalf("state %v, want killed by SIGKILL", p.State())
	}
	if err := p.StartRetrying(10, 100*time.Millisecond, func(error) bool { return true }); err != nil {
		t.Fatalf("restart: %v\n%s", err, out.String())
	}
	if p.Generation() != 2 || !p.Running() {
		t.Fatalf("after the restart: generation %d, running %v", p.Generation(), p.Running())
	}
	if err := p.Signal(syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	p.Stop(5 * time.Second) // a stopped child is continued, then terminated
	if p.Running() {
		t.Fatal("running after Stop")
	}
	if n := exits.Load(); n != 2 {
		t.Fatalf("OnExit ran %d times, want once per generation (2)", n)
	}
}

func TestStartReportsAnEarlyExit(t *testing.T) {
	var out Buffer
	p, _ := child(t, "exit", &out)
	err := p.Start()
	if !errors.Is(err, ErrExited) {
		t.Fatalf("Start of a child that exits: %v, want ErrExited", err)
	}
	if p.Running() || p.State().ExitCode() != 3 {
		t.Fatalf("state %v, want exit status 3", p.State())
	}
	tries := 0
	err = p.StartRetrying(3, time.Millisecond, func(error) bool { tries++; return tries < 2 })
	if !errors.Is(err, ErrExited) || p.Generation() != 3 {
		t.Fatalf("StartRetrying: %v after generation %d, want ErrExited after 2 more starts", err, p.Generation())
	}
}
