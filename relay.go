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
)

// relayPrefix names the derivation, so a relayed key can be told apart and
// the scheme can change without collisions. (idr1 includes created_at: the
// derivation changed to it before any release.)
const relayPrefix = "idr1_"

// DeriveKey returns the key to relay downstream for one step of the request
// (scope, key) (CONTRACT section 7): "idr1_" followed by 64 hex characters
// of HMAC-SHA-256(secret, scope, key, created, step), each part
// length-prefixed, created as Unix microseconds.
//
// created is the record's created_at (Execution.Created): when this life of
// the key began. Retries, takeovers and re-claims after FAILED keep it, so
// they relay the same key and the provider deduplicates a re-execution. A
// key reused after its record expired is a new request (CONTRACT section 3)
// with a new created_at, so it relays a new key: a provider that keeps keys
// longer than idem's Retention does not answer the new payment with the old
// charge. (The other way round, a provider must keep keys at least as long
// as Retention, or a re-execution late in the record's life charges again.)
//
// The result is stable across processes that share the secret, different for
// every step, and does not reveal the client's key. With an empty secret it
// is a plain SHA-256 of the same parts: still stable, but a party who can
// guess the scope, the key and the time can compute it.
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

// RelayKey returns the key to send to a downstream provider for step (for
// example "charge", "refund") from a protected handler's context, derived
// with DeriveKey and Config.RelaySecret. The same request retried, taken
// over after a crash, or run on another process gets the same key, so the
// provider deduplicates a re-execution; the same key reused after its
// record expired gets another. It returns ErrNoExecution outside a
// protected handler.
func RelayKey(ctx context.Context, step string) (string, error) {
	e, ok := executionFrom(ctx)
	if !ok {
		return "", ErrNoExecution
	}
	return DeriveKey(e.cfg.RelaySecret, e.info.Scope, e.info.Key, e.info.Created, step), nil
}

// RelayTransport is an http.RoundTripper for calls to downstream providers
// made from protected handlers: on every request whose context comes from a
// protected execution, it sets Idempotency-Key to RelayKey(ctx, step),
// replacing any key the request had (so the client's raw key never leaves).
// Requests made outside an execution pass through unchanged.
type RelayTransport struct {
	// Base sends the requests. Default: http.DefaultTransport.
	Base http.RoundTripper
	// Step names the step of a request. Default: the method, host and path
	// ("POST psp.example/v1/charges"), so each endpoint gets its own key.
	// Two calls to one endpoint in one execution (a split payment) then
	// share a key, and the provider answers the second with the first's
	// result; a failover to another host changes the key, and the provider
	// there charges again. Name each call's step yourself for either.
	Step func(*http.Request) string
}

// RoundTrip implements http.RoundTripper. It does not modify req: a keyed
// request is cloned.
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
