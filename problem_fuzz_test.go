package idem_test

import (
	"encoding/json"
	"net/http/httptest"
	"strconv"
	"strings"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/stretchr/testify/require"

	"github.com/idemgo/idem"
)

// kinds are the sentinels of every problem kind, for the fuzz targets.
var kinds = []error{
	idem.ErrMissingKey, idem.ErrInvalidKey, idem.ErrMissingScope, idem.ErrScopeUnstorable, idem.ErrPathTooLong,
	idem.ErrRequestTooLarge, idem.ErrBodyUnreadable, idem.ErrKeyReused, idem.ErrInFlight, idem.ErrLeaseLost,
	idem.ErrResponseNotStored, idem.ErrResponseMissing, idem.ErrTxAborted, idem.ErrStoreUnavailable, nil,
	idem.ErrInvalidStatus,
}

// FuzzProblemWrite: whatever its detail, extra members and Retry-After,
// a problem is one valid JSON object of RFC 9457 with its own type, title
// and status (extra members never override them), sent as
// application/problem+json with a Retry-After of whole seconds, at least 1.
func FuzzProblemWrite(f *testing.F) {
	f.Add(uint8(0), "send Idempotency-Key: <a UUID> & retry", "original_status", "201", int64(0))
	f.Add(uint8(8), "busy", "type", "about:blank", int64(1500*time.Millisecond))
	f.Add(uint8(13), "caf\xe9 \u2028 \"quoted\"\n", "status", "200", int64(-1))
	f.Add(uint8(14), "", "", "", int64(1<<62))
	f.Add(uint8(3), "x", "", "", int64(1<<63-1)) // regression: the rounding overflowed to Retry-After: 1
	f.Fuzz(func(t *testing.T, kind uint8, detail, extraKey, extraValue string, retryAfter int64) {
		p := idem.ProblemFor(kinds[int(kind)%len(kinds)], detail)
		p.RetryAfter = time.Duration(retryAfter)
		if extraKey != "" {
			p.Extra = map[string]any{extraKey: extraValue}
		}
		rec := httptest.NewRecorder()
		p.Write(rec)
		require.Equal(t, p.Status, rec.Code)
		require.Equal(t, "application/problem+json", rec.Header().Get("Content-Type"))
		require.Equal(t, "no-store", rec.Header().Get("Cache-Control"))
		require.True(t, strings.HasSuffix(rec.Body.String(), "}\n"))
		var got map[string]any
		require.NoError(t, json.Unmarshal(rec.Body.Bytes(), &got), "%q", rec.Body.String())
		require.Equal(t, p.Type, got["type"])
		require.Equal(t, p.Title, got["title"])
		require.EqualValues(t, p.Status, got["status"])
		if detail != "" && utf8.ValidString(detail) {
			require.Equal(t, detail, got["detail"])
		}
		if ra := rec.Header().Get("Retry-After"); retryAfter > 0 {
			n, err := strconv.ParseInt(ra, 10, 64)
			require.NoError(t, err, "Retry-After %q", ra)
			require.GreaterOrEqual(t, n, int64(1))
			want := retryAfter / int64(time.Second)
			if retryAfter%int64(time.Second) != 0 {
				want++
			}
			require.Equal(t, max(want, 1), n, "whole seconds, rounded up")
		} else {
			require.Empty(t, ra)
		}
	})
}
