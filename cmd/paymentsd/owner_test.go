package main

import (
	"fmt"
	"net/http"
	"os"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/idemgo/idem/idemdriver"
)

// paymentsd's claims name the instance that made them (idem's
// Options.Engine.Lease.Owner, "<hostname>/<pid>" by default), so `idem stuck` says whose
// worker died.
func TestClaimsNameTheInstance(t *testing.T) {
	t.Parallel()
	store := newSQLiteStore(t)
	s := startServer(t, store, nil)
	require.Equal(t, http.StatusCreated, s.postJSON("acme", "own-1", paymentBody).status)
	rec, err := store.Idem().Get(t.Context(), idemdriver.GetParams{Scope: "acme", Key: "own-1"})
	require.NoError(t, err)
	host, err := os.Hostname()
	require.NoError(t, err)
	require.Equal(t, fmt.Sprintf("%s/%d", host, os.Getpid()), rec.Owner)
}
