package main

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"strings"

	"github.com/idemgo/idem"
)

// APIKeyPrefix starts every API key; the rest of the key is the merchant,
// as in paymentsd (whose provider client sends its merchant's key).
const APIKeyPrefix = "sk_test_"

// MaxMerchantLength is the longest merchant name, in bytes.
const MaxMerchantLength = 64

type merchantKey struct{}

func merchantFrom(ctx context.Context) (string, bool) {
	m, ok := ctx.Value(merchantKey{}).(string)
	return m, ok
}

// scopeFromMerchant is idem's ScopeFunc: each merchant's keys are its own.
func scopeFromMerchant(r *http.Request) (string, error) {
	m, ok := merchantFrom(r.Context())
	if !ok {
		return "", errors.New("the request carries no authenticated merchant")
	}
	return m, nil
}

// authenticate answers 401 unless the request carries
// "Authorization: Bearer sk_test_<merchant>", and passes the merchant on.
func authenticate(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		merchant, err := parseAuthorization(r.Header.Values("Authorization"))
		if err != nil {
			w.Header().Set("WWW-Authenticate", `Bearer realm="fakepsp"`)
			writeProblem(w, problemUnauthorized, http.StatusUnauthorized, err.Error())
			return
		}
		if info := requestInfoFrom(r.Context()); info != nil {
			info.merchant = merchant
		}
		next.ServeHTTP(w, r.WithContext(context.WithValue(r.Context(), merchantKey{}, merchant)))
	})
}

func parseAuthorization(values []string) (string, error) {
	if len(values) != 1 {
		return "", errors.New("send one 'Authorization: Bearer sk_test_<merchant>' header")
	}
	scheme, token, ok := strings.Cut(strings.TrimSpace(values[0]), " ")
	if !ok || !strings.EqualFold(scheme, "Bearer") {
		return "", errors.New("the Authorization scheme must be Bearer")
	}
	merchant, ok := strings.CutPrefix(strings.TrimLeft(token, " "), APIKeyPrefix)
	if !ok {
		return "", fmt.Errorf("the API key must start with %s", APIKeyPrefix)
	}
	if merchant == "" || len(merchant) > MaxMerchantLength {
		return "", fmt.Errorf("the merchant in the API key must be 1 to %d characters", MaxMerchantLength)
	}
	for i := 0; i < len(merchant); i++ {
		c := merchant[i]
		if !('a' <= c && c <= 'z' || 'A' <= c && c <= 'Z' || '0' <= c && c <= '9' || c == '_' || c == '-') {
			return "", errors.New("the merchant in the API key may hold only A-Z, a-z, 0-9, '_' and '-'")
		}
	}
	return merchant, nil
}

// ProblemTypeBase prefixes the type URI of fakepsp's own problems; idem's
// (missing-key, key-reused, request-in-flight, ...) keep idem's URIs.
const ProblemTypeBase = "https://github.com/idemgo/idem/blob/main/cmd/fakepsp/README.md#"

const (
	problemUnauthorized     = "unauthorized"
	problemInvalidRequest   = "invalid-request"
	problemUnsupportedMedia = "unsupported-media-type"
	problemNotFound         = "not-found"
	problemUnavailable      = "unavailable"
	problemInternal         = "internal-error"
)

var problemTitles = map[string]string{
	problemUnauthorized:     "Missing or invalid API key",
	problemInvalidRequest:   "The request is not valid",
	problemUnsupportedMedia: "Unsupported request body media type",
	problemNotFound:         "Not found",
	problemUnavailable:      "Service unavailable",
	problemInternal:         "Internal error",
}

func problem(kind string, status int, detail string) idem.Problem {
	return idem.Problem{Type: ProblemTypeBase + kind, Title: problemTitles[kind], Status: status, Detail: detail}
}

func writeProblem(w http.ResponseWriter, kind string, status int, detail string) {
	problem(kind, status, detail).Write(w)
}
