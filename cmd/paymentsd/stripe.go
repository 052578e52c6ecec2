package main

import (
	"errors"
	"fmt"
	"io"
	"mime"
	"net/http"
	"sort"
	"strconv"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/idemgo/idem"
	"github.com/idemgo/idem/cmd/internal/service"
)

// The Stripe-compatible endpoint: POST /v1/payment_intents takes Stripe's
// form body and answers a Stripe-shaped PaymentIntent, or Stripe's error
// body, so that Stripe's own client libraries (stripe-go and the others)
// can be pointed at paymentsd and retry exactly when a retry is safe.
// docs/clients.md shows it with stripe-go.

// Limits of a PaymentIntent's metadata, Stripe's: at most 50 keys, a key of
// at most 40 characters, a value of at most 500.
const (
	MaxMetadataKeys        = 50
	MaxMetadataKeyLength   = 40
	MaxMetadataValueLength = 500
)

// Stripe's error types (the error object's "type") that paymentsd answers.
const (
	stripeAPIError            = "api_error"
	stripeIdempotencyError    = "idempotency_error"
	stripeInvalidRequestError = "invalid_request_error"
)

// stripeErrorBody is Stripe's error object, sent as {"error": {...}}.
type stripeErrorBody struct {
	Type    string `json:"type"`
	Code    string `json:"code,omitempty"`
	Message string `json:"message"`
	Param   string `json:"param,omitempty"`
}

// stripeAnswer is an error answer: its status, its body, and whether a
// retry with the same Idempotency-Key is safe and useful (the
// Stripe-Should-Retry header, which Stripe's clients obey before any rule
// of their own).
type stripeAnswer struct {
	status      int
	body        stripeErrorBody
	shouldRetry bool
	retryAfter  string // Retry-After to keep, if any
}

// write sends the answer as application/json with Stripe-Should-Retry.
func (s stripeAnswer) write(w http.ResponseWriter) {
	h := w.Header()
	h.Set("Stripe-Should-Retry", strconv.FormatBool(s.shouldRetry))
	if s.retryAfter != "" {
		h.Set("Retry-After", s.retryAfter)
	}
	h.Set("Cache-Control", "no-store")
	svc.WriteJSON(w, s.status, struct {
		Error stripeErrorBody `json:"error"`
	}{s.body})
}

// stripeAnswerFor maps one of idem's problems (the middleware's own
// answers: docs/problems.md) to Stripe's error shape:
//
//	request-in-flight (409)        429 invalid_request_error lock_timeout, Stripe-Should-Retry: true, Retry-After kept
//	key-reused (422)               400 idempotency_error, Stripe-Should-Retry: false
//	store-unavailable (503)        503 api_error, Stripe-Should-Retry: true, Retry-After kept
//	transaction-aborted (500)      500 api_error, Stripe-Should-Retry: true (recorded FAILED: the retry runs again)
//	other 5xx                      the same status, api_error, Stripe-Should-Retry: false (no retry cures them)
//	other 4xx                      the same status, invalid_request_error, Stripe-Should-Retry: false
//
// Stripe answers a key reused with other parameters 400 idempotency_error,
// and a request that meets another on the same object 429 lock_timeout,
// which its clients retry after a backoff. stripe-go v82 retries no Stripe
// error but that one (not even a 409 idempotency_key_in_use), so a key in
// flight is answered as a lock timeout.
//
// Unlike Stripe, which saves a 500 under its key, idem records every 5xx
// as FAILED: the retry runs the handler again, with the same relayed key at
// the provider. So a 5xx the handler or idem answers says
// Stripe-Should-Retry: true where a retry can succeed.
func stripeAnswerFor(p idem.Problem) stripeAnswer {
	slug := strings.TrimPrefix(p.Type, idem.ProblemTypeBase)
	message := p.Title
	if p.Detail != "" {
		message = p.Detail
	}
	a := stripeAnswer{status: p.Status, body: stripeErrorBody{Message: message}}
	retryAfter := ""
	if p.RetryAfter > 0 {
		// Whole seconds, rounded up, at least 1 (RFC 9110 section 10.2.3).
		retryAfter = strconv.FormatInt(int64((p.RetryAfter+time.Second-1)/time.Second), 10)
	}
	switch {
	case slug == "request-in-flight":
		a.status = http.StatusTooManyRequests
		a.body.Type, a.body.Code = stripeInvalidRequestError, "lock_timeout"
		a.shouldRetry, a.retryAfter = true, retryAfter
	case slug == "key-reused":
		a.status = http.StatusBadRequest
		a.body.Type = stripeIdempotencyError
	case slug == "outcome-unknown":
		// The charge's outcome cannot be known: Stripe-Should-Retry: false,
		// which stripe-go obeys; an operator resolves it (idem resolve).
		a.body.Type, a.body.Code = stripeAPIError, "outcome_unknown"
	case slug == "store-unavailable", slug == "overloaded":
		a.body.Type = stripeAPIError
		a.shouldRetry, a.retryAfter = true, retryAfter
	case slug == "transaction-aborted":
		a.body.Type = stripeAPIError
		a.shouldRetry = true
	case p.Status >= 500:
		a.body.Type = stripeAPIError
	default:
		a.body.Type = stripeInvalidRequestError
	}
	return a
}

