package httpwrite

import (
	"bytes"
	"net/http"
)

// Recorder is the one http.ResponseWriter wrapper that the middleware's
// ProblemWriter call, the demo's request log and the naive cache share: it
// passes a response through and remembers its status (0 until
// the handler writes) and size in bytes; with a Body it also keeps a copy
// of what was written. Unwrap keeps http.ResponseController (Flush,
// deadlines) working through it.
type Recorder struct {
	http.ResponseWriter
	Status int
	Bytes  int64
	// Body, when not nil, receives a copy of every write.
	Body *bytes.Buffer
}

// NewRecorder wraps w; keepBody gives the Recorder a Body.
func NewRecorder(w http.ResponseWriter, keepBody bool) *Recorder {
	rec := &Recorder{ResponseWriter: w}
	if keepBody {
		rec.Body = &bytes.Buffer{}
	}
	return rec
}

// WriteHeader remembers the first status and passes it on.
func (s *Recorder) WriteHeader(status int) {
	if s.Status == 0 {
		s.Status = status
	}
	s.ResponseWriter.WriteHeader(status)
}

// Write counts (and with a Body copies) b and passes it on; a write before
// WriteHeader is a 200.
func (s *Recorder) Write(b []byte) (int, error) {
	if s.Status == 0 {
		s.Status = http.StatusOK
	}
	if s.Body != nil {
		s.Body.Write(b)
	}
	n, err := s.ResponseWriter.Write(b)
	s.Bytes += int64(n)
	return n, err
}

// Unwrap returns the wrapped writer (http.ResponseController).
func (s *Recorder) Unwrap() http.ResponseWriter { return s.ResponseWriter }

// StatusOf calls write with w and returns the status it sent: 200 when it
// wrote nothing.
func StatusOf(w http.ResponseWriter, write func(http.ResponseWriter)) int {
	rec := NewRecorder(w, false)
	write(rec)
	if rec.Status == 0 {
		return http.StatusOK
	}
	return rec.Status
}
