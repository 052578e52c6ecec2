package main

import (
	"context"
	"log/slog"
	"net/http"
	"time"

	"github.com/idemgo/idem"
)

// requestInfo collects what inner layers learn about a request for its log line.
type requestInfo struct {
	merchant string
	withheld bool
}

type requestInfoKey struct{}

func requestInfoFrom(ctx context.Context) *requestInfo {
	info, _ := ctx.Value(requestInfoKey{}).(*requestInfo)
	return info
}

type statusRecorder struct {
	http.ResponseWriter
	status int
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
	return s.ResponseWriter.Write(b)
}

func (s *statusRecorder) Unwrap() http.ResponseWriter { return s.ResponseWriter }

// logRequests logs one line per request: method, path, status (0 when no
// answer was sent: the client hung up on a withheld answer), duration, the
// Idempotency-Key, whether the answer was idem's replay, whether it was
// withheld, and the merchant. The API key is never logged.
func logRequests(log *slog.Logger, next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		start := time.Now()
		info := &requestInfo{}
		rec := &statusRecorder{ResponseWriter: w}
		next.ServeHTTP(rec, r.WithContext(context.WithValue(r.Context(), requestInfoKey{}, info)))
		level := slog.LevelInfo
		if rec.status >= 500 {
			level = slog.LevelWarn
		}
		log.LogAttrs(r.Context(), level, "request",
			slog.String("method", r.Method),
			slog.String("path", r.URL.Path),
			slog.Int("status", rec.status),
			slog.Float64("duration_ms", float64(time.Since(start).Microseconds())/1000),
			slog.String("idempotency_key", r.Header.Get(idem.HeaderKey)),
			slog.Bool("replayed", rec.Header().Get(idem.HeaderReplayed) == "true"),
			slog.Bool("withheld", info.withheld),
			slog.String("merchant", info.merchant),
		)
	})
}
