package fingerprint

import (
	"encoding/json"
	"slices"
	"unicode/utf16"
	"unicode/utf8"

	"github.com/gowebpki/jcs"
)

// canonVerdict is what canonicalJSON found.
type canonVerdict int

const (
	// canonOK: the body is canonical (RFC 8785, as jcs.Transform writes it).
	canonOK canonVerdict = iota
	// canonRaw: the general path would hash the body raw: jcs.Transform and
	// the exact canonical form both refuse it (a repeated member name, a
	// string value with a lone surrogate escape).
	canonRaw
	// canonInexact: a number is not its double's shortest form; the exact
	// canonical form (exactCanonical) decides.
	canonInexact
	// canonUnknown: left to the general path (a body that is not one valid
	// object or array, one nested deeper than maxCanonicalDepth, or a
	// member name whose surrogate escape jcs mishandles).
	canonUnknown
)

// canonicalJSON is the RFC 8785 form of body in one pass and a few
// allocations, the output of jcs.Transform byte for byte wherever it
// answers canonOK (FuzzCanonicalMatchesJCS holds it to that), in time linear
// in the body: jcs.Transform sorts each object's members by insertion into
// a list, quadratic in their number (a 1 MiB object took 18 s), so the
// general path must see only what this pass cannot decide. It answers
// canonOK for one valid JSON object or array (json.Valid) whose member
// names are all distinct and whose numbers are all exact (numberExact);
// invalid UTF-8 is copied as jcs copies it, and a surrogate escape decoded
// with the escape after it, as jcs decodes it. canonRaw, canonInexact and
// canonUnknown say what the general path would make of the rest.
func canonicalJSON(body []byte) ([]byte, canonVerdict) {
	i := skipSpace(body, 0)
	if i == len(body) || (body[i] != '{' && body[i] != '[') {
		return nil, canonUnknown // a scalar or nothing: jcs.Transform's own rules, in linear time
	}
	if !json.Valid(body) || nestedDeeper(body, maxCanonicalDepth) {
		// Not JSON, a cut-off object, an object followed by more: a
		// json.Decoder (numbersExact) and jcs.Transform read some of those
		// their own way. Nested very deep: the rewrite of each object's
		// members, and exactCanonical's, would copy the rest at every level.
		return nil, canonUnknown
	}
	// One allocation for the buffers of a common body: out, then keys and
	// scratch each as long as the body at most.
	buf := make([]byte, 0, 3*len(body))
	c := canonicalizer{in: body, out: buf[:0:len(body)], keys: buf[len(body) : len(body) : 2*len(body)],
		scratch: buf[2*len(body) : 2*len(body)], members: make([]member, 0, 4), verdict: canonOK}
	if _, ok := c.value(i); !ok {
		return nil, c.verdict
	}
	return c.out, canonOK
}

// maxCanonicalDepth is the deepest nesting of objects and arrays the single
// pass takes (a payment's body nests a few levels).
const maxCanonicalDepth = 64

// nestedDeeper reports whether the JSON body nests objects and arrays more
// than limit deep.
func nestedDeeper(body []byte, limit int) bool {
	depth, inString := 0, false
	for i := 0; i < len(body); i++ {
		switch b := body[i]; {
		case inString && b == '\\':
			i++
		case b == '"':
			inString = !inString
		case inString:
		case b == '{' || b == '[':
			if depth++; depth > limit {
				return true
			}
		case b == '}' || b == ']':
			depth--
		}
	}
	return false
}

// canonicalizer writes a valid JSON value (json.Valid) in canonical form.
// members is a stack shared by the objects being written, keys the
// decoded member names they are sorted by (and, briefly, a string value
// being decoded), scratch the members of one object as they came.
type canonicalizer struct {
	in, out, keys, scratch []byte
	members                []member
	verdict                canonVerdict // why value stopped, when it did
	inName                 bool         // decoding an object member's name
}

// member is one object member written to out[start:end], its decoded name
// keys[key:keyEnd].
type member struct{ key, keyEnd, start, end int }

func skipSpace(b []byte, i int) int {
	for i < len(b) && (b[i] == ' ' || b[i] == '\t' || b[i] == '\n' || b[i] == '\r') {
		i++
	}
	return i
}

