package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/google/uuid"

	"github.com/idemgo/idem"
	"github.com/idemgo/idem/cmd/internal/service"
)

// RelayStep names the provider call in the relayed key:
// idem.RelayKey(ctx, RelayStep) = idem.DeriveKey(--relay-secret, merchant,
// Idempotency-Key, the record's created_at, RelayStep).
const RelayStep = "charge"

// ChargeRequest is one charge sent to the payment provider.
type ChargeRequest struct {
	// IdempotencyKey is the key the provider deduplicates on:
	// idem.RelayKey(ctx, RelayStep), derived from the claim's scope (the
	// merchant), Idempotency-Key and record's created_at, so a re-execution after a failure, a
	// crash or a takeover asks for the same charge again, and the client's
	// raw key never leaves this service (CONTRACT section 7).
	IdempotencyKey string
	Merchant       string
	Amount         int64  // minor units, > 0
	Currency       string // ISO 4217, upper case
	Customer       string
	Description    string
}

// Charge is the provider's answer to a successful ChargeRequest.
type Charge struct {
	ID string // ch_<uuid>
	// Replayed is true when the provider answered with a charge it had
	// already made for this IdempotencyKey.
	Replayed bool
}

// Provider charges customers through a payment service provider (PSP).
// Charge must respect ctx: idem cancels it when the execution loses its lease.
// An error means no charge is known to have been made; the API answers 502
// (504 for ErrProviderTimeout) and idem records the attempt as FAILED, so a
// retry with the same Idempotency-Key runs again, with the same
// ChargeRequest.IdempotencyKey.
type Provider interface {
	Charge(ctx context.Context, req ChargeRequest) (Charge, error)
}

// ErrProviderUnavailable is the error of a charge the provider did not
// confirm: it refused it, failed, or could not be reached.
var ErrProviderUnavailable = errors.New("payment provider unavailable")

// ErrProviderTimeout is the error of a charge whose answer did not arrive in
// time: the outcome is unknown (the provider may have charged). Only a retry
// with the same IdempotencyKey can tell, and it cannot charge twice.
var ErrProviderTimeout = errors.New("payment provider timed out")

// ProviderError is a provider's non-success answer. It wraps
// ErrProviderUnavailable.
type ProviderError struct {
	Status int    // the provider's HTTP status
	Type   string // its problem type, when it sent problem details
	Detail string
	// RetryAfter is the provider's Retry-After, zero when absent.
	RetryAfter time.Duration
}

// NotCharged reports whether the answer says that nothing was charged: a
// refusal (4xx), or the provider's own problem document with 503 (cmd/fakepsp
// answers 503 only before it charges). Any other answer, a gateway's 502 or
// 504 among them (its upstream may have charged, and the answer been cut),
// leaves the outcome uncertain.
func (e *ProviderError) NotCharged() bool {
	return e.Status >= 400 && e.Status < 500 || e.Status == http.StatusServiceUnavailable && e.Type != ""
}

func (e *ProviderError) Error() string {
	s := fmt.Sprintf("payment provider answered %d", e.Status)
	if e.Type != "" {
		s += " " + e.Type
	}
	if e.Detail != "" {
		s += ": " + e.Detail
	}
	if e.RetryAfter > 0 {
		s += fmt.Sprintf(" (Retry-After %s)", e.RetryAfter)
	}
	return s
}

// Unwrap returns ErrProviderUnavailable.
func (e *ProviderError) Unwrap() error { return ErrProviderUnavailable }

// FakeProvider is an in-process Provider: it waits Latency (or until ctx is
// done), then returns a new charge id. Like a real PSP it deduplicates on
// ChargeRequest.IdempotencyKey: the same key returns the same charge. It
// forgets everything when the process exits; cmd/fakepsp (--psp-url) does not.
type FakeProvider struct {
	// Latency is how long every charge takes. Zero answers at once.
	Latency time.Duration

	mu      sync.Mutex
	charges map[string]Charge
	calls   int
}

// NewFakeProvider returns a FakeProvider that answers after latency.
func NewFakeProvider(latency time.Duration) *FakeProvider {
	return &FakeProvider{Latency: latency, charges: map[string]Charge{}}
}

// Charge implements Provider.
func (p *FakeProvider) Charge(ctx context.Context, req ChargeRequest) (Charge, error) {
	p.mu.Lock()
	p.calls++
	p.mu.Unlock()
	if p.Latency > 0 {
		t := time.NewTimer(p.Latency)
		defer t.Stop()
		select {
		case <-ctx.Done():
			return Charge{}, fmt.Errorf("charge: %w", context.Cause(ctx))
		case <-t.C:
		}
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if req.IdempotencyKey != "" {
		if ch, ok := p.charges[req.IdempotencyKey]; ok {
			ch.Replayed = true
			return ch, nil
		}
	}
	ch := Charge{ID: "ch_" + uuid.NewString()}
	if req.IdempotencyKey != "" {
		p.charges[req.IdempotencyKey] = ch
	}
	return ch, nil
}

// Calls returns how many times Charge was called.
func (p *FakeProvider) Calls() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.calls
}

