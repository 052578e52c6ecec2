package protocol

import (
	"fmt"
	"strings"
	"unicode/utf8"

	"github.com/idemgo/idem/idemdriver"
	"github.com/idemgo/idem/seal"
)

// MaxKeyLength is the longest key, in bytes (CONTRACT section 2).
const MaxKeyLength = 255

// MaxScopeLength is the longest scope, in bytes.
const MaxScopeLength = 255

// CheckKey reports whether key is 1 to MaxKeyLength visible ASCII
// characters (0x21-0x7E, CONTRACT section 2); its error wraps ErrInvalidKey
// and says what is wrong.
func CheckKey(key string) error {
	if key == "" {
		return fmt.Errorf("%w: the key is empty", ErrInvalidKey)
	}
	if len(key) > MaxKeyLength {
		return fmt.Errorf("%w: the key is %d characters long; at most %d are allowed", ErrInvalidKey, len(key), MaxKeyLength)
	}
	for i := 0; i < len(key); i++ {
		if c := key[i]; c < 0x21 || c > 0x7e {
			return fmt.Errorf("%w: character %d of the key is byte 0x%02x; only visible ASCII (0x21-0x7E) is allowed", ErrInvalidKey, i+1, c)
		}
	}
	return nil
}

// UnstorableScope says why no store can hold scope ("is longer than
// MaxScopeLength", "is not valid UTF-8", "contains a NUL byte"), or "" when
// one can.
func UnstorableScope(scope string) string {
	switch {
	case len(scope) > MaxScopeLength:
		return "is longer than MaxScopeLength"
	case !utf8.ValidString(scope):
		return "is not valid UTF-8"
	case strings.IndexByte(scope, 0) >= 0:
		return "contains a NUL byte"
	}
	return ""
}

// StoredKey is the key stored for the client's key: key itself, or
// seal.HashKey(KeyHashSecret, key).
func (c *Config) StoredKey(key string) string {
	if len(c.KeyHashSecret) == 0 {
		return key
	}
	return seal.HashKey(c.KeyHashSecret, key)
}

// Params is the claim of a request of scope and the client's key, with
// method, path and fingerprint fp, under this engine's lease, retention
// and owner.
func (eng *Engine) Params(scope, clientKey, method, path string, fp []byte) idemdriver.ClaimParams {
	c := &eng.cfg
	return idemdriver.ClaimParams{Scope: scope, Key: c.StoredKey(clientKey), Method: method, Path: path, Fingerprint: fp,
		LeaseDuration: c.LeaseDuration, Retention: c.Retention, Owner: c.Owner}
}

// StoredKey is Config.StoredKey of the engine's configuration.
func (eng *Engine) StoredKey(key string) string { return eng.cfg.StoredKey(key) }
