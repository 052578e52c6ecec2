package idemdriver

import (
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

// LeaseLeft converts the database's "locked_until - now" to the Record's
// LeaseLeft: zero unless the record is PROCESSING under a lease.
func LeaseLeft(state State, left time.Duration, valid bool) time.Duration {
	if state != StateProcessing || !valid || left < 0 {
		return 0
	}
	return left
}
