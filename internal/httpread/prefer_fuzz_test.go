package httpread

import (
	"net/http"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// FuzzPrefer checks the Prefer parser (RFC 7240 section 2 with RFC 9110's
// quoted-string) on any field line: it yields well-formed preferences only,
// each named by a token, and what it yields, written back in canonical form,
// parses to the same; and whatever a quoted string holds (quotes and
// backslashes escaped, any other byte as it is, control bytes included), its
// commas separate nothing: `foo="<junk>", wait=N` waits N seconds.
func FuzzPrefer(f *testing.F) {
	f.Add(`foo="a, wait=3", wait=0`, "a, wait=3", uint16(0), uint8(0))
	f.Add(`respond-async, wait=10; p="x\"y", return=minimal`, `x", wait=9, "`, uint16(10), uint8(1))
	f.Add("foo=\"a\x01, wait=3, b\", wait=7", "\x01, wait=3", uint16(7), uint8(2))
	f.Add(`foo="unterminated, wait=3`, `\`, uint16(65535), uint8(3))
	f.Add(`, ,WAIT = "5" ;;x; y = "z",`, "\\\"", uint16(5), uint8(4))
	f.Fuzz(func(t *testing.T, line, junk string, n uint16, shape uint8) {
		got := slices.Collect(preferences([]string{line}))
		var canonical []string
		for _, p := range got {
			_, end, ok := token(p.name, 0)
			require.True(t, ok && end == len(p.name), "the name %q is a token", p.name)
			c := p.name
			if p.value != "" {
				c += "=" + quote(p.value)
			}
			canonical = append(canonical, c)
		}
		again := slices.Collect(preferences([]string{strings.Join(canonical, ", ")}))
		if len(got) == 0 {
			require.Empty(t, again)
		} else {
			require.Equal(t, got, again, "canonical form of %q", line)
		}
		_, _ = PreferredWait(&http.Request{Header: http.Header{"Prefer": {line}}})

		ows := []string{"", " ", "\t", " \t "}[shape%4]
		hidden := "foo" + ows + "=" + ows + quote(junk)
		if shape&4 != 0 {
			hidden = "x;" + ows + "p" + ows + "=" + ows + quote(junk) // a parameter's value
		}
		prefer := hidden + ows + "," + ows + "wait" + ows + "=" + ows + strconv.Itoa(int(n))
		d, ok := PreferredWait(&http.Request{Header: http.Header{"Prefer": {prefer}}})
		require.True(t, ok, "%q", prefer)
		require.Equal(t, time.Duration(n)*time.Second, d, "%q", prefer)
	})
}

// quote writes s as an RFC 9110 quoted-string, escaping '"' and '\'.
func quote(s string) string {
	return `"` + strings.NewReplacer(`\`, `\\`, `"`, `\"`).Replace(s) + `"`
}
