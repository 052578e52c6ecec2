// Package parked lets a concurrency test wait for a state instead of for
// time: Wait returns once enough goroutines of a kind are blocked, read from
// the runtime's goroutine dump.
package parked

import (
	"bytes"
	"runtime"
	"strings"
	"testing"
	"time"
)

// Wait returns once at least n goroutines whose stack names frame (a
// function, as the dump prints it: "idempgx_test.answerOf.func1") are
// blocked: on a channel, a lock, a select, I/O or a sleep, anything but
// running. It fails t after a minute (a hang, not a speed).
func Wait(t testing.TB, n int, frame string) {
	t.Helper()
	deadline := time.Now().Add(time.Minute)
	for Count(frame) < n {
		if time.Now().After(deadline) {
			t.Fatalf("parked: fewer than %d goroutines in %s blocked after a minute", n, frame)
		}
		runtime.Gosched()
		time.Sleep(time.Millisecond) // a poll of the state, not a wait for it
	}
}

// Count is the number of blocked goroutines whose stack names frame.
func Count(frame string) int {
	buf := make([]byte, 1<<20)
	for {
		m := runtime.Stack(buf, true)
		if m < len(buf) {
			buf = buf[:m]
			break
		}
		buf = make([]byte, 2*len(buf))
	}
	n := 0
	for _, g := range bytes.Split(buf, []byte("\n\n")) {
		header, stack, _ := strings.Cut(string(g), "\n")
		state, _, _ := strings.Cut(header[strings.IndexByte(header, '[')+1:], "]")
		state, _, _ = strings.Cut(state, ",")
		if state != "running" && state != "runnable" && state != "syscall" && strings.Contains(stack, frame) {
			n++
		}
	}
	return n
}
