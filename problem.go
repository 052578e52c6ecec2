package idem

import (
	"net/http"
	"time"

	"github.com/idemgo/idem/internal/httpwrite"
)

// ProblemTypeBase prefixes idem's problem type URIs; the fragment names the
// kind's section of docs/problems.md.
const ProblemTypeBase = "https://github.com/idemgo/idem/blob/main/docs/problems.md#"

// Problem is an RFC 9457 problem details object.
type Problem struct {
	Type   string `json:"type"`
	Title  string `json:"title"`
	Status int    `json:"status"`
	Detail string `json:"detail,omitempty"`
	// Instance is left empty by idem; handlers may set it.
	Instance string `json:"instance,omitempty"`
	// RetryAfter, when positive, is sent as Retry-After in whole seconds (RFC
	// 9110 section 10.2.3).
	RetryAfter time.Duration `json:"-"`
	// Extra members, merged into the JSON object (RFC 9457 section 3.2).
	Extra map[string]any `json:"-"`
}

type problemKind struct {
	err     error
	slug    string
	title   string
	status  int
	typeURI string // ProblemTypeBase + slug
}

// problemKinds: one type each, documented in docs/problems.md (CONTRACT
// section 8); ProblemFor gives the problem of each.
var problemKinds = []problemKind{
	problemKindOf(ErrMissingKey, "missing-key", "Idempotency-Key header required", http.StatusBadRequest),
	problemKindOf(ErrInvalidKey, "invalid-key", "Invalid Idempotency-Key header", http.StatusBadRequest),
	problemKindOf(ErrMissingScope, "missing-scope", "No scope for this request", http.StatusUnauthorized),
	problemKindOf(ErrScopeUnstorable, "scope-unstorable", "The server could not scope this request", http.StatusInternalServerError),
	problemKindOf(ErrPathTooLong, "path-too-long", "Request path too long", http.StatusRequestURITooLong),
	problemKindOf(ErrRequestTooLarge, "request-too-large", "Request body too large", http.StatusRequestEntityTooLarge),
	problemKindOf(ErrBodyUnreadable, "body-unreadable", "Request body could not be read", http.StatusBadRequest),
	problemKindOf(ErrKeyReused, "key-reused", "Idempotency-Key reused with a different request", http.StatusUnprocessableEntity),
	problemKindOf(ErrInFlight, "request-in-flight", "A request with this Idempotency-Key is in progress", http.StatusConflict),
	problemKindOf(ErrLeaseLost, "request-in-flight", "A request with this Idempotency-Key is in progress", http.StatusConflict),
	problemKindOf(ErrResponseNotStored, "response-not-stored", "The response for this Idempotency-Key was not stored", http.StatusGone),
	problemKindOf(ErrResponseMissing, "response-missing", "The response for this Idempotency-Key is missing from the store", http.StatusInternalServerError),
	problemKindOf(ErrRecordDamaged, "record-damaged", "The record for this Idempotency-Key is damaged", http.StatusInternalServerError),
	problemKindOf(ErrTxAborted, "transaction-aborted", "The request's transaction aborted", http.StatusInternalServerError),
	problemKindOf(ErrInvalidStatus, "invalid-status", "The server answered with an invalid status", http.StatusInternalServerError),
	problemKindOf(ErrSealKeyMissing, "seal-key-missing", "The stored response for this Idempotency-Key is sealed with a key the server does not hold", http.StatusInternalServerError),
	problemKindOf(ErrSealBroken, "seal-broken", "The stored response for this Idempotency-Key failed its integrity check", http.StatusInternalServerError),
	problemKindOf(ErrStoreUnavailable, "store-unavailable", "Idempotency store unavailable", http.StatusServiceUnavailable),
	problemKindOf(ErrOverloaded, "overloaded", "Too many requests in progress", http.StatusServiceUnavailable),
}

func problemKindOf(err error, slug, title string, status int) problemKind {
	return problemKind{err: err, slug: slug, title: title, status: status, typeURI: ProblemTypeBase + slug}
}

// Write sends p as application/problem+json (its members sorted, Extra's
// merged), with Cache-Control: no-store and, when RetryAfter is positive,
// Retry-After.
func (p Problem) Write(w http.ResponseWriter) { httpwrite.Problem(p).Write(w) }
