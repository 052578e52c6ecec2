package main

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/google/uuid"

	"github.com/idemgo/idem"
)

// ChargeRequest is one charge sent to the payment provider.
type ChargeRequest struct {
	// IdempotencyKey is the key the provider deduplicates on: derived from
	// the claim's scope and Idempotency-Key (see relayKey), so a re-execution
	// after a failure or a takeover asks for the same charge again, and the
	// client's raw key never leaves this service (CONTRACT section 7).
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
}

// Provider charges customers through a payment service provider (PSP).
// Charge must respect ctx: idem cancels it when the execution loses its lease.
// An error means no charge is known to have been made; the API answers 502
// and idem records the attempt as FAILED, so a retry with the same
// Idempotency-Key runs again (with the same ChargeRequest.IdempotencyKey).
type Provider interface {
	Charge(ctx context.Context, req ChargeRequest) (Charge, error)
}

// ErrProviderUnavailable is the fake provider's error when it is configured
// to fail.
var ErrProviderUnavailable = errors.New("payment provider unavailable")

// FakeProvider is an in-process Provider: it waits Latency (or until ctx is
// done), then returns a new charge id. Like a real PSP it deduplicates on
// ChargeRequest.IdempotencyKey: the same key returns the same charge.
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

// relayKey derives the provider's idempotency key for one step of a
// protected execution from (scope, Idempotency-Key, step): stable across
// retries and takeovers of the same key, different for every scope and step,
// and not the client's raw key (CONTRACT section 7). The second result is
// false outside a protected execution.
func relayKey(ctx context.Context, step string) (string, bool) {
	e, ok := idem.ExecutionFromContext(ctx)
	if !ok {
		return "", false
	}
	h := sha256.New()
	for _, part := range []string{"paymentsd", e.Scope, e.Key, step} {
		fmt.Fprintf(h, "%d:%s", len(part), part)
	}
	return "idem_" + hex.EncodeToString(h.Sum(nil)), true
}
