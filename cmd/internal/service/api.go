package service

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"strings"
	"time"

	"github.com/google/uuid"

	"github.com/idemgo/idem"
)

// APIKeyPrefix starts every API key; the rest of the key is the merchant.
const APIKeyPrefix = "sk_test_"

// MaxMerchantLength is the longest merchant name, in bytes.
const MaxMerchantLength = 64

// Problem kinds every service sends: the fragment of the type URI
// (API.ProblemTypeBase + kind), one section of the service's README each.
const (
	ProblemUnauthorized     = "unauthorized"           // 401, from API.Authenticate
	ProblemInvalidRequest   = "invalid-request"        // 400
	ProblemUnsupportedMedia = "unsupported-media-type" // 415
	ProblemNotFound         = "not-found"              // 404
	ProblemUnavailable      = "unavailable"            // 503
	ProblemInternal         = "internal-error"         // 500, also from API.WriteJSON
)

// problemTitles are the titles of the kinds above.
var problemTitles = map[string]string{
	ProblemUnauthorized:     "Missing or invalid API key",
	ProblemInvalidRequest:   "The request is not valid",
	ProblemUnsupportedMedia: "Unsupported request body media type",
	ProblemNotFound:         "Not found",
	ProblemUnavailable:      "Service unavailable",
	ProblemInternal:         "Internal error",
}

// API is what a service's handlers share: its name and where its problem
// types are documented. idem's own problems (missing-key, key-reused,
// request-in-flight, ...) keep idem's type URIs.
type API struct {
	// Name is the service's name, the realm of its WWW-Authenticate
	// challenge, for example "paymentsd".
	Name string
	// ProblemTypeBase prefixes a kind to make a problem's type URI, for
	// example "https://github.com/idemgo/idem/blob/main/cmd/paymentsd/README.md#".
	ProblemTypeBase string
	// ProblemTitles maps the service's own kinds, beyond the Problem*
	// constants, to their titles (it may also retitle those); a kind in
	// neither has an empty title.
	ProblemTitles map[string]string
}

// Problem returns the problem details of kind: type ProblemTypeBase+kind,
// the kind's title, status (an HTTP status code) and detail (for the client;
// never credentials).
func (a *API) Problem(kind string, status int, detail string) idem.Problem {
	title, ok := a.ProblemTitles[kind]
	if !ok {
		title = problemTitles[kind]
	}
	return idem.Problem{Type: a.ProblemTypeBase + kind, Title: title, Status: status, Detail: detail}
}

// WriteProblem sends Problem(kind, status, detail) as
// application/problem+json.
func (a *API) WriteProblem(w http.ResponseWriter, kind string, status int, detail string) {
	a.Problem(kind, status, detail).Write(w)
}

// WriteRetryLater sends Problem(kind, status, detail) with "Retry-After: 1"
// (idem.Problem.RetryAfter of one second): the answer of a failure that a
// retry soon may not meet, such as a database or a provider that did not
// answer.
func (a *API) WriteRetryLater(w http.ResponseWriter, kind string, status int, detail string) {
	p := a.Problem(kind, status, detail)
	p.RetryAfter = time.Second
	p.Write(w)
}

// WriteJSON sends v encoded by encoding/json, followed by a newline, as
// application/json with status. When v cannot be encoded it sends a 500
// internal-error problem instead.
func (a *API) WriteJSON(w http.ResponseWriter, status int, v any) {
	var buf bytes.Buffer
	enc := json.NewEncoder(&buf)
	enc.SetEscapeHTML(false) // JSON for API clients, not for embedding in HTML
	if err := enc.Encode(v); err != nil {
		a.WriteProblem(w, ProblemInternal, http.StatusInternalServerError, "the response could not be encoded")
		return
	}
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_, _ = w.Write(buf.Bytes()) // Encode ends it with a newline
}

type merchantKey struct{}

// Merchant returns the merchant that API.Authenticate put in ctx, and
// whether there is one.
func Merchant(ctx context.Context) (string, bool) {
	m, ok := ctx.Value(merchantKey{}).(string)
	return m, ok
}