// value writes the value starting at in[i] (no space before it) and returns
// the index after it.
func (c *canonicalizer) value(i int) (int, bool) {
	switch b := c.in[i]; {
	case b == '{':
		return c.object(i + 1)
	case b == '[':
		return c.array(i + 1)
	case b == '"':
		start := len(c.keys)
		end, ok := c.decodeString(i + 1)
		if ok {
			c.out = appendQuoted(c.out, c.keys[start:])
		}
		c.keys = c.keys[:start]
		return end, ok
	case b == 't':
		c.out = append(c.out, "true"...)
		return i + 4, true
	case b == 'f':
		c.out = append(c.out, "false"...)
		return i + 5, true
	case b == 'n':
		c.out = append(c.out, "null"...)
		return i + 4, true
	default:
		return c.number(i)
	}
}

func (c *canonicalizer) array(i int) (int, bool) {
	c.out = append(c.out, '[')
	i = skipSpace(c.in, i)
	for n := 0; c.in[i] != ']'; n++ {
		if n > 0 {
			c.out = append(c.out, ',')
			i = skipSpace(c.in, i+1) // the comma
		}
		var ok bool
		if i, ok = c.value(i); !ok {
			return i, false
		}
		i = skipSpace(c.in, i)
	}
	c.out = append(c.out, ']')
	return i + 1, true
}

// object writes the members as they come, then rewrites them sorted by
// name in UTF-16 code units (RFC 8785 section 3.2.3).
func (c *canonicalizer) object(i int) (int, bool) {
	base, outStart, keysStart := len(c.members), len(c.out), len(c.keys)
	i = skipSpace(c.in, i)
	for n := 0; c.in[i] != '}'; n++ {
		if n > 0 {
			i = skipSpace(c.in, i+1) // the comma
		}
		m := member{key: len(c.keys), start: len(c.out)}
		var ok bool
		c.inName = true
		i, ok = c.decodeString(i + 1)
		c.inName = false
		if !ok {
			return i, false
		}
		m.keyEnd = len(c.keys)
		c.out = appendQuoted(c.out, c.keys[m.key:m.keyEnd])
		c.out = append(c.out, ':')
		i = skipSpace(c.in, skipSpace(c.in, i)+1) // the colon
		if i, ok = c.value(i); !ok {
			return i, false
		}
		m.end = len(c.out)
		c.members = append(c.members, m)
		i = skipSpace(c.in, i)
	}
	ms := c.members[base:]
	slices.SortFunc(ms, func(a, b member) int {
		return compareUTF16(c.keys[a.key:a.keyEnd], c.keys[b.key:b.keyEnd])
	})
	for k := 1; k < len(ms); k++ {
		if compareUTF16(c.keys[ms[k-1].key:ms[k-1].keyEnd], c.keys[ms[k].key:ms[k].keyEnd]) == 0 {
			c.verdict = canonRaw // a repeated name: jcs and exactCanonical refuse it
			return i, false
		}
	}
	c.scratch = append(c.scratch[:0], c.out[outStart:]...)
	written := c.scratch
	c.out = append(c.out[:outStart], '{')
	for k, m := range ms {
		if k > 0 {
			c.out = append(c.out, ',')
		}
		c.out = append(c.out, written[m.start-outStart:m.end-outStart]...)
	}
	c.out = append(c.out, '}')
	c.members, c.keys = c.members[:base], c.keys[:keysStart]
	return i + 1, true
}

// decodeString appends the decoded string starting after the quote at
// in[i-1] to keys and returns the index after its closing quote. A \u
// escape of a UTF-16 surrogate is decoded as jcs decodes it: with the \u
// escape that must follow it (utf16.DecodeRune: U+FFFD unless they pair);
// without one, jcs fails: in a value, Transform fails (canonRaw), in a
// member name jcs goes on in a way of its own (canonUnknown).
func (c *canonicalizer) decodeString(i int) (int, bool) {
	for {
		b := c.in[i]
		switch {
		case b == '"':
			return i + 1, true
		case b != '\\':
			c.keys = append(c.keys, b)
			i++
			continue
		}
		if e := c.in[i+1]; e != 'u' {
			c.keys = append(c.keys, unescape[e])
			i += 2
			continue
		}
		r := hex4(c.in[i+2 : i+6])
		i += 6
		if utf16.IsSurrogate(r) {
			if i+1 >= len(c.in) || c.in[i] != '\\' || c.in[i+1] != 'u' {
				c.verdict = canonRaw
				if c.inName {
					c.verdict = canonUnknown
				}
				return i, false
			}
			r = utf16.DecodeRune(r, hex4(c.in[i+2:i+6]))
			i += 6
		}
		c.keys = utf8.AppendRune(c.keys, r)
	}
}

