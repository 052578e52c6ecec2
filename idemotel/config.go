package idemotel

import (
	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/metric"
	"go.opentelemetry.io/otel/trace"
)

// ScopeName is the instrumentation scope of the meter and the tracer
// (otel_scope_name in Prometheus).
const ScopeName = "github.com/idemgo/idem/idemotel"

// config is what the options set.
type config struct {
	meterProvider  metric.MeterProvider
	tracerProvider trace.TracerProvider
}

// Option configures NewObserver.
type Option interface {
	apply(*config)
}

type optionFunc func(*config)

func (f optionFunc) apply(c *config) { f(c) }

// WithMeterProvider sets the MeterProvider the instruments are created
// with. Default (or nil): the global one, otel.GetMeterProvider(), read when
// NewObserver runs.
func WithMeterProvider(mp metric.MeterProvider) Option {
	return optionFunc(func(c *config) {
		if mp != nil {
			c.meterProvider = mp
		}
	})
}

// WithTracerProvider sets the TracerProvider the spans are started with.
// Default (or nil): the global one, otel.GetTracerProvider(), read when
// NewObserver runs.
func WithTracerProvider(tp trace.TracerProvider) Option {
	return optionFunc(func(c *config) {
		if tp != nil {
			c.tracerProvider = tp
		}
	})
}

func newConfig(opts []Option) config {
	c := config{meterProvider: otel.GetMeterProvider(), tracerProvider: otel.GetTracerProvider()}
	for _, o := range opts {
		o.apply(&c)
	}
	return c
}
