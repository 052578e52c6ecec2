package idem

import (
	"context"
	"fmt"
	"time"
)

// Observer receives one Event per request that reached the claim (or Do
// call). Observe runs on the request's goroutine after the answer is written:
// keep it short. ctx is the request's, not cancelled by idem. The events are
// listed in docs/observability.md.
type Observer interface {
	Observe(ctx context.Context, e Event)
}

// ObserverFunc adapts a function to Observer.
type ObserverFunc func(ctx context.Context, e Event)

// Observe calls f(ctx, e).
func (f ObserverFunc) Observe(ctx context.Context, e Event) { f(ctx, e) }

// EventKind names the decision an Event reports.
type EventKind int

const (
	// EventExecuted: the handler ran and its outcome was recorded.
	EventExecuted EventKind = iota + 1
	// EventReplayed: the stored response was replayed.
	EventReplayed
	// EventInFlight: 409 request-in-flight.
	EventInFlight
	// EventKeyReused: 422 key-reused.
	EventKeyReused
	// EventReleased: the handler ran and its record was removed.
	EventReleased
	// EventTakenOver: as EventExecuted, after taking over an expired lease: a
	// re-execution that may reach a provider twice (CONTRACT section 7).
	EventTakenOver
	// EventLeaseLost: fenced out; the outcome was not recorded.
	EventLeaseLost
	// EventStoreUnavailable: the store did not answer (503).
	EventStoreUnavailable
	// EventCompletionFailed: recording the outcome failed (503).
	EventCompletionFailed
	// EventOverloaded: refused before the claim, EngineOptions.Admission.MaxInFlight
	// executions being in flight (503); nothing claimed or run.
	EventOverloaded
	// EventOutcomeUnknown: 409 outcome-unknown: the record is UNKNOWN, made
	// so by this execution (Event.Attempt > 0 and the handler ran) or found
	// so (docs/contract.md section 11.3).
	EventOutcomeUnknown
)

var eventNames = [...]string{"", "executed", "replayed", "in_flight", "key_reused", "released", "taken_over",
	"lease_lost", "store_unavailable", "completion_failed", "overloaded", "outcome_unknown"}

// String returns the kind's snake_case name.
func (k EventKind) String() string {
	if k <= 0 || int(k) >= len(eventNames) {
		return fmt.Sprintf("EventKind(%d)", int(k))
	}
	return eventNames[k]
}

// Event is one decision. Route and Method are bounded; Scope and Key are not.
type Event struct {
	Kind EventKind
	// Route is the path template of the ServeMux pattern, without its method
	// and host ("/v1/payments/{id}": OpenTelemetry's http.route), replays
	// included; else Options.Route's, else ""; never the raw path. For Do,
	// DoParams.Route.
	Route string
	// Method is the request's method (DoParams.Method for Do).
	Method string
	// Scope and Key name the record: high cardinality, not for metrics. Key
	// is the stored key: the client's, or its hash with
	// EngineOptions.Sealing.KeyHashSecret (Engine.StoredKey).
	Scope, Key string
	// Attempt is the record's attempts after this claim (for a lost claim, the
	// record's); 0 when the claim failed.
	Attempt int
	// Status is the HTTP status sent (Do: the Result's); 0 after a re-raised panic.
	Status int
	// Outcome is how the execution was recorded.
	Outcome Outcome
	// Cached reports an answer from the replay cache.
	Cached bool
	// Claim is how long the claim took, in one-commit mode with the wait for the key.
	Claim time.Duration
	// Handler is how long the handler (or Do's fn) ran; 0 when it did not.
	Handler time.Duration
	// Completion is how long recording the outcome took; 0 when nothing was.
	Completion time.Duration
	// Err is the cause behind EventLeaseLost, EventStoreUnavailable,
	// EventCompletionFailed or a FAILED EventExecuted, or Do's fn error.
	Err error
}
