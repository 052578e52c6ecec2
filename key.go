package idem

import (
	"fmt"
	"strings"
	"unicode/utf8"

	"github.com/dunglas/httpsfv"
)

// HeaderKey is the request header that carries the key
// (draft-ietf-httpapi-idempotency-key-header, section 2).
const HeaderKey = "Idempotency-Key"

// HeaderReplayed is set to "true" on every replayed response.
const HeaderReplayed = "Idempotent-Replayed"

// MaxKeyLength is the longest accepted key, in bytes, after unquoting.
const MaxKeyLength = 255

// ParseKey reads the Idempotency-Key field values of one request (as returned
// by http.Header.Values) and returns the key.
//
// Accepted forms (CONTRACT section 2): the RFC 8941 sf-string form ("abc",
// section 3.3.3) and the bare form (abc); both name the same key. RFC 8941
// section 3.3 lets an Item carry parameters (section 3.1.2) and the
// Idempotency-Key draft defines none, so idem ignores them: `"p";x=1`,
// `"p";x=2` and `"p"` name one key, "p" (a malformed parameter is still an
// ErrInvalidKey). The bare form is taken whole, so `abc;v=1` is the key
// "abc;v=1", while `"abc";v=1` is the key "abc". The key must be 1 to 255 characters of visible ASCII (0x21-0x7E)
// after unquoting.
//
// Errors, all wrapping ErrMissingKey or ErrInvalidKey: no field line
// (ErrMissingKey); two or more field lines, or a comma-joined list in one
// line (ErrInvalidKey: "K, K" is never a new key); an empty, too long,
// malformed or non-visible-ASCII key (ErrInvalidKey).
func ParseKey(values []string) (string, error) {
	switch len(values) {
	case 0:
		return "", ErrMissingKey
	case 1:
	default:
		return "", fmt.Errorf("%w: the %s header appears %d times; send it once", ErrInvalidKey, HeaderKey, len(values))
	}
	v := strings.Trim(values[0], " \t")
	if v == "" {
		return "", fmt.Errorf("%w: the %s header is empty", ErrInvalidKey, HeaderKey)
	}
	key := v
	if v[0] == '"' {
		item, err := httpsfv.UnmarshalItem([]string{v})
		if err != nil {
			return "", fmt.Errorf("%w: a value starting with '\"' must be one RFC 8941 sf-string, such as \"abc\" (%v)", ErrInvalidKey, err)
		}
		s, ok := item.Value.(string)
		if !ok {
			return "", fmt.Errorf("%w: the quoted value is not an RFC 8941 string", ErrInvalidKey)
		}
		key = s
	} else if strings.ContainsRune(v, ',') {
		return "", fmt.Errorf("%w: the %s header holds a comma-separated list; send one key", ErrInvalidKey, HeaderKey)
	}
	if key == "" {
		return "", fmt.Errorf("%w: the key is empty", ErrInvalidKey)
	}
	if len(key) > MaxKeyLength {
		return "", fmt.Errorf("%w: the key is %d characters long; at most %d are allowed", ErrInvalidKey, len(key), MaxKeyLength)
	}
	for i := 0; i < len(key); i++ {
		if c := key[i]; c < 0x21 || c > 0x7e {
			return "", fmt.Errorf("%w: character %d of the key is byte 0x%02x; only visible ASCII (0x21-0x7E) is allowed", ErrInvalidKey, i+1, c)
		}
	}
	return key, nil
}

// unstorableScope says why no store can hold scope (ScopeFunc's rules), or
// "" when every store can.
func unstorableScope(scope string) string {
	switch {
	case len(scope) > MaxScopeLength:
		return "longer than MaxScopeLength"
	case !utf8.ValidString(scope):
		return "not valid UTF-8"
	case strings.IndexByte(scope, 0) >= 0:
		return "contains a NUL byte"
	}
	return ""
}
