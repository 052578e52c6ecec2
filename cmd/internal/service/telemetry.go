package service

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"go.opentelemetry.io/contrib/instrumentation/net/http/otelhttp"
	otelprom "go.opentelemetry.io/otel/exporters/prometheus"
	"go.opentelemetry.io/otel/exporters/stdout/stdouttrace"
	"go.opentelemetry.io/otel/metric"
	metricnoop "go.opentelemetry.io/otel/metric/noop"
	"go.opentelemetry.io/otel/propagation"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/resource"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	semconv "go.opentelemetry.io/otel/semconv/v1.40.0"
	"go.opentelemetry.io/otel/trace"
	tracenoop "go.opentelemetry.io/otel/trace/noop"

	"github.com/idemgo/idem"
	"github.com/idemgo/idem/idemotel"
)

// Trace exporters that --otel-traces names.
const (
	TracesNone   = "none"
	TracesStdout = "stdout"
)

// Telemetry is a service's OpenTelemetry wiring: idem's decisions and the
// HTTP server's requests as metrics on a Prometheus registry of its own
// (served by Metrics: idem_*, go_*, process_*), and, when asked for, spans written as JSON lines by
// the stdout exporter. Nothing dials out: it is safe offline.
type Telemetry struct {
	// Observer is idem's Options.Engine.Observer (idemotel).
	Observer idem.Observer
	// Metrics serves the registry in Prometheus' text format (GET
	// /metrics): idem_* (docs/observability.md), go_* and process_*
	// (client_golang's collectors).
	Metrics http.Handler

	meters  *sdkmetric.MeterProvider
	tracers *sdktrace.TracerProvider // nil without traces
	tracerP trace.TracerProvider
}

// MeterProvider is the provider behind Metrics, for instruments of the
// service's own (idemotel.NewUnknownGauges).
func (t *Telemetry) MeterProvider() metric.MeterProvider { return t.meters }

// NewTelemetry sets up the telemetry of the service name (the resource's
// service.name). traces is --otel-traces: TracesNone (or "") for no spans,
// TracesStdout for spans written to out, one JSON object each. It returns an
// error for any other value. Call Shutdown at the end of the run.
func NewTelemetry(name, traces string, out io.Writer) (*Telemetry, error) {
	res := resource.NewWithAttributes(semconv.SchemaURL, semconv.ServiceName(name))
	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	exp, err := otelprom.New(otelprom.WithRegisterer(reg), otelprom.WithoutScopeInfo())
	if err != nil {
		return nil, err
	}
	t := &Telemetry{
		Metrics: promhttp.HandlerFor(reg, promhttp.HandlerOpts{}),
		meters:  sdkmetric.NewMeterProvider(sdkmetric.WithReader(exp), sdkmetric.WithResource(res)),
		tracerP: tracenoop.NewTracerProvider(),
	}
	switch traces {
	case "", TracesNone:
	case TracesStdout:
		se, err := stdouttrace.New(stdouttrace.WithWriter(out))
		if err != nil {
			return nil, err
		}
		t.tracers = sdktrace.NewTracerProvider(sdktrace.WithBatcher(se), sdktrace.WithResource(res))
		t.tracerP = t.tracers
	default:
		return nil, fmt.Errorf("--otel-traces must be %s or %s, not %q", TracesNone, TracesStdout, traces)
	}
	obs, err := idemotel.NewObserver(idemotel.WithMeterProvider(t.meters), idemotel.WithTracerProvider(t.tracerP))
	if err != nil {
		return nil, err
	}
	t.Observer = obs
	return t, nil
}

// Handler wraps h in otelhttp's server instrumentation when spans are on
// (else it returns h): a server span per request, named by its method, the
// parent of idem's spans (a traceparent header the client sent is its own
// parent). Its http.server.* metrics are left out: otelhttp, outside the
// service's ServeMux, would label them with the outer mux's "/" route;
// idem_* metrics carry the protected route.
func (t *Telemetry) Handler(h http.Handler) http.Handler {
	if t.tracers == nil {
		return h
	}
	return otelhttp.NewHandler(h, "http.server",
		otelhttp.WithMeterProvider(metricnoop.NewMeterProvider()), otelhttp.WithTracerProvider(t.tracerP),
		otelhttp.WithPropagators(propagation.TraceContext{}),
		otelhttp.WithSpanNameFormatter(func(_ string, r *http.Request) string { return r.Method }))
}

// ValidTraces reports whether traces is a value --otel-traces accepts:
// TracesNone, "" or TracesStdout.
func ValidTraces(traces string) bool {
	return traces == "" || traces == TracesNone || traces == TracesStdout
}

// ShutdownTelemetry shuts t down at the end of a service's run (5 s at
// most), and logs a failure: Warn "shutting down telemetry".
func ShutdownTelemetry(log *slog.Logger, t *Telemetry) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := t.Shutdown(ctx); err != nil {
		log.Warn("shutting down telemetry", "err", err)
	}
}

// Shutdown flushes the spans not yet written and stops the providers.
func (t *Telemetry) Shutdown(ctx context.Context) error {
	var errs []error
	if t.tracers != nil {
		errs = append(errs, t.tracers.Shutdown(ctx))
	}
	errs = append(errs, t.meters.Shutdown(ctx))
	return errors.Join(errs...)
}
