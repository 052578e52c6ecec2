package idem

import (
	"context"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"net/http"
	"strconv"
	"time"

	"github.com/idemgo/idem/internal/protocol"
)

// relayPrefix versions the derivation.
const relayPrefix = "idr1_"

// DeriveKey returns the key to relay downstream for step of (scope, key)
// (CONTRACT section 7): "idr1_" and the hex HMAC-SHA-256(secret) of the
// length-prefixed scope, key, created (Unix microseconds) and step.
//
// key is the client's key (Execution.Key), also when
// EngineOptions.Sealing.KeyHashSecret stores its hash: switching hashing on does not
// change what is relayed for a record.
//
// created is Execution.Created, kept by retries, takeovers and re-claims, so
// they relay one key; a key reused after its record expired relays another. A
// provider must keep keys at least as long as Retention. With an empty secret
// the key is a plain SHA-256, computable by anyone who guesses the parts.
func DeriveKey(secret []byte, scope, key string, created time.Time, step string) string {
	h := hmac.New(sha256.New, secret)
	var n [8]byte
	for _, part := range []string{scope, key, strconv.FormatInt(created.UnixMicro(), 10), step} {
		binary.BigEndian.PutUint64(n[:], uint64(len(part)))
		h.Write(n[:])
		h.Write([]byte(part))
	}
	return relayPrefix + hex.EncodeToString(h.Sum(nil))
}

// RelayKey returns DeriveKey(RelaySecret, ...) for step from a protected
// execution's context: the same across retries, takeovers and processes.
// Outside one it returns ErrNoExecution.
func RelayKey(ctx context.Context, step string) (string, error) {
	e, ok := protocol.FromContext(ctx)
	if !ok {
		return "", ErrNoExecution
	}
	i := e.Info()
	return DeriveKey(e.RelaySecret(), i.Scope, i.Key, i.Created, step), nil
}

// RelayTransport sets Idempotency-Key to RelayKey(ctx, step) on requests
// from a protected execution, replacing the client's key; other requests pass
// through unchanged.
type RelayTransport struct {
	// Base sends the requests. Default: http.DefaultTransport.
	Base http.RoundTripper
	// Step names a request's step. Default: the method, host and path, so two
	// calls to one endpoint share a key and a failover host changes it.
	Step func(*http.Request) string
}

// RoundTrip implements http.RoundTripper; a keyed request is cloned.
func (t *RelayTransport) RoundTrip(req *http.Request) (*http.Response, error) {
	base := t.Base
	if base == nil {
		base = http.DefaultTransport
	}
	step := req.Method + " " + req.URL.Host + req.URL.Path
	if t.Step != nil {
		step = t.Step(req)
	}
	key, err := RelayKey(req.Context(), step)
	if errors.Is(err, ErrNoExecution) {
		return base.RoundTrip(req)
	}
	out := req.Clone(req.Context())
	out.Header.Set(HeaderKey, key)
	return base.RoundTrip(out)
}
