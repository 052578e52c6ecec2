package idemclient

import (
	"net/http"

	"github.com/google/uuid"
)

// HeaderKey is the request header that carries the key
// (draft-ietf-httpapi-idempotency-key-header, section 2); the same as
// idem.HeaderKey.
const HeaderKey = "Idempotency-Key"

// HeaderReplayed is the response header idem sets to "true" on a replayed
// response; the same as idem.HeaderReplayed.
const HeaderReplayed = "Idempotent-Replayed"

// NewKey is the default Config.NewKey: a UUIDv7 (RFC 9562 section 5.7) in
// its 36-character text form, such as "01936f0e-9a4c-7b2e-8f3a-5c1d2e3f4a5b".
// Its 74 random bits make it unique as draft section 2.2 asks ("UUID or a
// similar random identifier"); its leading millisecond timestamp keeps the
// server's (scope, key) index inserts close together, which matters for a
// clustered primary key (InnoDB). The error is crypto/rand's.
func NewKey() (string, error) {
	id, err := uuid.NewV7()
	if err != nil {
		return "", err
	}
	return id.String(), nil
}

// KeyFromResponse returns the Idempotency-Key field value sent with the
// request that produced resp (the caller's, or the one the Transport
// generated), or "" when there was none. It reads resp.Request, which the
// Transport sets to the attempt's request (a clone carrying the key); the
// caller's own request is never modified.
func KeyFromResponse(resp *http.Response) string {
	if resp == nil || resp.Request == nil {
		return ""
	}
	return resp.Request.Header.Get(HeaderKey)
}

// Replayed reports whether resp is a replay of a response stored by idem
// (Idempotent-Replayed: true): the request had already run, and this
// attempt did not run it again.
func Replayed(resp *http.Response) bool {
	return resp != nil && resp.Header.Get(HeaderReplayed) == "true"
}
