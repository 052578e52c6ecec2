package idem

import (
	"fmt"
	"strings"
	"unicode/utf8"

	"github.com/dunglas/httpsfv"
)

// HeaderKey is the key's header (draft-ietf-httpapi-idempotency-key-header).
const HeaderKey = "Idempotency-Key"

// HeaderReplayed is set to "true" on every replayed response.
const HeaderReplayed = "Idempotent-Replayed"

// MaxKeyLength is the longest accepted key, in bytes, after unquoting.
const MaxKeyLength = 255

// ParseKey returns the key of one request's Idempotency-Key values: an RFC
// 8941 sf-string (parameters ignored) or the bare form, taken whole (`abc;v=1`
// is that key, `"abc";v=1` is "abc"), of 1 to MaxKeyLength visible ASCII
// characters (CONTRACT section 2). Errors: ErrMissingKey without a field line;
// ErrInvalidKey for two lines, a comma list, or an empty, long or bad key.
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