// hex4 is the value of four hexadecimal digits (json.Valid checked them).
func hex4(h []byte) rune {
	var r rune
	for _, d := range h {
		switch {
		case d >= 'a':
			d -= 'a' - 10
		case d >= 'A':
			d -= 'A' - 10
		default:
			d -= '0'
		}
		r = r<<4 | rune(d)
	}
	return r
}

// unescape maps the character after a backslash to what it stands for.
var unescape = [256]byte{'"': '"', '\\': '\\', '/': '/', 'b': '\b', 'f': '\f', 'n': '\n', 'r': '\r', 't': '\t'}

// appendQuoted writes s as RFC 8785 section 3.2.2.2 (and jcs) write a
// string: the short escapes, \u00xx for the other control characters, every
// other byte as it is.
func appendQuoted(out, s []byte) []byte {
	const hex = "0123456789abcdef"
	out = append(out, '"')
	for _, b := range s {
		switch b {
		case '"', '\\':
			out = append(out, '\\', b)
		case '\b':
			out = append(out, '\\', 'b')
		case '\f':
			out = append(out, '\\', 'f')
		case '\n':
			out = append(out, '\\', 'n')
		case '\r':
			out = append(out, '\\', 'r')
		case '\t':
			out = append(out, '\\', 't')
		default:
			if b < 0x20 {
				out = append(out, '\\', 'u', '0', '0', hex[b>>4], hex[b&0xf])
			} else {
				out = append(out, b)
			}
		}
	}
	return append(out, '"')
}

// compareUTF16 orders two UTF-8 strings by their UTF-16 code units.
func compareUTF16(a, b []byte) int {
	for len(a) > 0 && len(b) > 0 {
		ra, na := utf8.DecodeRune(a)
		rb, nb := utf8.DecodeRune(b)
		if ra != rb {
			return utf16Order(ra) - utf16Order(rb)
		}
		a, b = a[na:], b[nb:]
	}
	return len(a) - len(b)
}

// utf16Order ranks r by its UTF-16 code units: r itself in the Basic
// Multilingual Plane, else its high surrogate, then its low one. (r is never
// a surrogate itself: it comes from valid UTF-8.)
func utf16Order(r rune) int {
	if r < 0x10000 {
		return int(r) << 16
	}
	hi, lo := utf16.EncodeRune(r)
	return int(hi)<<16 | int(lo)
}

// number writes the number literal at in[i] as RFC 8785 writes its double
// (jcs.NumberToJSON), when the literal is exact.
func (c *canonicalizer) number(i int) (int, bool) {
	end := i
	for end < len(c.in) && isNumberByte(c.in[end]) {
		end++
	}
	if plainInteger(c.in[i:end]) {
		// RFC 8785 writes such an integer's double as its digits.
		c.out = append(c.out, c.in[i:end]...)
		return end, true
	}
	lit := string(c.in[i:end])
	f, ok := numberExact(lit)
	if !ok {
		c.verdict = canonInexact
		return end, false
	}
	s, err := jcs.NumberToJSON(f)
	if err != nil {
		c.verdict = canonUnknown // not reached: numberExact refuses infinities
		return end, false
	}
	c.out = append(c.out, s...)
	return end, true
}

// plainInteger reports whether lit is an integer literal of at most 15
// digits, with a sign only when it is not zero ("0", "-12", not "-0"):
// every such integer is a double exactly, and RFC 8785 (section 3.2.2.3,
// ECMAScript's Number.prototype.toString) writes it as lit. The amounts of
// a payment's body, the common case, skip the double's round trip.
func plainInteger(lit []byte) bool {
	digits := lit
	if len(digits) > 0 && digits[0] == '-' {
		digits = digits[1:]
		if len(digits) > 0 && digits[0] == '0' {
			return false // -0 (RFC 8785 writes 0) or not an integer
		}
	}
	if len(digits) == 0 || len(digits) > 15 || (digits[0] == '0' && len(digits) > 1) {
		return false
	}
	for _, d := range digits {
		if d < '0' || d > '9' {
			return false
		}
	}
	return true
}

func isNumberByte(b byte) bool {
	return b >= '0' && b <= '9' || b == '-' || b == '+' || b == '.' || b == 'e' || b == 'E'
}
