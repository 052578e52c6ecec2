package main

import (
	"bytes"
	"encoding/json"
	"fmt"
	"mime"
	"net/url"
	"strconv"
	"strings"
	"unicode/utf8"

	"github.com/idemgo/idem/cmd/internal/service"
)

// Limits of a charge's fields.
const (
	MaxAmount            = 1 << 53 // minor units
	MaxCustomerLength    = 255     // characters
	MaxDescriptionLength = 1000    // characters
)

// errUnsupportedMedia is answered 415.
var errUnsupportedMedia = service.ErrUnsupportedMedia

// invalidParam names one invalid field and why (RFC 9457 section 3's
// "invalid-params" example member).
type invalidParam = service.InvalidParam

// inputError lists the invalid fields of a request, or says why the body as
// a whole is not valid.
type inputError = service.InputError

// chargeInput is a validated POST /v1/charges body.
type chargeInput struct {
	Amount      int64
	Currency    string // upper case
	Customer    string
	Description string
}

// parseChargeInput reads a POST /v1/charges body: a JSON object or a form,
// with amount (integer minor units, 1 to 2^53), currency (three letters),
// customer (1 to 255 characters) and an optional description.
func parseChargeInput(contentType string, body []byte) (chargeInput, error) {
	mediaType, _, err := mime.ParseMediaType(contentType)
	if err != nil {
		return chargeInput{}, fmt.Errorf("%w: send application/json or application/x-www-form-urlencoded", errUnsupportedMedia)
	}
	fields := map[string]string{}
	switch mediaType {
	case "application/json":
		var raw map[string]json.RawMessage
		dec := json.NewDecoder(bytes.NewReader(body))
		dec.UseNumber()
		if err := dec.Decode(&raw); err != nil || raw == nil {
			return chargeInput{}, &inputError{Detail: "the request body must be one JSON object"}
		}
		for name, v := range raw {
			if name == "amount" {
				fields[name] = string(v)
				continue
			}
			if string(v) == "null" && name == "description" {
				continue
			}
			var s string
			if err := json.Unmarshal(v, &s); err != nil {
				fields[name] = "\x00" // not a string: invalid below
				continue
			}
			fields[name] = s
		}
	case "application/x-www-form-urlencoded":
		values, err := url.ParseQuery(string(body))
		if err != nil {
			return chargeInput{}, &inputError{Detail: "the request body is not a valid form"}
		}
		for name, vs := range values {
			fields[name] = vs[0]
		}
	default:
		return chargeInput{}, fmt.Errorf("%w: %s", errUnsupportedMedia, mediaType)
	}

	var (
		in   chargeInput
		errs []invalidParam
	)
	fail := func(name, reason string) { errs = append(errs, invalidParam{Name: name, Reason: reason}) }
	if v, ok := fields["amount"]; !ok {
		fail("amount", "is required")
	} else if n, err := strconv.ParseInt(v, 10, 64); err != nil || n < 1 || n > MaxAmount || strings.HasPrefix(v, "+") {
		fail("amount", fmt.Sprintf("must be an integer from 1 to %d (minor units)", int64(MaxAmount)))
	} else {
		in.Amount = n
	}
	if v, ok := fields["currency"]; !ok {
		fail("currency", "is required")
	} else if len(v) != 3 || strings.Trim(v, "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz") != "" {
		fail("currency", "must be a three-letter ISO 4217 code")
	} else {
		in.Currency = strings.ToUpper(v)
	}
	if v, ok := fields["customer"]; !ok {
		fail("customer", "is required")
	} else if reason := text(v, MaxCustomerLength); reason != "" || strings.TrimSpace(v) == "" {
		fail("customer", "must be 1 to 255 characters of text")
	} else {
		in.Customer = v
	}
	if v, ok := fields["description"]; ok {
		if reason := text(v, MaxDescriptionLength); reason != "" {
			fail("description", reason)
		}
		in.Description = v
	}
	for _, name := range service.UnknownFields(fields, "amount", "currency", "customer", "description") {
		fail(name, "is not a known field")
	}
	if len(errs) > 0 {
		return chargeInput{}, &inputError{Params: errs}
	}
	return in, nil
}

// text checks a string field: valid UTF-8, at most max characters, no NUL.
func text(s string, max int) string {
	switch {
	case !utf8.ValidString(s) || strings.ContainsRune(s, 0):
		return "must be a string of valid UTF-8"
	case utf8.RuneCountInString(s) > max:
		return fmt.Sprintf("must be at most %d characters", max)
	}
	return ""
}