// writeStripeProblem is idem's Options.ProblemWriter on this route: it
// writes idem's own problems in Stripe's error shape (stripeAnswerFor).
func writeStripeProblem(w http.ResponseWriter, _ *http.Request, p idem.Problem) {
	stripeAnswerFor(p).write(w)
}

// paymentIntentJSON is a PaymentIntent as Stripe shows it (the fields
// paymentsd has). paymentsd confirms and charges at creation, so a created
// PaymentIntent is "succeeded", its amount received, its latest_charge the
// provider's charge.
type paymentIntentJSON struct {
	ID             string            `json:"id"`
	Object         string            `json:"object"`
	Amount         int64             `json:"amount"`
	AmountReceived int64             `json:"amount_received"`
	Currency       string            `json:"currency"`
	Customer       string            `json:"customer"`
	Description    *string           `json:"description"`
	Created        int64             `json:"created"`
	Livemode       bool              `json:"livemode"`
	Metadata       map[string]string `json:"metadata"`
	Status         string            `json:"status"`
	LatestCharge   string            `json:"latest_charge"`
}

// paymentIntentInput is a validated POST /v1/payment_intents body.
type paymentIntentInput struct {
	paymentInput
	Metadata map[string]string
}

// stripeRoutes registers POST /v1/payment_intents on routes, protected by
// its own idem middleware on cfg's store, scoped by merchant, whose own
// error answers are Stripe's (Options.ProblemWriter: writeStripeProblem).
// idem echoes the request's Idempotency-Key on every answer, as Stripe does
// (stripe-go reads it into LastResponse.IdempotencyKey).
//
// Its outcome policy is idem.ReleaseValidationFailures: Stripe saves no
// idempotent result for a request whose parameters failed validation, so a
// corrected retry with the same key runs.
func (a *api) stripeRoutes(routes *http.ServeMux, cfg handlerConfig) error {
	store, o := cfg.idemOptions()
	o.Engine.Response.Outcome = idem.ReleaseValidationFailures
	o.ProblemWriter = writeStripeProblem
	mw, err := idem.NewMiddleware(store, o)
	if err != nil {
		return err
	}
	routes.Handle("POST /v1/payment_intents", mw.Handler(http.HandlerFunc(a.createPaymentIntent)))
	routes.Handle("/v1/payment_intents", methodNotAllowed("POST"))
	return nil
}

// createPaymentIntent is POST /v1/payment_intents, under idem's claim: once
// per (merchant, Idempotency-Key). It charges through the provider with
// idem's relayed key and writes the payment (id pi_...) as POST
// /v1/payments does.
func (a *api) createPaymentIntent(w http.ResponseWriter, r *http.Request) {
	ctx := r.Context()
	merchant, _ := service.Merchant(ctx)
	b, err := io.ReadAll(r.Body)
	if err != nil {
		invalidRequest("", "", "the request body could not be read").write(w)
		return
	}
	in, bad := parsePaymentIntent(r.Header.Get("Content-Type"), b)
	if bad != nil {
		bad.write(w)
		return
	}
	relay, err := idem.RelayKey(ctx, RelayStep)
	if err != nil {
		a.log.ErrorContext(ctx, "no relay key", "err", err)
		apiError(http.StatusInternalServerError, "the payment could not be keyed for the provider", false).write(w)
		return
	}
	charge, _, providerErr, err := a.charge(ctx, in.paymentInput, relay, merchant)
	switch {
	case errors.Is(err, idem.ErrOutcomeUnknown):
		a.log.ErrorContext(ctx, "the charge's outcome cannot be known: the payment intent is held for an operator (idem resolve)",
			"merchant", merchant, "relay_key", relay, "err", err)
		apiError(http.StatusConflict, "the charge's outcome cannot be known; do not retry", false).write(w)
		return
	case err == nil && charge.ID == "":
		a.log.ErrorContext(ctx, "the charge step's recorded result has no charge id; the payment intent is not booked", "relay_key", relay)
		apiError(http.StatusInternalServerError, "the recorded charge has no id; ask the operator", false).write(w)
		return
	case err != nil && providerErr == nil:
		a.log.ErrorContext(ctx, "recording the charge", "err", err)
		apiError(http.StatusServiceUnavailable, "the service could not record the charge; retry with the same Idempotency-Key", true).write(w)
		return
	case err != nil:
		a.log.WarnContext(ctx, "payment provider failed", "merchant", merchant, "relay_key", relay, "err", err)
		// idem records a 5xx as FAILED: the retry charges again with the
		// same relayed key, which the provider answers with the same charge.
		status := http.StatusBadGateway
		if errors.Is(err, ErrProviderTimeout) {
			status = http.StatusGatewayTimeout
		}
		apiError(status, "the payment provider did not confirm the charge; retry with the same Idempotency-Key", true).write(w)
		return
	}
	np := in.payment(merchant, charge.ID)
	np.ID = service.NewID("pi")
	p, err := a.store.CreatePayment(ctx, np, a.writeMode)
	if err != nil {
		a.log.ErrorContext(ctx, "database error", "op", "recording the payment intent", "err", err)
		status := http.StatusInternalServerError
		if conflicted(err) {
			status = http.StatusServiceUnavailable // a lost race, not a fault: see conflicted
		}
		apiError(status, "the service failed while recording the payment intent", true).write(w)
		return
	}
	if p.Merchant != merchant || p.Amount != in.Amount || p.Currency != in.Currency {
		a.log.ErrorContext(ctx, "the provider's charge is recorded for another payment", "charge", charge.ID, "payment", p.ID)
		apiError(http.StatusInternalServerError, "the provider's charge is already recorded for another payment", false).write(w)
		return
	}
	pi := paymentIntentJSON{
		ID: p.ID, Object: "payment_intent", Amount: p.Amount, AmountReceived: p.Amount,
		Currency: strings.ToLower(p.Currency), Customer: p.Customer, Created: p.CreatedAt.Unix(),
		Metadata: in.Metadata, Status: "succeeded", LatestCharge: p.ProviderChargeID,
	}
	if p.Description != "" {
		pi.Description = &p.Description
	}
	svc.WriteJSON(w, http.StatusOK, pi)
}

