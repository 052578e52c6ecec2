package httpread

import (
	"math"
	"net/http"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// Regression (issue 32): Prefer was split at every comma, inside quoted
// strings too, so `foo="a, wait=3", wait=0` waited 3 s; RFC 7240 section 2
// with RFC 9110's quoted-string makes it one preference foo and one wait=0.
func TestPreferredWaitGrammar(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		lines []string
		want  time.Duration
		ok    bool
	}{
		{[]string{`foo="a, wait=3", wait=0`}, 0, true},
		{[]string{`foo="a\", wait=3", wait=0`}, 0, true},                              // an escaped quote
		{[]string{`foo="a` + "\x01" + `, wait=3, b", wait=7`}, 7 * time.Second, true}, // a malformed quoted string still hides its commas
		{[]string{`foo="unterminated, wait=3`}, 0, false},
		{[]string{`foo=a"b, wait=3", wait=4`}, 4 * time.Second, true},
		{[]string{`wait=5`}, 5 * time.Second, true},
		{[]string{`WAIT = 5`}, 5 * time.Second, true}, // names without regard to case; BWS around "="
		{[]string{`wait="5"`}, 5 * time.Second, true},
		{[]string{`wait=5; foo="x, wait=1"`}, 5 * time.Second, true},
		{[]string{`wait=5 ;;x; y = "z"`}, 5 * time.Second, true},
		{[]string{`respond-async, wait=30`}, 30 * time.Second, true},
		{[]string{`return=minimal`, `wait=4`}, 4 * time.Second, true}, // field lines make one list
		{[]string{`, ,wait=6,`}, 6 * time.Second, true},               // empty elements
		{[]string{`foo bar, wait=6`}, 6 * time.Second, true},          // a malformed element is skipped
		{[]string{`wait=2, wait=5`}, 2 * time.Second, true},           // the first counts
		{[]string{`wait=nonsense, wait=5`}, 0, false},
		{[]string{`wait`}, 0, false},
		{[]string{`wait=""`}, 0, false},
		{[]string{`wait=-1`}, 0, false},
		{[]string{`wait=+1`}, 0, false},
		{[]string{`wait=1.5`}, 0, false},
		{[]string{`x=y;wait=3`}, 0, false}, // a parameter is no preference
		{[]string{"wait=0"}, 0, true},
		{[]string{"wait=2147483647"}, 2147483647 * time.Second, true},
		// Regression: too large to parse was ignored (the server's Wait,
		// often none); it is the longest wait, which MaxWait caps.
		{[]string{"wait=2147483648"}, math.MaxInt64, true},
		{[]string{"wait=99999999999"}, math.MaxInt64, true},
		{[]string{`wait=99999999999999999999`}, math.MaxInt64, true},
		{[]string{"wait=-99999999999999999999"}, 0, false},
		{[]string{"waiting=5"}, 0, false},
		{nil, 0, false},
	} {
		r := &http.Request{Header: http.Header{"Prefer": tc.lines}}
		got, ok := PreferredWait(r)
		require.Equal(t, tc.ok, ok, "%q", tc.lines)
		require.Equal(t, tc.want, got, "%q", tc.lines)
	}
}
