package idemotel_test

import (
	"errors"
	"testing"

	"github.com/stretchr/testify/require"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"

	"github.com/idemgo/idem/completer"
	"github.com/idemgo/idem/idemotel"
)

// The completer's counter counts each re-drive or give-up by result; an
// execution left alone (no status, no error) is not counted.
func TestCompleterCounter(t *testing.T) {
	t.Parallel()
	reader := sdkmetric.NewManualReader()
	hook, err := idemotel.NewCompleterCounter(idemotel.WithMeterProvider(sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader))))
	require.NoError(t, err)
	for _, o := range []completer.Outcome{
		{Status: 201}, {Status: 201}, {Status: 503}, {GaveUp: "completer-gave-up"}, {Err: errors.New("down")}, {},
	} {
		hook(o)
	}
	var rm metricdata.ResourceMetrics
	require.NoError(t, reader.Collect(t.Context(), &rm))
	got := map[string]int64{}
	for _, sm := range rm.ScopeMetrics {
		for _, m := range sm.Metrics {
			require.Equal(t, "idem.completer.executions", m.Name)
			for _, dp := range m.Data.(metricdata.Sum[int64]).DataPoints {
				v, _ := dp.Attributes.Value(idemotel.CompleterResultKey)
				got[v.AsString()] = dp.Value
			}
		}
	}
	require.Equal(t, map[string]int64{"finished": 2, "failed": 1, "gave_up": 1, "error": 1}, got)
}
