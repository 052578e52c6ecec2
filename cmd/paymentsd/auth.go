package main

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"strings"
)

// APIKeyPrefix starts every API key; the rest of the key is the merchant.
const APIKeyPrefix = "sk_test_"

// MaxMerchantLength is the longest merchant name, in bytes.
const MaxMerchantLength = 64

type merchantKey struct{}

// merchantFrom returns the merchant the authentication layer put in ctx.
func merchantFrom(ctx context.Context) (string, bool) {
	m, ok := ctx.Value(merchantKey{}).(string)
	return m, ok
}

// scopeFromMerchant is idem's ScopeFunc: the merchant owns its keys, so two
// merchants sending the same Idempotency-Key never meet.
func scopeFromMerchant(r *http.Request) (string, error) {
	m, ok := merchantFrom(r.Context())
	if !ok {
		return "", errors.New("the request carries no authenticated merchant")
	}
	return m, nil
}

// authenticate answers 401 unless the request carries
// "Authorization: Bearer sk_test_<merchant>" (RFC 6750 section 2.1), and
// passes the merchant to next in the request's context. It runs before idem,
// so an unauthenticated request never reaches the store.
func authenticate(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		merchant, err := parseAuthorization(r.Header.Values("Authorization"))
		if err != nil {
			challenge := `Bearer realm="paymentsd"`
			if len(r.Header.Values("Authorization")) > 0 {
				challenge += `, error="invalid_token"`
			}
			// RFC 9110 section 15.5.2: a 401 carries a challenge.
			w.Header().Set("WWW-Authenticate", challenge)
			writeProblem(w, problemUnauthorized, http.StatusUnauthorized, err.Error())
			return
		}
		if info := requestInfoFrom(r.Context()); info != nil {
			info.merchant = merchant
		}
		next.ServeHTTP(w, r.WithContext(context.WithValue(r.Context(), merchantKey{}, merchant)))
	})
}

// parseAuthorization returns the merchant named by the Authorization field
// values, or an error that says what is wrong (sent to the client as the
// problem's detail; it never echoes the credentials).
func parseAuthorization(values []string) (string, error) {
	switch len(values) {
	case 0:
		return "", errors.New("send your API key as 'Authorization: Bearer sk_test_<merchant>'")
	case 1:
	default:
		return "", errors.New("send one Authorization header")
	}
	scheme, token, ok := strings.Cut(strings.TrimSpace(values[0]), " ")
	// The scheme is case-insensitive (RFC 9110 section 11.1).
	if !ok || !strings.EqualFold(scheme, "Bearer") {
		return "", errors.New("the Authorization scheme must be Bearer")
	}
	token = strings.TrimLeft(token, " ")
	merchant, ok := strings.CutPrefix(token, APIKeyPrefix)
	if !ok {
		return "", fmt.Errorf("the API key must start with %s", APIKeyPrefix)
	}
	if err := validMerchant(merchant); err != nil {
		return "", err
	}
	return merchant, nil
}

// validMerchant checks a merchant name: 1 to MaxMerchantLength characters
// of A-Z, a-z, 0-9, '_' and '-'.
func validMerchant(m string) error {
	if m == "" {
		return errors.New("the API key names no merchant")
	}
	if len(m) > MaxMerchantLength {
		return fmt.Errorf("the merchant in the API key is longer than %d characters", MaxMerchantLength)
	}
	for i := 0; i < len(m); i++ {
		c := m[i]
		if !('a' <= c && c <= 'z' || 'A' <= c && c <= 'Z' || '0' <= c && c <= '9' || c == '_' || c == '-') {
			return errors.New("the merchant in the API key may hold only A-Z, a-z, 0-9, '_' and '-'")
		}
	}
	return nil
}
