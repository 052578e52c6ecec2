package idemotel_test

import (
	"context"
	"errors"
	"net/http"
	"testing"

	"github.com/stretchr/testify/require"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"

	"github.com/idemgo/idem"
	"github.com/idemgo/idem/idemotel"
)

// The UNKNOWN gauges read the store at each collection: 0 and 0 s before,
// then the records an at-most-once step left UNKNOWN and the oldest's age.
func TestUnknownGauges(t *testing.T) {
	t.Parallel()
	h := newHarness(t, func(w http.ResponseWriter, r *http.Request) {
		_, err := idem.Step(r.Context(), "sms", func(context.Context) (bool, error) {
			return false, errors.New("the gateway timed out")
		}, idem.AtMostOnce())
		http.Error(w, err.Error(), http.StatusGatewayTimeout)
	})
	reader := sdkmetric.NewManualReader()
	reg, err := idemotel.NewUnknownGauges(h.d, idemotel.WithMeterProvider(sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader))))
	require.NoError(t, err)
	t.Cleanup(func() { _ = reg.Unregister() })
	gauges := func() (int64, float64) {
		var rm metricdata.ResourceMetrics
		require.NoError(t, reader.Collect(t.Context(), &rm))
		var n int64
		var age float64
		for _, sm := range rm.ScopeMetrics {
			for _, m := range sm.Metrics {
				switch d := m.Data.(type) {
				case metricdata.Gauge[int64]:
					require.Equal(t, "idem.unknown.records", m.Name)
					n = d.DataPoints[0].Value
				case metricdata.Gauge[float64]:
					require.Equal(t, "idem.unknown.oldest_age", m.Name)
					age = d.DataPoints[0].Value
				}
			}
		}
		return n, age
	}
	n, age := gauges()
	require.Zero(t, n)
	require.Zero(t, age)
	for _, key := range []string{"a", "b"} {
		res, _ := h.send(key, `{}`)
		require.Equal(t, http.StatusConflict, res.Code)
	}
	n, age = gauges()
	require.EqualValues(t, 2, n)
	require.GreaterOrEqual(t, age, 0.0)
}