// WithMerchant returns ctx carrying merchant, as API.Authenticate makes it
// (idem's completer rebuilds a re-driven request's context with it).
func WithMerchant(ctx context.Context, merchant string) context.Context {
	return context.WithValue(ctx, merchantKey{}, merchant)
}

// Scope is idem's ScopeFunc (idem.Options.Scope): the merchant owns its keys,
// so two merchants sending the same Idempotency-Key never meet. It fails for
// a request that API.Authenticate did not let through.
func Scope(r *http.Request) (string, error) {
	m, ok := Merchant(r.Context())
	if !ok {
		return "", errors.New("the request carries no authenticated merchant")
	}
	return m, nil
}

// Authenticate answers 401 unless the request carries
// "Authorization: Bearer sk_test_<merchant>" (RFC 6750 section 2.1; see
// ParseAuthorization), and passes the merchant to next in the request's
// context (Merchant) and to the request's log line (RequestInfo). Put before
// idem, it keeps unauthenticated requests away from the store.
//
// The 401 is the unauthorized problem, whose detail says what is wrong,
// with the challenge `WWW-Authenticate: Bearer realm="<Name>"`, plus
// `, error="invalid_token"` when an Authorization header was sent (RFC 9110
// section 15.5.2: a 401 carries a challenge).
func (a *API) Authenticate(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		values := r.Header.Values("Authorization")
		merchant, err := ParseAuthorization(values)
		if err != nil {
			challenge := `Bearer realm="` + a.Name + `"`
			if len(values) > 0 {
				challenge += `, error="invalid_token"`
			}
			w.Header().Set("WWW-Authenticate", challenge)
			a.WriteProblem(w, ProblemUnauthorized, http.StatusUnauthorized, err.Error())
			return
		}
		if info := RequestInfoFrom(r.Context()); info != nil {
			info.Merchant = merchant
		}
		next.ServeHTTP(w, r.WithContext(WithMerchant(r.Context(), merchant)))
	})
}

// ParseAuthorization returns the merchant named by the values of the
// Authorization header: exactly one value, "Bearer" (in any case), then
// APIKeyPrefix and a merchant of 1 to MaxMerchantLength characters of A-Z,
// a-z, 0-9, '_' and '-'. The error says what is wrong, for the client; it
// never echoes the credentials.
func ParseAuthorization(values []string) (string, error) {
	switch len(values) {
	case 0:
		return "", errors.New("send your API key as 'Authorization: Bearer sk_test_<merchant>'")
	case 1:
	default:
		return "", errors.New("send one Authorization header")
	}
	scheme, token, _ := strings.Cut(strings.TrimSpace(values[0]), " ")
	// The scheme is case-insensitive (RFC 9110 section 11.1).
	if !strings.EqualFold(scheme, "Bearer") {
		return "", errors.New("the Authorization scheme must be Bearer")
	}
	if strings.TrimSpace(token) == "" {
		return "", errors.New("the Authorization header has no API key after Bearer")
	}
	merchant, ok := strings.CutPrefix(strings.TrimLeft(token, " "), APIKeyPrefix)
	if !ok {
		return "", fmt.Errorf("the API key must start with %s", APIKeyPrefix)
	}
	if merchant == "" {
		return "", errors.New("the API key names no merchant")
	}
	if len(merchant) > MaxMerchantLength {
		return "", fmt.Errorf("the merchant in the API key is longer than %d characters", MaxMerchantLength)
	}
	for i := 0; i < len(merchant); i++ {
		c := merchant[i]
		if !('a' <= c && c <= 'z' || 'A' <= c && c <= 'Z' || '0' <= c && c <= '9' || c == '_' || c == '-') {
			return "", errors.New("the merchant in the API key may hold only A-Z, a-z, 0-9, '_' and '-'")
		}
	}
	return merchant, nil
}

// NewID returns prefix + "_" + a version 7 (time-ordered) UUID, for
// example "pay_01a22bbf-f66a-73bd-accc-26f42c5fbd2c"; a random (version 4)
// UUID if the clock cannot give one.
func NewID(prefix string) string {
	id, err := uuid.NewV7()
	if err != nil {
		id = uuid.New()
	}
	return prefix + "_" + id.String()
}
