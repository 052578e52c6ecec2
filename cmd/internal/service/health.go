package service

import (
	"context"
	"log/slog"
	"net/http"
	"time"
)

// HealthTimeout bounds the database checks of GET /healthz (Health).
const HealthTimeout = 2 * time.Second

// Health is a service's GET /healthz, without authentication.
type Health struct {
	API *API
	Log *slog.Logger
	// CheckFile reports a SQLite file deleted or replaced since it was
	// opened (DB.CheckFile): every read still succeeds on the deleted inode,
	// while the writes would be lost at the next start.
	CheckFile func() error
	// Probe reaches the database within ctx (HealthTimeout).
	Probe func(ctx context.Context) error
	// RetryAfter adds "Retry-After: 1" to the 503 answers (API.WriteRetryLater).
	RetryAfter bool
}

// ServeHTTP answers 200 {"status":"ok"} when CheckFile, then Probe, return
// nil; otherwise 503 unavailable, logged (Error for the file, Warn for the
// probe), whose detail says to restart the service (the file) or that the
// database does not answer (the probe).
func (h Health) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	ctx, cancel := context.WithTimeout(r.Context(), HealthTimeout)
	defer cancel()
	unavailable := h.API.WriteProblem
	if h.RetryAfter {
		unavailable = h.API.WriteRetryLater
	}
	if err := h.CheckFile(); err != nil {
		h.Log.ErrorContext(ctx, "health check: the database file is gone", "err", err)
		unavailable(w, ProblemUnavailable, http.StatusServiceUnavailable,
			"the database file was deleted or replaced since the service opened it; restart the service")
		return
	}
	if err := h.Probe(ctx); err != nil {
		h.Log.WarnContext(ctx, "health check: database failed", "err", err)
		unavailable(w, ProblemUnavailable, http.StatusServiceUnavailable, "the database does not answer")
		return
	}
	h.API.WriteJSON(w, http.StatusOK, map[string]string{"status": "ok"})
}
