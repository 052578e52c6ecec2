package idemgin_test

import (
	"database/sql"
	"net/http"
	"testing"

	"github.com/gin-gonic/gin"
	"github.com/stretchr/testify/require"

	"github.com/idemgo/idem"
	"github.com/idemgo/idem/adapters/idemgin"
	"github.com/idemgo/idem/internal/adaptertest"
)

// seen is what a handler read through idemgin's helpers, from c.
type seen struct {
	Key      string `json:"key"`
	Attempt  int    `json:"attempt"`
	Relay    string `json:"relay"`
	TxWorked bool   `json:"tx_worked"`
}

func TestHelpersTakeTheGinContext(t *testing.T) {
	// gin code passes c: Execution, RelayKey and Context (with a driver's
	// Tx) find the claim from it, without Engine.ContextWithFallback. The
	// first run answers 503 (FAILED), so the second is another attempt of
	// the same key, with the same relayed key.
	var got []seen
	var errs []error
	url, runs := serve(t, nil, nil, func(c *gin.Context) {
		var s seen
		e, ok := idemgin.Execution(c)
		s.Key, s.Attempt = e.Key, e.Attempt
		if !ok {
			s.Key = "(no execution)"
		}
		relay, err := idemgin.RelayKey(c, "charge")
		s.Relay = relay
		errs = append(errs, err)
		tx, err := idem.Tx[*sql.Tx](idemgin.Context(c))
		if err == nil {
			var one int
			err = tx.QueryRowContext(idemgin.Context(c), "SELECT 1").Scan(&one)
			s.TxWorked = one == 1
		}
		errs = append(errs, err)
		got = append(got, s)
		status := http.StatusServiceUnavailable
		if len(got) > 1 {
			status = http.StatusCreated
		}
		c.JSON(status, s)
	})
	first, second := adaptertest.Twice(t, url, "k")
	require.Equal(t, http.StatusServiceUnavailable, first.Status, "body: %s", first.Body)
	require.Equal(t, http.StatusCreated, second.Status, "body: %s", second.Body)
	require.EqualValues(t, 2, runs.Load())
	for _, err := range errs {
		require.NoError(t, err)
	}
	require.Len(t, got, 2)
	for i, s := range got {
		require.Equal(t, "k", s.Key)
		require.Equal(t, i+1, s.Attempt)
		require.True(t, s.TxWorked)
		require.NotEmpty(t, s.Relay)
		require.NotEqual(t, "k", s.Relay, "the raw key is never relayed")
	}
	require.Equal(t, got[0].Relay, got[1].Relay, "stable across attempts")
}

func TestHelpersOutsideAnExecution(t *testing.T) {
	// GET is not protected: the helpers say so, with the core's errors.
	var execOK bool
	var relayErr, txErr error
	url, _ := serve(t, nil, nil, func(c *gin.Context) {
		_, execOK = idemgin.Execution(c)
		_, relayErr = idemgin.RelayKey(c, "charge")
		_, txErr = idem.Tx[*sql.Tx](idemgin.Context(c))
		c.Status(http.StatusNoContent)
	})
	resp, err := http.Get(url)
	require.NoError(t, err)
	require.NoError(t, resp.Body.Close())
	require.Equal(t, http.StatusNoContent, resp.StatusCode)
	require.False(t, execOK)
	require.ErrorIs(t, relayErr, idem.ErrNoExecution)
	require.ErrorIs(t, txErr, idem.ErrNoExecution)
}
