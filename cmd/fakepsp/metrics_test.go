package main

import (
	"net/http"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/idemgo/idem/cmd/internal/promtest"
	"github.com/idemgo/idem/cmd/internal/service"
)

// fakepsp serves its idem metrics at GET /metrics, without
// authentication, labelled with the protected route.
func TestServesMetrics(t *testing.T) {
	t.Parallel()
	tel, err := service.NewTelemetry("fakepsp", service.TracesNone, nil)
	require.NoError(t, err)
	p := startPSP(t, handlerConfig{Observer: tel.Observer, Metrics: tel.Metrics})
	require.Equal(t, http.StatusCreated, p.charge("acme", "m-1", "application/json", chargeBody).status)
	require.Equal(t, http.StatusCreated, p.charge("acme", "m-1", "application/json", chargeBody).status)
	mfs := promtest.Scrape(t, p.url+"/metrics")
	route := []string{"http_route", "/v1/charges", "http_request_method", "POST"}
	require.Equal(t, 1.0, promtest.Sum(mfs["idem_decisions_total"], append(route, "idem_decision", "executed")...))
	require.Equal(t, 1.0, promtest.Sum(mfs["idem_decisions_total"], append(route, "idem_decision", "replayed")...))
}
