package httpwrite

import (
	"bytes"
	"net/http"
	"net/http/httptest"
	"strconv"
	"testing"

	"github.com/stretchr/testify/require"
)

// FuzzCaptureWriter drives the response capture with a handler's calls
// decoded from the input (set a header, declare or set a trailer, write the
// header, write, flush) and checks that nothing reaches the client before
// send, and that send delivers what net/http would have: the first status
// (200 when none), the headers as they were at WriteHeader, every byte
// written (where the status allows a body) with an exact Content-Length
// unless trailers are set, and the trailers.
func FuzzCaptureWriter(f *testing.F) {
	f.Add([]byte{0, 'C', 1, 201, 3, 'a', 'b', 4, 3, 'c'})
	f.Add([]byte{2, 'X', 1, 204, 3, 'z', 5, 'X'})
	f.Add([]byte{3, 'q', 1, 100, 1, 250, 6, 'G', 3, 'r'})
	f.Add([]byte{1, 130, 1, 200, 0, 'L'})
	f.Fuzz(func(t *testing.T, ops []byte) {
		rec := httptest.NewRecorder()
		c := NewCapture(rec)
		var (
			wrote  bytes.Buffer
			status int
		)
		next := func(i *int) byte {
			*i++
			if *i < len(ops) {
				return ops[*i]
			}
			return 'v'
		}
		for i := 0; i < len(ops); i++ {
			switch ops[i] % 7 {
			case 0: // set a header
				c.Header().Set("X-H"+string(rune('A'+next(&i)%26)), "v")
			case 1: // write the header: 100 to 355
				code := 100 + int(next(&i))
				if code >= 200 && status == 0 {
					status = code
				}
				c.WriteHeader(code)
			case 2: // declare a trailer
				c.Header().Add("Trailer", "X-T"+string(rune('A'+next(&i)%26)))
			case 3: // write a byte
				b := next(&i)
				if status == 0 {
					status = http.StatusOK
				}
				n, err := c.Write([]byte{b})
				require.NoError(t, err)
				require.Equal(t, 1, n)
				wrote.WriteByte(b)
			case 4:
				c.Flush()
			case 5: // set a declared trailer's value
				c.Header().Set("X-T"+string(rune('A'+next(&i)%26)), "t")
			case 6: // set a trailer through http.TrailerPrefix
				c.Header().Set(http.TrailerPrefix+"X-P"+string(rune('A'+next(&i)%26)), "p")
			}
		}
		require.False(t, rec.Flushed, "nothing reaches the client before send")
		require.Empty(t, rec.Body.Bytes())
		if status == 0 {
			status = http.StatusOK
		}
		require.Equal(t, status, c.Status())
		trailers := c.Trailers()
		c.Send(nil)
		res := rec.Result()
		require.Equal(t, status, res.StatusCode)
		bodyAllowed := status != http.StatusNoContent && status != http.StatusNotModified
		if bodyAllowed {
			require.Equal(t, wrote.Bytes(), rec.Body.Bytes())
			if len(trailers) == 0 {
				require.Equal(t, strconv.Itoa(wrote.Len()), res.Header.Get("Content-Length"))
			} else {
				require.Empty(t, res.Header.Get("Content-Length"), "trailers need a body without Content-Length")
			}
		} else {
			require.Empty(t, rec.Body.Bytes())
		}
		for name, v := range trailers {
			require.Equal(t, v, res.Trailer[name], "trailer %s", name)
			require.Empty(t, res.Header.Get(name), "a trailer is not a header")
		}
	})
}
