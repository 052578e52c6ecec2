package main

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math/big"
	"mime"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"unicode"
	"unicode/utf8"

	"github.com/idemgo/idem/cmd/internal/service"
)

// Limits of a payment request's fields.
const (
	// MaxAmount is the largest amount accepted, in minor units: 2^53, the
	// largest integer every JSON parser reads exactly (RFC 8259 section 6).
	MaxAmount            = 1 << 53
	MaxCustomerLength    = 255  // characters
	MaxDescriptionLength = 1000 // characters
)

// Currencies is the allow-list of ISO 4217 currency codes a payment may use.
var Currencies = []string{
	"AUD", "BRL", "CAD", "CHF", "CNY", "DKK", "EUR", "GBP", "HKD", "INR",
	"JPY", "KRW", "MXN", "NOK", "NZD", "PLN", "SEK", "SGD", "USD", "ZAR",
}

// Request body media types POST /v1/payments accepts.
const (
	mediaJSON = "application/json"
	mediaForm = "application/x-www-form-urlencoded"
)

// paymentInput is a validated POST /v1/payments body.
type paymentInput struct {
	Amount      int64
	Currency    string // upper case, in Currencies
	Customer    string
	Description string // empty when not given
}

// errUnsupportedMedia is answered 415.
var errUnsupportedMedia = service.ErrUnsupportedMedia

// inputError is a body that is not valid: malformed as a whole (Detail) or
// with invalid fields (Params).
type inputError = service.InputError

// payment fields, in the order their errors are listed.
var paymentFields = []string{"amount", "currency", "customer", "description"}

// parsePaymentInput reads a POST /v1/payments body of the given Content-Type:
// a JSON object, or a form (as Stripe's API takes it). It returns
// errUnsupportedMedia (wrapped) for other media types, and an *inputError
// listing every invalid field otherwise.
func parsePaymentInput(contentType string, body []byte) (paymentInput, error) {
	mediaType, params, err := mime.ParseMediaType(contentType)
	if contentType == "" || err != nil {
		return paymentInput{}, fmt.Errorf("%w: send the body as %s or %s", errUnsupportedMedia, mediaJSON, mediaForm)
	}
	if cs, ok := params["charset"]; ok && !strings.EqualFold(cs, "utf-8") {
		return paymentInput{}, fmt.Errorf("%w: charset %q; send UTF-8", errUnsupportedMedia, cs)
	}
	var fields map[string]fieldValue
	switch mediaType {
	case mediaJSON:
		fields, err = jsonFields(body)
	case mediaForm:
		fields, err = formFields(body)
	default:
		return paymentInput{}, fmt.Errorf("%w: %s; send the body as %s or %s", errUnsupportedMedia, mediaType, mediaJSON, mediaForm)
	}
	if err != nil {
		return paymentInput{}, err
	}
	return validatePayment(fields)
}

// fieldValue is one field of the body: a JSON value (raw) or a form value.
type fieldValue struct {
	raw    json.RawMessage // JSON bodies
	form   string          // form bodies
	isForm bool
	dup    bool // the field appears more than once
}

// invalidJSON is the input error of a body the JSON decoder refused; a body
// cut short says so instead of the decoder's bare "EOF".
func invalidJSON(err error) *inputError {
	if errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) {
		return &inputError{Detail: "the request body is not valid JSON: it ends before the object is closed"}
	}
	return &inputError{Detail: "the request body is not valid JSON: " + err.Error()}
}

// jsonFields splits a JSON object into its members, keeping each value raw
// so that types are checked exactly (an amount of 12.5 or "1000" is an
// error, not a conversion). A member given twice is an error, not "the last
// one wins".
func jsonFields(body []byte) (map[string]fieldValue, error) {
	notObject := &inputError{Detail: "the request body must be one JSON object"}
	dec := json.NewDecoder(bytes.NewReader(body))
	dec.UseNumber()
	if tok, err := dec.Token(); err != nil || tok != json.Delim('{') {
		return nil, notObject
	}
	fields := map[string]fieldValue{}
	for dec.More() {
		tok, err := dec.Token()
		if err != nil {
			return nil, invalidJSON(err)
		}
		name, _ := tok.(string)
		var raw json.RawMessage
		if err := dec.Decode(&raw); err != nil {
			return nil, invalidJSON(err)
		}
		_, seen := fields[name]
		fields[name] = fieldValue{raw: raw, dup: seen}
	}
	if _, err := dec.Token(); err != nil {
		return nil, invalidJSON(err)
	}
	if _, err := dec.Token(); err != io.EOF {
		return nil, notObject
	}
	return fields, nil
}

// formFields parses an application/x-www-form-urlencoded body.
func formFields(body []byte) (map[string]fieldValue, error) {
	values, err := url.ParseQuery(string(body))
	if err != nil {
		return nil, &inputError{Detail: "the request body is not valid application/x-www-form-urlencoded: " + err.Error()}
	}
	fields := map[string]fieldValue{}
	for name, vs := range values {
		fields[name] = fieldValue{form: vs[0], isForm: true, dup: len(vs) > 1}
	}
	return fields, nil
}

