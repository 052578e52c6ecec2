package idem

import (
	"bytes"
	"encoding/json"
	"errors"
	"net/http"
	"strconv"
	"time"
)

// ProblemTypeBase prefixes every problem type URI idem emits; the fragment
// names the section of docs/problems.md that documents the kind.
const ProblemTypeBase = "https://github.com/idemgo/idem/blob/main/docs/problems.md#"

// Problem is an RFC 9457 problem details object, sent as
// application/problem+json.
type Problem struct {
	Type   string `json:"type"`
	Title  string `json:"title"`
	Status int    `json:"status"`
	Detail string `json:"detail,omitempty"`
	// Instance is left empty by idem; handlers may set it.
	Instance string `json:"instance,omitempty"`
	// RetryAfter, when positive, is sent as the Retry-After header in whole
	// seconds (RFC 9110 section 10.2.3), at least 1.
	RetryAfter time.Duration `json:"-"`
	// Extra members, merged into the JSON object (RFC 9457 section 3.2).
	Extra map[string]any `json:"-"`
}

// problemKind is one row of the kind table: a sentinel and its answer.
type problemKind struct {
	err    error
	slug   string
	title  string
	status int
}

// problemKinds is the kind table: one type URI each, documented in
// docs/problems.md. Every answer idem makes itself goes through it.
var problemKinds = []problemKind{
	{ErrMissingKey, "missing-key", "Idempotency-Key header required", http.StatusBadRequest},
	{ErrInvalidKey, "invalid-key", "Invalid Idempotency-Key header", http.StatusBadRequest},
	{ErrMissingScope, "missing-scope", "No scope for this request", http.StatusUnauthorized},
	{ErrScopeUnstorable, "scope-unstorable", "The server could not scope this request", http.StatusInternalServerError},
	{ErrPathTooLong, "path-too-long", "Request path too long", http.StatusRequestURITooLong},
	{ErrRequestTooLarge, "request-too-large", "Request body too large", http.StatusRequestEntityTooLarge},
	{ErrBodyUnreadable, "body-unreadable", "Request body could not be read", http.StatusBadRequest},
	{ErrKeyReused, "key-reused", "Idempotency-Key reused with a different request", http.StatusUnprocessableEntity},
	{ErrInFlight, "request-in-flight", "A request with this Idempotency-Key is in progress", http.StatusConflict},
	{ErrLeaseLost, "request-in-flight", "A request with this Idempotency-Key is in progress", http.StatusConflict},
	{ErrResponseNotStored, "response-not-stored", "The response for this Idempotency-Key was not stored", http.StatusGone},
	{ErrResponseMissing, "response-missing", "The response for this Idempotency-Key is missing from the store", http.StatusInternalServerError},
	{ErrTxAborted, "transaction-aborted", "The request's transaction aborted", http.StatusInternalServerError},
	{ErrStoreUnavailable, "store-unavailable", "Idempotency store unavailable", http.StatusServiceUnavailable},
}

// problemTypes are the kinds' type URIs, made once.
var problemTypes = func() map[string]string {
	types := make(map[string]string, len(problemKinds))
	for _, k := range problemKinds {
		types[k.slug] = ProblemTypeBase + k.slug
	}
	return types
}()

func (k problemKind) typeURI() string { return problemTypes[k.slug] }

// ProblemFor returns the problem details for an error of one of idem's
// kinds, matched with errors.Is (so a wrapped sentinel, or a *StoreError,
// finds its kind), with detail as its detail member. It returns a 500
// problem of type about:blank for any other error, nil included.
func ProblemFor(kind error, detail string) Problem {
	for _, k := range problemKinds {
		if kind != nil && errors.Is(kind, k.err) {
			return Problem{Type: k.typeURI(), Title: k.title, Status: k.status, Detail: detail}
		}
	}
	return Problem{Type: "about:blank", Title: http.StatusText(http.StatusInternalServerError), Status: http.StatusInternalServerError, Detail: detail}
}

// Write sends p as application/problem+json with its status (and
// Retry-After when set).
func (p Problem) Write(w http.ResponseWriter) {
	var buf bytes.Buffer
	enc := json.NewEncoder(&buf)
	enc.SetEscapeHTML(false) // a detail may quote <placeholders>; this is no HTML
	if err := p.encodeExtra(enc); len(p.Extra) == 0 || err != nil {
		// The members in the order a map's would be written (sorted), with
		// no map to build; also when an Extra member cannot be encoded
		// (a func, a channel): the problem is sent without its extras.
		buf.Reset()
		_ = enc.Encode(problemMembers{p.Detail, p.Instance, p.Status, p.Title, p.Type}) // strings and a number: no error
	}
	h := w.Header()
	h.Set("Content-Type", "application/problem+json")
	h.Set("Cache-Control", "no-store")
	if p.RetryAfter > 0 {
		h.Set("Retry-After", strconv.FormatInt(retryAfterSeconds(p.RetryAfter), 10))
	}
	w.WriteHeader(p.Status)
	_, _ = w.Write(buf.Bytes()) // Encode ends it with a newline; a client gone is no error of ours
}

// encodeExtra encodes p with its Extra members, if it has any.
func (p Problem) encodeExtra(enc *json.Encoder) error {
	if len(p.Extra) == 0 {
		return nil
	}
	obj := make(map[string]any, len(p.Extra)+5)
	for k, v := range p.Extra {
		obj[k] = v
	}
	obj["type"], obj["title"], obj["status"] = p.Type, p.Title, p.Status
	if p.Detail != "" {
		obj["detail"] = p.Detail
	}
	if p.Instance != "" {
		obj["instance"] = p.Instance
	}
	return enc.Encode(obj)
}

// problemMembers are a Problem's members without Extra, in sorted order.
type problemMembers struct {
	Detail   string `json:"detail,omitempty"`
	Instance string `json:"instance,omitempty"`
	Status   int    `json:"status"`
	Title    string `json:"title"`
	Type     string `json:"type"`
}

// retryAfterSeconds rounds d up to whole seconds, at least 1 (without
// overflowing near the largest Duration).
func retryAfterSeconds(d time.Duration) int64 {
	s := int64(d / time.Second)
	if d%time.Second > 0 {
		s++
	}
	return max(s, 1)
}
