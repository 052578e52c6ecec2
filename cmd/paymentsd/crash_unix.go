//go:build idemfaults && unix

package main

import (
	"os"
	"syscall"
	"time"
)

// killProcess ends the process at once with SIGKILL, as the OOM killer or
// `kill -9` would: no deferred function runs, no buffer is flushed, and the
// database sees its connections drop (or, for SQLite, a transaction that
// never committed).
func killProcess() {
	_ = syscall.Kill(os.Getpid(), syscall.SIGKILL)
	time.Sleep(time.Minute) // SIGKILL is delivered before the call returns
	os.Exit(3)
}
