// Package promtest scrapes a Prometheus endpoint for tests: a real GET of
// the handler's text exposition, parsed with expfmt.
package promtest

import (
	"net/http"
	"testing"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
	"github.com/stretchr/testify/require"
)

// Scrape GETs url (a /metrics endpoint), requires 200, and returns the
// metric families by name.
func Scrape(t testing.TB, url string) map[string]*dto.MetricFamily {
	t.Helper()
	resp, err := http.Get(url)
	require.NoError(t, err)
	defer func() { require.NoError(t, resp.Body.Close()) }()
	require.Equal(t, http.StatusOK, resp.StatusCode)
	p := expfmt.NewTextParser(model.UTF8Validation)
	mfs, err := p.TextToMetricFamilies(resp.Body)
	require.NoError(t, err)
	return mfs
}

// Label is the value of m's label name, "" when absent.
func Label(m *dto.Metric, name string) string {
	for _, l := range m.GetLabel() {
		if l.GetName() == name {
			return l.GetValue()
		}
	}
	return ""
}

// Sum adds the counter values of mf's series whose labels include labels
// (name, value pairs); 0 when mf is nil.
func Sum(mf *dto.MetricFamily, labels ...string) float64 {
	var n float64
series:
	for _, m := range mf.GetMetric() {
		for i := 0; i+1 < len(labels); i += 2 {
			if Label(m, labels[i]) != labels[i+1] {
				continue series
			}
		}
		n += m.GetCounter().GetValue()
	}
	return n
}
