package idem

import (
	"bytes"
	"encoding/json"
	"errors"
	"net/http"
	"strconv"
	"sync"
	"sync/atomic"
	"time"
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
	err    error
	slug   string
	title  string
	status int
}

// problemKinds: one type each, documented in docs/problems.md (CONTRACT section 8).
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
	{ErrRecordDamaged, "record-damaged", "The record for this Idempotency-Key is damaged", http.StatusInternalServerError},
	{ErrTxAborted, "transaction-aborted", "The request's transaction aborted", http.StatusInternalServerError},
	{ErrInvalidStatus, "invalid-status", "The server answered with an invalid status", http.StatusInternalServerError},
	{ErrSealKeyMissing, "seal-key-missing", "The stored response for this Idempotency-Key is sealed with a key the server does not hold", http.StatusInternalServerError},
	{ErrSealBroken, "seal-broken", "The stored response for this Idempotency-Key failed its integrity check", http.StatusInternalServerError},
	{ErrStoreUnavailable, "store-unavailable", "Idempotency store unavailable", http.StatusServiceUnavailable},
	{ErrOverloaded, "overloaded", "Too many requests in progress", http.StatusServiceUnavailable},
}

var problemTypes = func() map[string]string {
	types := make(map[string]string, len(problemKinds))
	for _, k := range problemKinds {
		types[k.slug] = ProblemTypeBase + k.slug
	}
	return types
}()

func (k problemKind) typeURI() string { return problemTypes[k.slug] }

// ProblemFor returns the problem of the idem kind that kind matches
// (errors.Is), or a 500 about:blank.
func ProblemFor(kind error, detail string) Problem {
	for _, k := range problemKinds {
		if kind != nil && errors.Is(kind, k.err) {
			return Problem{Type: k.typeURI(), Title: k.title, Status: k.status, Detail: detail}
		}
	}
	return Problem{Type: "about:blank", Title: http.StatusText(http.StatusInternalServerError), Status: http.StatusInternalServerError, Detail: detail}
}

// Write sends p as application/problem+json.
func (p Problem) Write(w http.ResponseWriter) {
	body := p.encode()
	h := w.Header()
	h.Set("Content-Type", "application/problem+json")
	h.Set("Cache-Control", "no-store")
	if p.RetryAfter > 0 {
		h.Set("Retry-After", strconv.FormatInt(retryAfterSeconds(p.RetryAfter), 10))
	}
	w.WriteHeader(p.Status)
	_, _ = w.Write(body) // Encode ends it with a newline; a client gone is no error of ours
}

// encode is p's JSON: its members sorted, Extra's merged. A problem with no
// Extra is encoded once and kept (problemBodies): idem's own problems are a
// few dozen texts, and a retry storm's 409s and 422s send the same ones.
func (p Problem) encode() []byte {
	members := problemMembers{p.Detail, p.Instance, p.Status, p.Title, p.Type}
	if len(p.Extra) == 0 {
		if b, ok := problemBodies.Load(members); ok {
			return b.([]byte)
		}
	}
	var buf bytes.Buffer
	enc := json.NewEncoder(&buf)
	enc.SetEscapeHTML(false) // a detail may quote <placeholders>; this is no HTML
	if err := p.encodeExtra(enc); len(p.Extra) == 0 || err != nil {
		// Sorted members; also when an Extra member cannot be encoded.
		buf.Reset()
		_ = enc.Encode(members) // strings and a number: no error
	}
	if len(p.Extra) == 0 && buf.Len() <= maxProblemBodyBytes && problemBodiesKept.Add(1) <= maxProblemBodies {
		problemBodies.Store(members, buf.Bytes())
	}
	return buf.Bytes()
}

// problemBodies holds the encoded bodies of problems without Extra
// (problemMembers to []byte, never changed once stored), at most
// maxProblemBodies of them, each at most maxProblemBodyBytes: details that
// quote a request's method and path or a status are as many as an
// application's routes (and a client chooses its path); past either bound,
// a problem is encoded each time, so what is kept stays under 256 KiB
// twice over (the key holds the detail too).
var (
	problemBodies     sync.Map
	problemBodiesKept atomic.Int64
)

const (
	maxProblemBodies    = 256
	maxProblemBodyBytes = 1 << 10
)

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

type problemMembers struct {
	Detail   string `json:"detail,omitempty"`
	Instance string `json:"instance,omitempty"`
	Status   int    `json:"status"`
	Title    string `json:"title"`
	Type     string `json:"type"`
}

func retryAfterSeconds(d time.Duration) int64 {
	s := int64(d / time.Second)
	if d%time.Second > 0 {
		s++
	}
	return max(s, 1)
}
