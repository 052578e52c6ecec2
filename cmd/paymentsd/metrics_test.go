package main

import (
	"net/http"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/idemgo/idem/cmd/internal/promtest"
)

// The command serves its idem metrics at GET /metrics, without
// authentication, labelled with the protected route.
func TestRunServesMetrics(t *testing.T) {
	t.Parallel()
	s, stop := startRun(t, "--database-url", filepath.Join(t.TempDir(), "p.db"), "--psp-latency", "0s")
	defer stop()
	before := promtest.Scrape(t, s.url+"/metrics")
	require.Zero(t, promtest.Sum(before["idem_decisions_total"]))
	require.NotNil(t, before["idem_takeovers_total"], "the takeover counter is there before any takeover")

	require.Equal(t, http.StatusCreated, s.postJSON("acme", "m-1", paymentBody).status)
	require.Equal(t, http.StatusCreated, s.postJSON("acme", "m-1", paymentBody).status)
	mfs := promtest.Scrape(t, s.url+"/metrics")
	route := []string{"http_route", "/v1/payments", "http_request_method", "POST"}
	require.Equal(t, 1.0, promtest.Sum(mfs["idem_decisions_total"], append(route, "idem_decision", "executed", "idem_outcome", "succeeded")...))
	require.Equal(t, 1.0, promtest.Sum(mfs["idem_decisions_total"], append(route, "idem_decision", "replayed")...))
	require.NotNil(t, mfs["idem_handler_duration_seconds"])
	require.Equal(t, http.StatusMethodNotAllowed, s.do(http.MethodPost, "/metrics", "").status)
}