// invalidRequest is a 400 invalid_request_error, never worth a retry with
// the same body.
func invalidRequest(code, param, message string) stripeAnswer {
	return stripeAnswer{status: http.StatusBadRequest,
		body: stripeErrorBody{Type: stripeInvalidRequestError, Code: code, Param: param, Message: message}}
}

// apiError is a server-side api_error.
func apiError(status int, message string, shouldRetry bool) stripeAnswer {
	return stripeAnswer{status: status, body: stripeErrorBody{Type: stripeAPIError, Message: message}, shouldRetry: shouldRetry}
}

// parsePaymentIntent reads a form body: amount, currency, customer,
// description (as POST /v1/payments takes them), metadata[<key>]=<value>
// (Stripe's limits), and confirm (true only: paymentsd confirms at
// creation). The first problem found is answered as Stripe does, naming
// the parameter: code parameter_missing, parameter_unknown or
// parameter_invalid_integer (amount), else none.
func parsePaymentIntent(contentType string, body []byte) (paymentIntentInput, *stripeAnswer) {
	fail := func(code, param, message string) (paymentIntentInput, *stripeAnswer) {
		a := invalidRequest(code, param, message)
		return paymentIntentInput{}, &a
	}
	if mt, params, err := mime.ParseMediaType(contentType); err != nil || mt != mediaForm ||
		(params["charset"] != "" && !strings.EqualFold(params["charset"], "utf-8")) {
		return fail("", "", "send the body as "+mediaForm+" (UTF-8), as Stripe's API takes it")
	}
	fields, err := formFields(body)
	if err != nil {
		return fail("", "", err.Error())
	}
	in := paymentIntentInput{Metadata: map[string]string{}}
	names := make([]string, 0, len(fields))
	for name := range fields {
		names = append(names, name)
	}
	sort.Strings(names)
	for _, name := range names {
		f := fields[name]
		key, isMeta := strings.CutPrefix(name, "metadata[")
		switch {
		case isMeta && strings.HasSuffix(key, "]"):
			key = strings.TrimSuffix(key, "]")
			switch {
			case f.dup:
				return fail("", name, name+" is given more than once")
			case key == "" || utf8.RuneCountInString(key) > MaxMetadataKeyLength:
				return fail("", name, fmt.Sprintf("metadata keys must have 1 to %d characters", MaxMetadataKeyLength))
			case !utf8.ValidString(f.form) || utf8.RuneCountInString(f.form) > MaxMetadataValueLength:
				return fail("", name, fmt.Sprintf("metadata values must be UTF-8 of at most %d characters", MaxMetadataValueLength))
			}
			in.Metadata[key] = f.form
		case name == "metadata" && f.form == "" && !f.dup:
			// Stripe's way of sending no metadata.
		case name == "confirm":
			if f.dup || f.form != "true" {
				return fail("", name, "paymentsd confirms every PaymentIntent at creation: send confirm=true or leave it out")
			}
		default:
			continue
		}
		delete(fields, name)
	}
	if len(in.Metadata) > MaxMetadataKeys {
		return fail("", "metadata", fmt.Sprintf("metadata may have at most %d keys", MaxMetadataKeys))
	}
	p, err := validatePayment(fields)
	var ie *inputError
	if errors.As(err, &ie) && len(ie.Params) > 0 {
		first := ie.Params[0]
		code := ""
		switch {
		case first.Reason == "is required":
			code = "parameter_missing"
		case first.Reason == "is not a known field":
			code = "parameter_unknown"
		case first.Name == "amount":
			code = "parameter_invalid_integer"
		}
		return fail(code, first.Name, first.Name+": "+first.Reason)
	} else if err != nil {
		return fail("", "", err.Error())
	}
	in.paymentInput = p
	return in, nil
}
