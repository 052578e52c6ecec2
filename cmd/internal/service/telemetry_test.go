package service_test

import (
	"bufio"
	"bytes"
	"encoding/json"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"strings"
	"testing"

	dto "github.com/prometheus/client_model/go"
	"github.com/stretchr/testify/require"

	"github.com/idemgo/idem"
	"github.com/idemgo/idem/cmd/internal/promtest"
	"github.com/idemgo/idem/cmd/internal/service"
	"github.com/idemgo/idem/idemsqlite"
)

// protected is a ServeMux with POST /pay/{id} behind a real idem
// middleware on SQLite observed by tel, the whole wrapped by tel.Handler.
func protected(t *testing.T, tel *service.Telemetry) http.Handler {
	t.Helper()
	d, err := idemsqlite.Open(t.Context(), filepath.Join(t.TempDir(), "idem.db"))
	require.NoError(t, err)
	t.Cleanup(func() { _ = d.Close() })
	require.NoError(t, d.Migrate(t.Context()))
	mw, err := idem.NewMiddleware(d, idem.Options{Engine: idem.EngineOptions{Logger: slog.New(slog.DiscardHandler), Observer: tel.Observer}, Scope: idem.SingleTenant})
	require.NoError(t, err)
	mux := http.NewServeMux()
	mux.Handle("POST /pay/{id}", mw.Handler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.WriteHeader(http.StatusCreated)
	})))
	mux.Handle("GET /metrics", tel.Metrics)
	return tel.Handler(mux)
}

func post(t *testing.T, url, key, body string, header ...string) int {
	t.Helper()
	req, err := http.NewRequestWithContext(t.Context(), "POST", url+"/pay/1", strings.NewReader(body))
	require.NoError(t, err)
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set(idem.HeaderKey, key)
	for i := 0; i+1 < len(header); i += 2 {
		req.Header.Set(header[i], header[i+1])
	}
	resp, err := http.DefaultClient.Do(req)
	require.NoError(t, err)
	require.NoError(t, resp.Body.Close())
	return resp.StatusCode
}

// The metrics of idem's decisions reach a real Prometheus scrape under the
// names, units and labels docs/observability.md lists; the takeover counter
// is there, at 0, before any takeover.
func TestTelemetryPrometheusScrape(t *testing.T) {
	t.Parallel()
	tel, err := service.NewTelemetry("test", service.TracesNone, nil)
	require.NoError(t, err)
	t.Cleanup(func() { require.NoError(t, tel.Shutdown(t.Context())) })
	srv := httptest.NewServer(protected(t, tel))
	t.Cleanup(srv.Close)

	require.Equal(t, 201, post(t, srv.URL, "k", "{}"))
	require.Equal(t, 201, post(t, srv.URL, "k", "{}"))      // replayed
	require.Equal(t, 422, post(t, srv.URL, "k", `{"a":1}`)) // key reused
	mfs := promtest.Scrape(t, srv.URL+"/metrics")

	decisions := mfs["idem_decisions_total"]
	require.NotNil(t, decisions, "idem.decisions as idem_decisions_total")
	require.Equal(t, dto.MetricType_COUNTER, decisions.GetType())
	got := map[string]float64{}
	for _, m := range decisions.GetMetric() {
		require.Equal(t, "/pay/{id}", promtest.Label(m, "http_route"))
		require.Equal(t, "POST", promtest.Label(m, "http_request_method"))
		got[promtest.Label(m, "idem_decision")+" "+promtest.Label(m, "http_response_status_code")] += m.GetCounter().GetValue()
	}
	require.Equal(t, map[string]float64{"executed 201": 1, "replayed 201": 1, "key_reused 422": 1}, got)

	takeovers := mfs["idem_takeovers_total"]
	require.NotNil(t, takeovers, "the takeover counter is exported before the first takeover")
	require.Len(t, takeovers.GetMetric(), 1)
	require.Zero(t, takeovers.GetMetric()[0].GetCounter().GetValue())

	for name, count := range map[string]uint64{"idem_claim_duration_seconds": 3, "idem_handler_duration_seconds": 1, "idem_completion_duration_seconds": 1} {
		mf := mfs[name]
		require.NotNil(t, mf, name)
		require.Equal(t, dto.MetricType_HISTOGRAM, mf.GetType(), name)
		var n uint64
		for _, m := range mf.GetMetric() {
			n += m.GetHistogram().GetSampleCount()
			require.Positive(t, m.GetHistogram().GetSampleSum(), name)
		}
		require.Equal(t, count, n, name)
	}
	require.NotNil(t, mfs["go_goroutines"], "the Go collector")
}

// stdoutSpan is the part of stdouttrace's JSON read here.
type stdoutSpan struct {
	Name        string
	SpanContext struct{ TraceID, SpanID string }
	Parent      struct{ TraceID, SpanID string }
	Attributes  []struct {
		Key   string
		Value struct{ Value any }
	}
}

// With --otel-traces stdout, each request's server span (continuing the
// client's traceparent) is written with idem's claim, execute and complete
// spans as its children.
func TestTelemetryStdoutTraces(t *testing.T) {
	t.Parallel()
	var out bytes.Buffer
	tel, err := service.NewTelemetry("test", service.TracesStdout, &out)
	require.NoError(t, err)
	srv := httptest.NewServer(protected(t, tel))
	const traceID = "4bf92f3577b34da6a3ce929d0e0e4736"
	require.Equal(t, 201, post(t, srv.URL, "k", "{}", "traceparent", "00-"+traceID+"-00f067aa0ba902b7-01"))
	srv.Close()
	require.NoError(t, tel.Shutdown(t.Context())) // flushes the batch

	byName := map[string]stdoutSpan{}
	sc := bufio.NewScanner(&out)
	sc.Buffer(nil, 1<<20)
	for sc.Scan() {
		var s stdoutSpan
		require.NoError(t, json.Unmarshal(sc.Bytes(), &s), sc.Text())
		byName[s.Name] = s
	}
	require.NoError(t, sc.Err())
	server, ok := byName["POST"]
	require.True(t, ok, "the server span, got %v", byName)
	require.Equal(t, traceID, server.SpanContext.TraceID, "continues the client's trace")
	for _, name := range []string{"idem.claim", "idem.execute", "idem.complete"} {
		s, ok := byName[name]
		require.True(t, ok, name)
		require.Equal(t, server.SpanContext.SpanID, s.Parent.SpanID, name+" is a child of the server span")
		var decision any
		for _, a := range s.Attributes {
			if a.Key == "idem.decision" {
				decision = a.Value.Value
			}
		}
		require.Equal(t, "executed", decision, name)
	}
}

// --otel-traces takes none or stdout only.
func TestTelemetryRejectsUnknownTraces(t *testing.T) {
	t.Parallel()
	_, err := service.NewTelemetry("test", "otlp", nil)
	require.ErrorContains(t, err, `--otel-traces must be none or stdout, not "otlp"`)
	require.False(t, service.ValidTraces("otlp"))
	require.True(t, service.ValidTraces(""))
}
