package idem_test

import (
	"io"
	"net/http"
	"strconv"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/idemgo/idem"
	"github.com/idemgo/idem/idemdriver"
)

// Regression (issue 32): a handler's final status outside 200-599 was
// accepted, then net/http panicked sending it (over 999: the connection
// dropped) and the handler ran again on every retry; one under 200 was
// ignored, and the response stored as 200. It is refused at capture: the
// handler's answer is replaced by a 500 invalid-status, recorded SUCCEEDED
// so that every retry replays that 500 byte for byte and the handler, whose
// effects may have happened, never runs again. No status outside 200-599
// is stored.
func TestHandlerStatusOutOfRange(t *testing.T) {
	t.Parallel()
	for _, status := range []int{1000, 600, 99, 0, -1} {
		t.Run(strconv.Itoa(status), func(t *testing.T) {
			t.Parallel()
			d := openSQLite(t)
			runs := 0
			h := newMiddleware(t, d, idem.Options{Replay: idem.ReplayOptions{Headers: append(idem.DefaultReplayHeaders(), "X-Charge")}}).Handler(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
				runs++
				w.Header().Set("X-Charge", "ch_1")
				w.WriteHeader(status)
				w.WriteHeader(http.StatusCreated) // superfluous: the first status counts
				_, _ = io.WriteString(w, "charged")
			}))
			first := send(h, "POST", "/x", "k", "{}")
			requireKind(t, first, http.StatusInternalServerError, "invalid-status")
			require.Empty(t, first.Header().Get("X-Charge"), "idem's answer, not the handler's")
			require.Equal(t, "k", first.Header().Get(idem.HeaderKey))
			rec := record(t, d, idem.SingleTenantScope, "k")
			require.Equal(t, idemdriver.StateSucceeded, rec.State, "recorded: the handler ran, its effects may have happened")
			require.Equal(t, http.StatusInternalServerError, rec.Response.Status)
			for range 2 {
				again := send(h, "POST", "/x", "k", "{}")
				require.Equal(t, http.StatusInternalServerError, again.Code)
				require.Equal(t, "true", again.Header().Get(idem.HeaderReplayed))
				require.Equal(t, first.Body.String(), again.Body.String(), "replayed byte for byte")
				require.Equal(t, first.Header().Get("Content-Type"), again.Header().Get("Content-Type"))
			}
			require.Equal(t, 1, runs)
		})
	}
}

// A 1xx is informational (RFC 9110 section 15.2), never the final status:
// the status the handler writes after it is recorded and replayed.
func TestHandlerInformationalStatus(t *testing.T) {
	t.Parallel()
	d := openSQLite(t)
	h := newMiddleware(t, d, idem.Options{}).Handler(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		w.WriteHeader(http.StatusEarlyHints)
		w.WriteHeader(http.StatusContinue)
		w.WriteHeader(http.StatusCreated)
	}))
	require.Equal(t, http.StatusCreated, send(h, "POST", "/x", "k", "{}").Code)
	require.Equal(t, http.StatusCreated, record(t, d, idem.SingleTenantScope, "k").Response.Status)
	again := send(h, "POST", "/x", "k", "{}")
	require.Equal(t, http.StatusCreated, again.Code)
	require.Equal(t, "true", again.Header().Get(idem.HeaderReplayed))
}

// Regression (issue 32): a stored status outside 200-599 (a damaged row)
// made net/http panic on every retry (the connection dropped, over a real
// server), or was answered as it stood. It answers 500 response-missing,
// and the handler does not run again.
func TestStoredStatusOutOfRange(t *testing.T) {
	t.Parallel()
	for _, status := range []int{1000, 600, 150, 99, 0, -1} {
		t.Run(strconv.Itoa(status), func(t *testing.T) {
			t.Parallel()
			d := openSQLite(t)
			c := &counter{status: http.StatusCreated}
			h := newMiddleware(t, d, idem.Options{Replay: idem.ReplayOptions{Cache: idem.ReplayCacheOptions{Bytes: 1 << 20}}}).Handler(c)
			require.Equal(t, http.StatusCreated, send(h, "POST", "/x", "k", "{}").Code)
			_, err := d.DB().Exec(`UPDATE idem_keys SET response_status = ?`, status)
			require.NoError(t, err)
			for range 2 {
				got := send(h, "POST", "/x", "k", "{}")
				requireKind(t, got, http.StatusInternalServerError, "response-missing")
				require.Empty(t, got.Header().Get(idem.HeaderReplayed))
			}
			require.Equal(t, 1, c.runs)
		})
	}
}
