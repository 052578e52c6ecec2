// Package command holds what idem's operator and test commands (cmd/idem,
// cmd/idemstorm, cmd/idembench) share around their run function: the
// process's entry point, and output whose write errors are kept, so that a
// command whose standard output is a closed pipe or a full disk exits
// non-zero instead of reporting success.
package command

import (
	"context"
	"fmt"
	"io"
	"os"
	"os/signal"
	"syscall"
)

// Run is a command's whole run: args are the command-line arguments without
// the program name, results go to stdout and diagnostics to stderr, and the
// returned int is the exit status.
type Run func(ctx context.Context, args []string, stdout, stderr io.Writer) int

// Main runs run with a context cancelled on the first SIGINT or SIGTERM, the
// process's arguments, os.Stdout and os.Stderr, and exits the process with
// the status run returns. It does not return. Once the context is cancelled
// the signals are no longer caught, so a second one, during the wind-down,
// kills the process the default way.
func Main(run Run) {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	context.AfterFunc(ctx, stop)
	code := run(ctx, os.Args[1:], os.Stdout, os.Stderr)
	stop()
	os.Exit(code)
}

// Writer passes writes to an underlying io.Writer and keeps the first error
// one returned: later writes are not attempted and return that error, and
// Err reports it. Its print methods return nothing, for output written piece
// by piece and checked once, with Err, at the end. A Writer is not safe for
// concurrent use.
type Writer struct {
	w   io.Writer
	err error
}

// NewWriter returns a Writer that writes to w.
func NewWriter(w io.Writer) *Writer { return &Writer{w: w} }

// Write writes p to the underlying writer unless an earlier write failed;
// it returns the first error seen (io.ErrShortWrite for a short write
// without one).
func (w *Writer) Write(p []byte) (int, error) {
	if w.err != nil {
		return 0, w.err
	}
	n, err := w.w.Write(p)
	if err == nil && n < len(p) {
		err = io.ErrShortWrite
	}
	w.err = err
	return n, err
}

// Printf writes as fmt.Fprintf does, recording an error.
func (w *Writer) Printf(format string, a ...any) { _, _ = fmt.Fprintf(w, format, a...) } // recorded in w.err

// Println writes as fmt.Fprintln does, recording an error.
func (w *Writer) Println(a ...any) { _, _ = fmt.Fprintln(w, a...) } // recorded in w.err

// Print writes as fmt.Fprint does, recording an error.
func (w *Writer) Print(a ...any) { _, _ = fmt.Fprint(w, a...) } // recorded in w.err

// Err returns the first error a write returned, nil when none did.
func (w *Writer) Err() error { return w.err }

// Exit is the exit status of a command that would end with code after
// writing its results, writeErr the error of those writes (Writer.Err):
// when writeErr is not nil and code is 0, the failure is reported on stderr
// as "prog: writing the output: ERR" and Exit returns failed; otherwise it
// returns code. Output cut short must not end with status 0; a failing
// code already says the command failed, and is kept.
func Exit(code int, writeErr error, stderr io.Writer, prog string, failed int) int {
	if writeErr == nil || code != 0 {
		return code
	}
	Errorf(stderr, "%s: writing the output: %v", prog, writeErr)
	return failed
}

// Errorf writes one line of diagnostics or progress to stderr, as
// fmt.Fprintf with a newline. An error writing it is dropped: stderr is
// where a command reports its troubles, so a failing one leaves nowhere to
// report that; the results, on stdout, are checked (Writer, Exit).
func Errorf(stderr io.Writer, format string, a ...any) {
	_, _ = fmt.Fprintf(stderr, format+"\n", a...) // nowhere left to report a failing stderr
}
