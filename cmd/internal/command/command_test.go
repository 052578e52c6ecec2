package command

import (
	"bytes"
	"errors"
	"io"
	"testing"

	"github.com/stretchr/testify/require"
)

// shortWriter takes n bytes, then fails.
type shortWriter struct {
	buf bytes.Buffer
	n   int
}

func (w *shortWriter) Write(p []byte) (int, error) {
	if w.buf.Len()+len(p) > w.n {
		return 0, errors.New("disk full")
	}
	return w.buf.Write(p)
}

func TestWriterKeepsTheFirstError(t *testing.T) {
	dst := &shortWriter{n: 6}
	w := NewWriter(dst)
	w.Printf("%s\n", "first")
	require.NoError(t, w.Err())
	w.Println("second")
	require.EqualError(t, w.Err(), "disk full")
	dst.n = 100 // room again: nothing more is written after a failure
	w.Print("third")
	_, err := w.Write([]byte("fourth"))
	require.EqualError(t, err, "disk full")
	require.Equal(t, "first\n", dst.buf.String())
}

type shortCount struct{}

func (shortCount) Write(p []byte) (int, error) { return len(p) - 1, nil }

func TestWriterReportsAShortWrite(t *testing.T) {
	w := NewWriter(shortCount{})
	w.Print("abc")
	require.ErrorIs(t, w.Err(), io.ErrShortWrite)
}

func TestExit(t *testing.T) {
	var stderr bytes.Buffer
	ok := NewWriter(io.Discard)
	ok.Print("results")
	require.Equal(t, 0, Exit(0, ok.Err(), &stderr, "idem", 1))
	require.Equal(t, 2, Exit(2, ok.Err(), &stderr, "idem", 1))
	require.Empty(t, stderr.String())

	failed := NewWriter(&shortWriter{})
	failed.Print("results")
	require.Equal(t, 3, Exit(3, failed.Err(), &stderr, "idem", 1), "a failing status is kept")
	require.Empty(t, stderr.String())
	require.Equal(t, 1, Exit(0, failed.Err(), &stderr, "idem", 1))
	require.Equal(t, "idem: writing the output: disk full\n", stderr.String())
}
