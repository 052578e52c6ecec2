package idemotel

import (
	"context"
	"time"

	"go.opentelemetry.io/otel/metric"

	"github.com/idemgo/idem/idemdriver"
)

// UnknownTimeout bounds the store read of each collection of the UNKNOWN
// gauges.
const UnknownTimeout = 5 * time.Second

// NewUnknownGauges registers, on the MeterProvider the options name, two
// gauges read from store at each collection (one indexed read,
// idemdriver.UnknownCounter; docs/contract.md section 11.3):
//
//   - idem.unknown.records, Int64ObservableGauge, unit {record}: the records
//     held UNKNOWN, whose outcome cannot be known until an operator runs
//     idem resolve;
//   - idem.unknown.oldest_age, Float64ObservableGauge, unit s: how long ago
//     the oldest of them last changed (0 with none), by the database's
//     clock.
//
// Register them in one process per database (they count the whole store).
// A read that fails (within UnknownTimeout) reports nothing for that
// collection. Unregister the returned registration to stop. It returns the
// meter's error if an instrument cannot be created.
func NewUnknownGauges(store idemdriver.UnknownCounter, opts ...Option) (metric.Registration, error) {
	c := newConfig(opts)
	meter := c.meterProvider.Meter(ScopeName)
	records, err := meter.Int64ObservableGauge("idem.unknown.records", metric.WithUnit("{record}"),
		metric.WithDescription("Records held UNKNOWN: an at-most-once step's outcome cannot be known (idem resolve ends them)."))
	if err != nil {
		return nil, err
	}
	age, err := meter.Float64ObservableGauge("idem.unknown.oldest_age", metric.WithUnit("s"),
		metric.WithDescription("How long ago the oldest UNKNOWN record last changed; 0 with none."))
	if err != nil {
		return nil, err
	}
	return meter.RegisterCallback(func(ctx context.Context, o metric.Observer) error {
		ctx, cancel := context.WithTimeout(ctx, UnknownTimeout)
		defer cancel()
		n, oldest, now, err := store.CountUnknown(ctx, 0)
		if err != nil {
			return err
		}
		o.ObserveInt64(records, n)
		a := 0.0
		if n > 0 && !oldest.IsZero() {
			a = max(now.Sub(oldest).Seconds(), 0)
		}
		o.ObserveFloat64(age, a)
		return nil
	}, records, age)
}