// Charges returns how many distinct charges were made (calls with the same
// IdempotencyKey make one).
func (p *FakeProvider) Charges() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return len(p.charges)
}

// maxProviderResponse bounds the provider's answer read by HTTPProvider.
const maxProviderResponse = 1 << 20

// HTTPProvider charges through the HTTP API that cmd/fakepsp serves (shaped
// like Stripe's): POST {BaseURL}/v1/charges with a JSON body {amount,
// currency, customer, description}, "Authorization: Bearer
// sk_test_<merchant>" (each merchant of paymentsd has its own account at the
// provider) and "Idempotency-Key: <ChargeRequest.IdempotencyKey>". 200 or 201
// with {"id":"ch_..."} is a charge (Idempotent-Replayed: true marks the
// provider's replay of an earlier one); any other answer is a
// *ProviderError; no answer within Client.Timeout is ErrProviderTimeout.
type HTTPProvider struct {
	// BaseURL is the provider's root, for example http://127.0.0.1:8090.
	BaseURL string
	// Client sends the requests; its Timeout bounds each charge (--psp-timeout).
	Client *http.Client
}

// NewHTTPProvider returns an HTTPProvider on baseURL whose charges time out
// after timeout. It follows no redirects.
func NewHTTPProvider(baseURL string, timeout time.Duration) *HTTPProvider {
	tr := http.DefaultTransport.(*http.Transport).Clone()
	tr.MaxIdleConnsPerHost = 64
	return &HTTPProvider{
		BaseURL: strings.TrimRight(baseURL, "/"),
		Client: &http.Client{
			Transport:     tr,
			Timeout:       timeout,
			CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse },
		},
	}
}

// Charge implements Provider. It refuses to send a charge without an
// IdempotencyKey: a charge that cannot be deduplicated cannot be retried.
func (p *HTTPProvider) Charge(ctx context.Context, cr ChargeRequest) (Charge, error) {
	if cr.IdempotencyKey == "" {
		return Charge{}, errors.New("charge: no idempotency key to relay")
	}
	body := map[string]any{"amount": cr.Amount, "currency": cr.Currency, "customer": cr.Customer}
	if cr.Description != "" {
		body["description"] = cr.Description
	}
	b, err := json.Marshal(body)
	if err != nil {
		return Charge{}, err
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, p.BaseURL+"/v1/charges", bytes.NewReader(b))
	if err != nil {
		return Charge{}, err
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Authorization", "Bearer "+service.APIKeyPrefix+cr.Merchant)
	req.Header.Set(idem.HeaderKey, cr.IdempotencyKey)
	resp, err := p.Client.Do(req)
	if err != nil {
		return Charge{}, transportError(err)
	}
	b, err = io.ReadAll(io.LimitReader(resp.Body, maxProviderResponse))
	// The answer is read, or reading it failed: closing only releases the
	// connection, and its error changes nothing about the charge.
	_ = resp.Body.Close()
	if err != nil {
		return Charge{}, transportError(err)
	}
	if resp.StatusCode != http.StatusCreated && resp.StatusCode != http.StatusOK {
		pe := &ProviderError{Status: resp.StatusCode}
		var prob struct{ Type, Detail string }
		if json.Unmarshal(b, &prob) == nil {
			pe.Type, pe.Detail = prob.Type, prob.Detail
		}
		if s, err := strconv.Atoi(resp.Header.Get("Retry-After")); err == nil && s > 0 {
			pe.RetryAfter = time.Duration(s) * time.Second
		}
		return Charge{}, pe
	}
	var ch struct {
		ID string `json:"id"`
	}
	if err := json.Unmarshal(b, &ch); err != nil || !strings.HasPrefix(ch.ID, "ch_") {
		return Charge{}, fmt.Errorf("%w: answered %d without a charge id", ErrProviderUnavailable, resp.StatusCode)
	}
	return Charge{ID: ch.ID, Replayed: resp.Header.Get(idem.HeaderReplayed) == "true"}, nil
}

// transportError classifies an error of sending a charge or reading its
// answer: a timeout leaves the outcome unknown (ErrProviderTimeout).
func transportError(err error) error {
	var ne net.Error
	if errors.Is(err, context.DeadlineExceeded) || errors.As(err, &ne) && ne.Timeout() {
		return fmt.Errorf("%w: %v", ErrProviderTimeout, err)
	}
	return fmt.Errorf("%w: %v", ErrProviderUnavailable, err)
}
