package idemdriver

import (
	"bytes"
	"encoding/json"
	"fmt"
	"time"
)

// EncodeHeader encodes stored response headers as a JSON object of string
// arrays, the column format every driver uses.
func EncodeHeader(h map[string][]string) ([]byte, error) {
	if h == nil {
		h = map[string][]string{}
	}
	return json.Marshal(h)
}

// DecodeHeader is the inverse of EncodeHeader.
func DecodeHeader(b []byte) (map[string][]string, error) {
	h := map[string][]string{}
	if len(b) == 0 {
		return h, nil
	}
	if err := json.Unmarshal(b, &h); err != nil {
		return nil, fmt.Errorf("idemdriver: stored response headers: %w", err)
	}
	return h, nil
}

// EncodeResponse returns a response's header and body columns as every
// driver stores them: the headers as EncodeHeader writes them, and the body,
// empty (never NULL) when it was not stored (BodyStored false).
func EncodeResponse(r Response) (headers, body []byte, err error) {
	if headers, err = EncodeHeader(r.Header); err != nil {
		return nil, nil, err
	}
	body = r.Body
	if !r.BodyStored || body == nil {
		body = []byte{}
	}
	return headers, body, nil
}

// LeaseLeft converts the database's "locked_until - now" to the Record's
// LeaseLeft: zero unless the record is PROCESSING under a lease.
func LeaseLeft(state State, left time.Duration, valid bool) time.Duration {
	if state != StateProcessing || !valid || left < 0 {
		return 0
	}
	return left
}

// Claimable is the decision table (CONTRACT section 3) for a record read with
// the database's now, for drivers that read before they write: whether a
// claim by p may take rec. No live lease is ever taken (a PROCESSING record
// with LeaseLeft > 0, even past its expires_at: its handler still runs).
// Otherwise the same request unfinished (FAILED, or PROCESSING past its
// lease) may be taken and continues the record's life (see Continues), and
// an expired record (expired: expires_at <= now) may be taken and starts a
// new one.
func Claimable(rec Record, expired bool, p ClaimParams) bool {
	if rec.State == StateProcessing && rec.LeaseLeft > 0 {
		return false
	}
	return expired || Continues(rec, p)
}

// Continues reports whether a claim of rec by p continues the record's life:
// the same request (method, path, fingerprint) whose execution did not
// finish (FAILED, or PROCESSING with no live lease), expired or not. Such a
// claim keeps created_at (so the relayed key, idem.DeriveKey) and counts one
// more attempt; any other claim of an existing record starts a new life:
// created_at now, attempts 1. Every claim sets expires_at to now + retention.
func Continues(rec Record, p ClaimParams) bool {
	return rec.Method == p.Method && rec.Path == p.Path && bytes.Equal(rec.Fingerprint, p.Fingerprint) &&
		(rec.State == StateFailed || rec.State == StateProcessing)
}
