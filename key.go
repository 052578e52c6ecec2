package idem

import (
	"github.com/idemgo/idem/internal/httpread"
	"github.com/idemgo/idem/internal/protocol"
)

// HeaderKey is the key's header (draft-ietf-httpapi-idempotency-key-header).
const HeaderKey = httpread.HeaderKey

// HeaderReplayed is set to "true" on every replayed response.
const HeaderReplayed = "Idempotent-Replayed"

// HeaderPreferenceApplied names the preferences a server honoured (RFC 7240
// section 3). idem sends "wait=N" on the answer to a request that waited,
// N the wait it was given in whole seconds; it is never stored or replayed.
const HeaderPreferenceApplied = "Preference-Applied"

// HeaderKeyExpires carries the record's expires_at as an RFC 9110 HTTP-date
// on every answer from a record.
const HeaderKeyExpires = "Idempotency-Key-Expires"

// MaxKeyLength is the longest accepted key, in bytes, after unquoting.
const MaxKeyLength = protocol.MaxKeyLength

// ParseKey returns the key of one request's Idempotency-Key values: an RFC
// 8941 sf-string (parameters ignored) or the bare form, taken whole (`abc;v=1`
// is that key, `"abc";v=1` is "abc"), of 1 to MaxKeyLength visible ASCII
// characters (CONTRACT section 2). Errors: ErrMissingKey without a field line;
// ErrInvalidKey for two lines, a comma list, or an empty, long or bad key.
func ParseKey(values []string) (string, error) {
	key, err := httpread.ParseKey(values)
	if err != nil {
		return "", err
	}
	return key, nil
}
