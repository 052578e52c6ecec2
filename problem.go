package idem

import (
	"errors"
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
	// NewKeySafe, the member new_key_safe (sent with every problem of one
	// of idem's types, ProblemTypeBase; with another type only when true,
	// as a handler's own problem may say), tells the client
	// whether sending this request again under a new key is safe: true only
	// when this request could never be claimed under its key (no key, an
	// invalid one that is not a header repeated or a list, a path over
	// MaxPathLength) or its key's record is
	// another method's or path's (422 key-reused); false otherwise, when an
	// attempt of this request may have run under the key: the client
	// retries with the same key, or stops (CONTRACT section 11.5,
	// docs/problems.md). Default: false. An Options.ProblemWriter that
	// writes its own format passes it on.
	NewKeySafe bool `json:"new_key_safe"`
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
	// newKeySafe: Problem.NewKeySafe of every problem of this kind.
	newKeySafe bool
}

// problemKinds: one type each, documented in docs/problems.md (CONTRACT
// section 8); ProblemFor gives the problem of each.
var problemKinds = []problemKind{
	problemKindOf(ErrMissingKey, "missing-key", "Idempotency-Key header required", http.StatusBadRequest, true),
	problemKindOf(ErrInvalidKey, "invalid-key", "Invalid Idempotency-Key header", http.StatusBadRequest, true),
	problemKindOf(ErrMissingScope, "missing-scope", "No scope for this request", http.StatusUnauthorized, false),
	problemKindOf(ErrScopeUnstorable, "scope-unstorable", "The server could not scope this request", http.StatusInternalServerError, false),
	problemKindOf(ErrPathTooLong, "path-too-long", "Request path too long", http.StatusRequestURITooLong, true),
	problemKindOf(ErrRequestTooLarge, "request-too-large", "Request body too large", http.StatusRequestEntityTooLarge, false),
	problemKindOf(ErrBodyUnreadable, "body-unreadable", "Request body could not be read", http.StatusBadRequest, false),
	problemKindOf(ErrKeyReused, "key-reused", "Idempotency-Key reused with a different request", http.StatusUnprocessableEntity, true),
	problemKindOf(ErrInFlight, "request-in-flight", "A request with this Idempotency-Key is in progress", http.StatusConflict, false),
	problemKindOf(ErrLeaseLost, "request-in-flight", "A request with this Idempotency-Key is in progress", http.StatusConflict, false),
	problemKindOf(ErrOutcomeUnknown, "outcome-unknown", "The outcome of the request with this Idempotency-Key cannot be known", http.StatusConflict, false),
	problemKindOf(ErrResponseNotStored, "response-not-stored", "The response for this Idempotency-Key was not stored", http.StatusGone, false),
	problemKindOf(ErrResponseMissing, "response-missing", "The response for this Idempotency-Key is missing from the store", http.StatusInternalServerError, false),
	problemKindOf(ErrRecordDamaged, "record-damaged", "The record for this Idempotency-Key is damaged", http.StatusInternalServerError, false),
	problemKindOf(ErrTxAborted, "transaction-aborted", "The request's transaction aborted", http.StatusInternalServerError, false),
	problemKindOf(ErrInvalidStatus, "invalid-status", "The server answered with an invalid status", http.StatusInternalServerError, false),
	problemKindOf(ErrSealKeyMissing, "seal-key-missing", "The stored response for this Idempotency-Key is sealed with a key the server does not hold", http.StatusInternalServerError, false),
	problemKindOf(ErrSealBroken, "seal-broken", "The stored response for this Idempotency-Key failed its integrity check", http.StatusInternalServerError, false),
	problemKindOf(ErrStepUnreconciled, "step-unreconciled", "A step of this request is not reconciled yet", http.StatusServiceUnavailable, false),
	problemKindOf(ErrStoreUnavailable, "store-unavailable", "Idempotency store unavailable", http.StatusServiceUnavailable, false),
	problemKindOf(ErrOverloaded, "overloaded", "Too many requests in progress", http.StatusServiceUnavailable, false),
}

func problemKindOf(err error, slug, title string, status int, newKeySafe bool) problemKind {
	return problemKind{err: err, slug: slug, title: title, status: status, typeURI: ProblemTypeBase + slug, newKeySafe: newKeySafe}
}

// Write sends p as application/problem+json (its members sorted, Extra's
// merged), with Cache-Control: no-store and, when RetryAfter is positive,
// Retry-After.
func (p Problem) Write(w http.ResponseWriter) { httpwrite.Problem(p).Write(w) }

// NewKeySafe reports whether a request that got err (Do's, or a problem's
// sentinel) may be sent again under a new key: Problem.NewKeySafe of err's
// kind (CONTRACT section 11.5). It is false for nil (the outcome is
// recorded: a new key runs fn again), for an error of no idem problem kind,
// for one that matches any kind that is not safe, and for one whose chain
// holds an error with a method NewKeySafe() bool that says false (idem's
// own: ErrKeyReused of the same method and path with another payload;
// ErrInvalidKey of a header repeated or a list; an adapter may add its
// own). It reads errors only: an error fn returned that wraps one of these
// sentinels (a nested Do's) reads as that sentinel, though fn ran;
// DoReport's Report.NewKeySafe knows.
func NewKeySafe(err error) bool {
	if saysKeyUnsafe(err) {
		return false
	}
	safe := false
	for _, k := range problemKinds {
		if err != nil && errors.Is(err, k.err) {
			if !k.newKeySafe {
				return false
			}
			safe = true
		}
	}
	return safe
}

// saysKeyUnsafe reports whether an error in err's chain says itself that a
// new key is not safe (a method NewKeySafe() bool that returns false).
func saysKeyUnsafe(err error) bool {
	var says interface{ NewKeySafe() bool }
	return errors.As(err, &says) && !says.NewKeySafe()
}
