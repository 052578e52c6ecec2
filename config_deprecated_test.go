package idem_test

import (
	"net/http"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/idemgo/idem"
)

// The deprecated New, NewEngine and WithDefaults still work for one minor
// version: the old constructor with a few fields set behaves as the new
// one, and a validation error through the old path still names the field
// (by its new path). No lint:ignore here: staticcheck's SA1019 does not
// flag the package's own deprecated names in its external test package, and
// an unmatched directive fails the check.
func TestDeprecatedConfig(t *testing.T) {
	t.Parallel()
	d := openSQLite(t)
	obs := &events{}
	old, err := idem.New(idem.Config{EngineConfig: idem.EngineConfig{Store: d, LeaseDuration: 2 * time.Second, Observer: obs}, Scope: idem.SingleTenant, Methods: []string{http.MethodPut}})
	require.NoError(t, err)
	c := &counter{status: http.StatusCreated}
	h := old.Handler(c)
	for range 2 {
		require.Equal(t, http.StatusCreated, send(h, http.MethodPut, "/x", "k", "{}").Code)
	}
	require.Equal(t, 1, c.runs, "the retry is a replay")
	require.Equal(t, http.StatusCreated, send(h, http.MethodPost, "/x", "", "{}").Code, "POST is not protected: Methods carried over")
	require.Equal(t, 2, c.runs)
	require.Len(t, obs.take(), 2, "the Observer carried over")

	// WithDefaults keeps working, field by field as the new one.
	oldDefaults := idem.Config{MaxRequestBytes: 7}.WithDefaults()
	newDefaults := idem.Options{Request: idem.RequestOptions{MaxBytes: 7}}.WithDefaults()
	require.EqualValues(t, 7, oldDefaults.MaxRequestBytes)
	require.Equal(t, newDefaults.Engine.Lease.Duration, oldDefaults.LeaseDuration)
	require.Equal(t, newDefaults.Engine.Lease.MaxExecution, oldDefaults.MaxExecution)
	require.Equal(t, newDefaults.Engine.RetryAfter.Store, oldDefaults.StoreRetryAfter)
	require.Equal(t, newDefaults.Request.Drain.Bytes, oldDefaults.DiscardBytes)
	require.Equal(t, newDefaults.Replay.Headers, oldDefaults.ReplayHeaders)

	_, err = idem.New(idem.Config{EngineConfig: idem.EngineConfig{Store: d, LeaseDuration: 500 * time.Millisecond}, Scope: idem.SingleTenant})
	require.ErrorContains(t, err, "Engine.Lease.Duration 500ms is below 1s")
	_, err = idem.NewEngine(idem.EngineConfig{Store: d, MaxWait: -time.Second})
	require.ErrorContains(t, err, "Waiting.Max must not be negative")
	g, err := idem.NewEngine(idem.EngineConfig{Store: d})
	require.NoError(t, err)
	require.NoError(t, g.Close())
}