// validatePayment checks every field and lists every problem found.
func validatePayment(fields map[string]fieldValue) (paymentInput, error) {
	var (
		in   paymentInput
		errs []invalidParam
	)
	fail := func(name, reason string) { errs = append(errs, invalidParam{Name: name, Reason: reason}) }
	for _, name := range paymentFields {
		f, ok := fields[name]
		switch {
		case !ok && name == "description":
			continue // optional
		case !ok:
			fail(name, "is required")
			continue
		case f.dup:
			fail(name, "is given more than once")
			continue
		case name == "description" && string(f.raw) == "null":
			continue // JSON null: not given
		}
		var reason string
		switch name {
		case "amount":
			in.Amount, reason = parseAmount(f)
		case "currency":
			in.Currency, reason = parseCurrency(f)
		case "customer":
			in.Customer, reason = parseText(f, MaxCustomerLength, false)
			if reason == "" && strings.TrimSpace(in.Customer) == "" {
				reason = "must not be empty"
			}
		case "description":
			in.Description, reason = parseText(f, MaxDescriptionLength, true)
		}
		if reason != "" {
			fail(name, reason)
		}
	}
	for _, name := range service.UnknownFields(fields, paymentFields...) {
		fail(name, "is not a known field")
	}
	if len(errs) > 0 {
		return paymentInput{}, &inputError{Params: errs}
	}
	return in, nil
}

// parseAmount reads a positive integer amount in minor units: a JSON number
// whose value is an integer, or a form value of decimal digits.
//
// In JSON the value counts, not its spelling: 1000, 1000.0 and 1e3 are one
// amount, as they are one number to RFC 8785 and so to idem's fingerprint.
// Were 1000.0 refused, a retry that spelled the same request 1000 would be
// replayed the refusal (the two share a fingerprint). A form value is
// fingerprinted as sent, and must be plain digits.
func parseAmount(f fieldValue) (int64, string) {
	const reason = "must be an integer amount in minor units (e.g. 1000 for 10.00 USD)"
	if f.isForm {
		digits := strings.TrimPrefix(f.form, "-")
		if digits == "" || strings.Trim(digits, "0123456789") != "" {
			return 0, reason
		}
		if f.form[0] == '-' {
			return 0, "must be greater than 0"
		}
		n, err := strconv.ParseInt(digits, 10, 64)
		if err != nil || n > MaxAmount {
			return 0, fmt.Sprintf("must be at most %d", int64(MaxAmount))
		}
		if n == 0 {
			return 0, "must be greater than 0"
		}
		return n, ""
	}
	if len(f.raw) == 0 || (f.raw[0] != '-' && (f.raw[0] < '0' || f.raw[0] > '9')) {
		return 0, reason + ", given as a JSON number"
	}
	// ParseFloat first bounds the number cheaply (1e999999 is out of
	// range), so that big.Rat below only sees modest exponents.
	v, err := strconv.ParseFloat(string(f.raw), 64)
	switch {
	case v < 0 || f.raw[0] == '-': // -Inf and -0 included
		return 0, "must be greater than 0"
	case err != nil || v > MaxAmount: // +Inf included
		return 0, fmt.Sprintf("must be at most %d", int64(MaxAmount))
	case v == 0:
		if mantissa, _, _ := strings.Cut(strings.ToLower(string(f.raw)), "e"); strings.Trim(mantissa, "0.") != "" {
			return 0, reason // too small for a double, so not an integer
		}
		return 0, "must be greater than 0"
	}
	exact, ok := new(big.Rat).SetString(string(f.raw))
	switch {
	case !ok || !exact.IsInt():
		return 0, reason
	case exact.Cmp(new(big.Rat).SetInt64(MaxAmount)) > 0: // 2^53 + 1 rounds down to 2^53
		return 0, fmt.Sprintf("must be at most %d", int64(MaxAmount))
	}
	return exact.Num().Int64(), ""
}

// parseCurrency reads an ISO 4217 code from Currencies, in any case.
func parseCurrency(f fieldValue) (string, string) {
	s, reason := stringValue(f)
	if reason != "" {
		return "", reason
	}
	if len(s) != 3 || strings.Trim(s, "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz") != "" {
		return "", "must be a three-letter ISO 4217 currency code"
	}
	code := strings.ToUpper(s)
	if !slices.Contains(Currencies, code) {
		return "", fmt.Sprintf("currency %s is not supported; use one of %s", code, strings.Join(Currencies, ", "))
	}
	return code, ""
}

// parseText reads a string of at most max characters without control
// characters (tab, carriage return and line feed allowed when multiline).
func parseText(f fieldValue, max int, multiline bool) (string, string) {
	s, reason := stringValue(f)
	if reason != "" {
		return "", reason
	}
	if n := utf8.RuneCountInString(s); n > max {
		return "", fmt.Sprintf("must be at most %d characters, not %d", max, n)
	}
	for _, r := range s {
		if unicode.IsControl(r) && !(multiline && (r == '\t' || r == '\n' || r == '\r')) {
			return "", "must not contain control characters"
		}
	}
	return s, ""
}

// stringValue reads a JSON string or a form value as valid UTF-8.
func stringValue(f fieldValue) (string, string) {
	s := f.form
	if !f.isForm {
		if len(f.raw) == 0 || f.raw[0] != '"' {
			return "", "must be a string"
		}
		if !utf8.Valid(f.raw) {
			return "", "must be valid UTF-8"
		}
		if err := json.Unmarshal(f.raw, &s); err != nil {
			return "", "must be a string"
		}
	}
	if !utf8.ValidString(s) {
		return "", "must be valid UTF-8"
	}
	return s, ""
}
