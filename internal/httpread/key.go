package httpread

import (
	"fmt"
	"strings"

	"github.com/dunglas/httpsfv"
	"github.com/idemgo/idem/internal/protocol"
)

// HeaderKey is the key's header (draft-ietf-httpapi-idempotency-key-header).
const HeaderKey = "Idempotency-Key"

// ParseKey returns the key of one request's Idempotency-Key values (the
// root package's ParseKey documents the grammar). Errors wrap
// protocol.ErrMissingKey or protocol.ErrInvalidKey; the latter, for a
// header repeated or a list, through protocol.KeysSent.
func ParseKey(values []string) (string, error) {
	key, err := parseKey(values)
	if err != nil && (len(values) > 1 || len(values) == 1 && strings.ContainsRune(values[0], ',')) {
		err = protocol.KeysSent(err)
	}
	return key, err
}

func parseKey(values []string) (string, error) {
	switch len(values) {
	case 0:
		return "", protocol.ErrMissingKey
	case 1:
	default:
		return "", fmt.Errorf("%w: the %s header appears %d times; send it once", protocol.ErrInvalidKey, HeaderKey, len(values))
	}
	v := strings.Trim(values[0], " \t")
	if v == "" {
		return "", fmt.Errorf("%w: the %s header is empty", protocol.ErrInvalidKey, HeaderKey)
	}
	key := v
	if v[0] == '"' {
		item, err := httpsfv.UnmarshalItem([]string{v})
		if err != nil {
			return "", fmt.Errorf("%w: a value starting with '\"' must be one RFC 8941 sf-string, such as \"abc\" (%v)", protocol.ErrInvalidKey, err)
		}
		s, ok := item.Value.(string)
		if !ok {
			return "", fmt.Errorf("%w: the quoted value is not an RFC 8941 string", protocol.ErrInvalidKey)
		}
		key = s
	} else if strings.ContainsRune(v, ',') {
		return "", fmt.Errorf("%w: the %s header holds a comma-separated list; send one key", protocol.ErrInvalidKey, HeaderKey)
	}
	return key, protocol.CheckKey(key)
}
