package service

import (
	"context"
	"errors"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"testing"

	"github.com/stretchr/testify/require"
)

func TestHealth(t *testing.T) {
	t.Parallel()
	api := &API{Name: "svc", ProblemTypeBase: "https://example.com/svc#"}
	gone, down := errors.New("gone"), errors.New("down")
	for _, tc := range []struct {
		name        string
		file, probe error
		retryAfter  bool
		status      int
		header      string
	}{
		{"ok", nil, nil, true, http.StatusOK, ""},
		{"file gone", gone, nil, false, http.StatusServiceUnavailable, ""},
		{"database down, retry later", nil, down, true, http.StatusServiceUnavailable, "1"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			h := Health{API: api, Log: slog.New(slog.DiscardHandler), RetryAfter: tc.retryAfter,
				CheckFile: func() error { return tc.file },
				Probe: func(ctx context.Context) error {
					_, ok := ctx.Deadline()
					require.True(t, ok, "bounded by HealthTimeout")
					return tc.probe
				}}
			rec := httptest.NewRecorder()
			h.ServeHTTP(rec, httptest.NewRequest(http.MethodGet, "/healthz", nil))
			require.Equal(t, tc.status, rec.Code, rec.Body.String())
			require.Equal(t, tc.header, rec.Header().Get("Retry-After"))
		})
	}
}
