package main

import (
	"context"
	"log/slog"
	"net/http"
	"strings"
	"time"

	"github.com/idemgo/idem"
)

// requestInfo collects what inner layers learn about a request (the
// merchant) for its log line.
type requestInfo struct {
	merchant string
}

type requestInfoKey struct{}

func requestInfoFrom(ctx context.Context) *requestInfo {
	info, _ := ctx.Value(requestInfoKey{}).(*requestInfo)
	return info
}

// statusRecorder remembers the status and size of a response. Unwrap keeps
// http.ResponseController (Flush, deadlines) working through it.
type statusRecorder struct {
	http.ResponseWriter
	status int
	bytes  int64
}

func (s *statusRecorder) WriteHeader(status int) {
	if s.status == 0 {
		s.status = status
	}
	s.ResponseWriter.WriteHeader(status)
}

func (s *statusRecorder) Write(b []byte) (int, error) {
	if s.status == 0 {
		s.status = http.StatusOK
	}
	n, err := s.ResponseWriter.Write(b)
	s.bytes += int64(n)
	return n, err
}

func (s *statusRecorder) Unwrap() http.ResponseWriter { return s.ResponseWriter }

// logRequests logs one line per request: method, path, status, duration,
// the Idempotency-Key as sent, whether the answer was a replay, and the
// merchant once authenticated. It never logs the Authorization header.
func logRequests(log *slog.Logger, next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		start := time.Now()
		info := &requestInfo{}
		rec := &statusRecorder{ResponseWriter: w}
		next.ServeHTTP(rec, r.WithContext(context.WithValue(r.Context(), requestInfoKey{}, info)))
		if rec.status == 0 {
			rec.status = http.StatusOK
		}
		level := slog.LevelInfo
		if rec.status >= 500 {
			level = slog.LevelWarn
		}
		log.LogAttrs(r.Context(), level, "request",
			slog.String("method", r.Method),
			slog.String("path", r.URL.Path),
			slog.Int("status", rec.status),
			slog.Float64("duration_ms", float64(time.Since(start).Microseconds())/1000),
			slog.Int64("bytes", rec.bytes),
			slog.String("idempotency_key", loggedKey(r)),
			slog.Bool("replayed", rec.Header().Get(idem.HeaderReplayed) == "true"),
			slog.String("merchant", info.merchant),
		)
	})
}

// loggedKey is the request's key as idem stores it (unquoted, so that
// `idem inspect --key` finds it), or the raw header when it does not parse.
func loggedKey(r *http.Request) string {
	values := r.Header.Values(idem.HeaderKey)
	if key, err := idem.ParseKey(values); err == nil {
		return key
	}
	return strings.Join(values, ", ")
}
