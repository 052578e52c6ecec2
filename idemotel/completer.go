package idemotel

import (
	"context"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"

	"github.com/idemgo/idem/completer"
)

// CompleterResultKey is what became of one of the completer's executions:
// finished (re-driven, answered 2xx), failed (re-driven, another answer:
// it is tried again later), gave_up (ended UNKNOWN), error (the store did
// not answer).
const CompleterResultKey = attribute.Key("idem.completer.result")

// NewCompleterCounter creates, on the MeterProvider the options name,
//
//   - idem.completer.executions, Int64Counter, unit {execution}: one per
//     abandoned execution the completer re-drove or gave up on, with
//     idem.completer.result,
//
// and returns the function to set as completer.Config.OnRedrive. It
// returns the meter's error if the instrument cannot be created.
func NewCompleterCounter(opts ...Option) (func(completer.Outcome), error) {
	c := newConfig(opts)
	counter, err := c.meterProvider.Meter(ScopeName).Int64Counter("idem.completer.executions", metric.WithUnit("{execution}"),
		metric.WithDescription("Abandoned executions the completer re-drove or gave up on, by result (idem.completer.result)."))
	if err != nil {
		return nil, err
	}
	return func(o completer.Outcome) {
		result := "failed"
		switch {
		case o.Err != nil:
			result = "error"
		case o.GaveUp != "":
			result = "gave_up"
		case o.Status >= 200 && o.Status < 300:
			result = "finished"
		case o.Status == 0:
			return // nothing done: left to its client, or taken meanwhile
		}
		counter.Add(context.Background(), 1, metric.WithAttributes(CompleterResultKey.String(result)))
	}, nil
}
