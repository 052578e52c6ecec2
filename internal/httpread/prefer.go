// Package httpread reads what idem needs of a request: its body, within
// its limit and so that a refusal reaches the client, and its Prefer wait.
package httpread

import (
	"errors"
	"iter"
	"math"
	"net/http"
	"strconv"
	"strings"
	"time"
)

// The Prefer request header (RFC 7240), of which idem reads "wait"
// (section 4.3). Its grammar (section 2, with RFC 9110's list, token and
// quoted-string, sections 5.6.1 to 5.6.4):
//
//	Prefer     = 1#preference
//	preference = token [ BWS "=" BWS word ] *( OWS ";" [ OWS parameter ] )
//	parameter  = token [ BWS "=" BWS word ]
//	word       = token / quoted-string
//
// A comma inside a quoted string separates nothing: `foo="a, wait=3",
// wait=0` holds two preferences, foo and wait=0.

// preference is one element of a Prefer field: its name as sent (compared
// without regard to case, section 2) and its value, unquoted ("" for none:
// an empty value is none, section 2). Parameters are read and dropped: idem
// uses none.
type preference struct {
	name, value string
}

// preferences yields the well-formed preferences of the Prefer field lines,
// in order (several lines are one list, RFC 9110 section 5.3). An element
// that does not match the grammar is skipped up to the next comma outside
// a quoted string; an unterminated quoted string ends its line. Empty
// elements are allowed (RFC 9110 section 5.6.1).
func preferences(lines []string) iter.Seq[preference] {
	return func(yield func(preference) bool) {
		for _, line := range lines {
			for i := 0; i < len(line); {
				p, next, ok := parsePreference(line, i)
				if ok && !yield(p) {
					return
				}
				i = next
			}
		}
	}
}

// parsePreference reads the list element of s at i (after any empty ones)
// and returns it, where the next one starts, and whether it was well-formed.
func parsePreference(s string, i int) (preference, int, bool) {
	i = skipElementSeparators(s, i)
	if i == len(s) {
		return preference{}, i, false
	}
	start := i
	var p preference
	var ok bool
	p.name, i, ok = token(s, i)
	if ok {
		p.value, i, ok = optionalValue(s, i)
	}
	for ok {
		j := skipOWS(s, i)
		if j == len(s) || s[j] != ';' {
			i = j
			break
		}
		i = skipOWS(s, j+1)
		if i == len(s) || s[i] == ',' || s[i] == ';' {
			continue // a parameter may be absent
		}
		_, i, ok = token(s, i)
		if ok {
			_, i, ok = optionalValue(s, i)
		}
	}
	if ok && (i == len(s) || s[i] == ',') {
		return p, i, true
	}
	// From the element's start: its quoted strings hide their commas even
	// when one of them is what is malformed.
	return preference{}, skipElement(s, start), false
}

// optionalValue reads `BWS "=" BWS word` at i, when s has "=" there after
// whitespace; none, an empty value.
func optionalValue(s string, i int) (string, int, bool) {
	j := skipOWS(s, i)
	if j == len(s) || s[j] != '=' {
		return "", i, true
	}
	j = skipOWS(s, j+1)
	if j < len(s) && s[j] == '"' {
		return quotedString(s, j)
	}
	return token(s, j)
}

// token reads a token (RFC 9110 section 5.6.2) at i: at least one tchar.
func token(s string, i int) (string, int, bool) {
	j := i
	for j < len(s) && isTchar(s[j]) {
		j++
	}
	return s[i:j], j, j > i
}

// quotedString reads the quoted-string at i (s[i] is '"'; RFC 9110 section
// 5.6.4) and returns its content, unescaped.
func quotedString(s string, i int) (string, int, bool) {
	var b strings.Builder
	for j := i + 1; j < len(s); j++ {
		switch c := s[j]; {
		case c == '"':
			return b.String(), j + 1, true
		case c == '\\':
			if j+1 == len(s) || !isQuotable(s[j+1]) {
				return "", j, false
			}
			j++
			b.WriteByte(s[j])
		case isQdtext(c):
			b.WriteByte(c)
		default:
			return "", j, false
		}
	}
	return "", len(s), false // unterminated
}

// skipElement returns where the element after a malformed one, starting at
// i, ends: the next comma that is not inside a quoted string (a '"' opens
// one, wherever it stands), or the end.
func skipElement(s string, i int) int {
	for i < len(s) {
		switch s[i] {
		case ',':
			return i
		case '"':
			for i++; i < len(s) && s[i] != '"'; i++ {
				if s[i] == '\\' {
					i++
				}
			}
		}
		i++
	}
	return len(s)
}

func skipElementSeparators(s string, i int) int {
	for i < len(s) && (s[i] == ',' || s[i] == ' ' || s[i] == '\t') {
		i++
	}
	return i
}

func skipOWS(s string, i int) int {
	for i < len(s) && (s[i] == ' ' || s[i] == '\t') {
		i++
	}
	return i
}

// isTchar reports whether c may be part of a token (RFC 9110 section 5.6.2).
func isTchar(c byte) bool {
	return c > ' ' && c < 0x7f && strings.IndexByte(`"(),/:;<=>?@[\]{}`, c) < 0
}

// isQdtext reports whether c may stand unescaped in a quoted string.
func isQdtext(c byte) bool {
	return c == '\t' || c == ' ' || c == 0x21 || (c >= 0x23 && c <= 0x5b) || (c >= 0x5d && c <= 0x7e) || c >= 0x80
}

// isQuotable reports whether c may follow a backslash in a quoted string.
func isQuotable(c byte) bool { return c == '\t' || c == ' ' || (c > ' ' && c != 0x7f) }

// PreferredWait reads RFC 7240's "wait" preference (section 4.3: Prefer:
// wait=<delta-seconds>) from r's Prefer fields; false when none names it,
// or when the first that does has a value that is not delta-seconds (none,
// a sign, a fraction, a word). The first occurrence counts, the later ones
// are ignored (section 2). A delta-seconds too large to parse is the
// longest wait, math.MaxInt64 nanoseconds, which the caller caps at
// MaxWait: a client asking for more than the server allows gets what it
// allows, not nothing.
func PreferredWait(r *http.Request) (time.Duration, bool) {
	for p := range preferences(r.Header.Values("Prefer")) {
		if !strings.EqualFold(p.name, "wait") {
			continue
		}
		n, err := strconv.ParseUint(p.value, 10, 31) // digits only: no sign
		switch {
		case err == nil:
			return time.Duration(n) * time.Second, true
		case errors.Is(err, strconv.ErrRange): // digits only, past 2^31-1 seconds
			return math.MaxInt64, true
		}
		return 0, false
	}
	return 0, false
}

// IsToken reports whether s is an RFC 9110 token (section 5.6.2), as a
// method is.
func IsToken(s string) bool {
	for i := 0; i < len(s); i++ {
		if !isTchar(s[i]) {
			return false
		}
	}
	return s != ""
}
