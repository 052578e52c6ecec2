package main

import (
	"context"
	"io"
	"net/http"
	"path/filepath"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// A server that dies just as the load ends (the last SIGKILL of --chaos,
// or a crash injected into a handler still running for a request its
// client gave up on) is restarted by waitAllHealthy, not reported as
// "exited before it was healthy". Regression: CI's TestStormSQLiteChaos
// failed that way when the kill raced the end of the load.
func TestWaitAllHealthyRestartsAServerThatJustDied(t *testing.T) {
	o := &options{
		paymentsdBin: paymentsdBin(t),
		databaseURL:  "sqlite:" + filepath.Join(t.TempDir(), "fleet.db"),
		logDir:       t.TempDir(),
		servers:      2,
	}
	fl, cleanup, err := startFleet(context.Background(), o, io.Discard)
	require.NoError(t, err)
	defer cleanup(false)

	for round := range 3 {
		s := fl.servers[round%2]
		s.mu.Lock()
		s.killedByUs = true
		require.NoError(t, s.proc.Signal(syscall.SIGKILL))
		s.mu.Unlock()
		// No wait for the exit: waitAllHealthy starts while the process
		// is dying, as it does after the last kill of a storm.
		require.NoError(t, fl.waitAllHealthy(context.Background(), time.Minute))
		for _, s := range fl.servers {
			resp, err := http.Get(s.proc.URL() + "/healthz")
			require.NoError(t, err, s.name)
			resp.Body.Close()
			require.Equal(t, 200, resp.StatusCode, s.name)
		}
	}
	sum := fl.summary()
	require.Equal(t, []int{3, 2}, sum.Generations) // every kill was followed by one restart
	require.Equal(t, int64(0), sum.Crashes)        // our kills are not counted as crashes
}
