package idem

import (
	"context"
	"fmt"
	"time"
)

// Observer receives one Event per decision idem makes for a protected
// request (or a Do call): exactly one per request that reached the claim.
// Requests refused before the claim (a missing or malformed key, no scope,
// a body too large) and requests passed through unprotected emit nothing.
//
// Observe runs on the request's goroutine once the answer is written (for a
// panicking handler, before the panic is raised again): keep it short and
// never block in it. ctx is the
// request's context (for trace and span ids), not cancelled by idem. Set it
// with Config.Observer; nil means none, and no event is built. The events
// and their fields are listed in docs/observability.md.
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
	// EventExecuted: the request won a claim (a new record, a new life, or a
	// re-claim of FAILED), its handler ran, and its outcome was recorded as
	// Event.Outcome says (Succeeded or Failed; FAILED also after a panic, a
	// timeout past MaxExecution or an aborted transaction answered 2xx).
	EventExecuted EventKind = iota + 1
	// EventReplayed: the same request already SUCCEEDED: its stored
	// response was replayed (also when its body was not stored: 410
	// response-not-stored, or is missing: 500 response-missing). The handler
	// did not run.
	EventReplayed
	// EventInFlight: the same request runs elsewhere under a live lease: 409
	// request-in-flight with Retry-After. The handler did not run.
	EventInFlight
	// EventKeyReused: the key names another request (method, path or
	// fingerprint differ): 422 key-reused. The handler did not run.
	EventKeyReused
	// EventReleased: the handler ran and its record was removed (the
	// Released outcome, or ReleaseKey): the next request with the key runs
	// as a new one.
	EventReleased
	// EventTakenOver: as EventExecuted, for an execution that took over a
	// PROCESSING record whose lease had run out (its worker died or
	// stalled): a re-execution whose side effects may have reached a
	// provider once already (under the same relayed key, CONTRACT section
	// 7). Count these: each one is a re-execution sent to the provider.
	EventTakenOver
	// EventLeaseLost: the execution was fenced out (its lease ran out and
	// another worker took the key over): its outcome was not recorded, its
	// caller got 409 request-in-flight.
	EventLeaseLost
	// EventStoreUnavailable: the store did not answer: the claim failed
	// (the handler did not run), or the lease could not be renewed while
	// the handler ran (its outcome was not recorded). 503 store-unavailable.
	EventStoreUnavailable
	// EventCompletionFailed: the handler ran but recording its outcome
	// failed (the completion, its COMMIT, or a release): 503
	// store-unavailable; Event.Err says why.
	EventCompletionFailed
)

var eventNames = [...]string{"", "executed", "replayed", "in_flight", "key_reused", "released", "taken_over",
	"lease_lost", "store_unavailable", "completion_failed"}

// String returns the kind's name as metrics and logs spell it: executed,
// replayed, in_flight, key_reused, released, taken_over, lease_lost,
// store_unavailable, completion_failed.
func (k EventKind) String() string {
	if k <= 0 || int(k) >= len(eventNames) {
		return fmt.Sprintf("EventKind(%d)", int(k))
	}
	return eventNames[k]
}

// Event is one decision for one protected request. Route and Method are
// bounded in cardinality (safe as metric attributes); Scope and Key are not
// (use them in logs or spans, never as metric attributes).
type Event struct {
	Kind EventKind
	// Route names the route: the request's ServeMux pattern (r.Pattern, as
	// the handler's ServeMux set it, e.g. "POST /v1/payments/{id}"), else
	// Config.Route's answer, else "". Never the raw path (unbounded
	// cardinality). For Do it is DoParams.Route.
	Route string
	// Method is the request's method (DoParams.Method for Do).
	Method string
	// Scope and Key name the record. High cardinality: not for metrics.
	Scope, Key string
	// Attempt is the record's attempts count after this request's claim:
	// 1 on a first execution, more after a re-claim or a takeover; for a
	// request that did not win the claim, the attempts of the record it
	// lost to. 0 when the claim itself failed.
	Attempt int
	// Status is the HTTP status idem sent (or, for Do, the Result's status
	// recorded or replayed; 0 when Do returned an error without a result).
	// 0 too when a panicking handler's panic was re-raised.
	Status int
	// Outcome is how the execution was recorded (Succeeded, Failed or
	// Released) for EventExecuted, EventTakenOver and EventReleased; zero
	// (Succeeded) otherwise, meaningless there.
	Outcome Outcome
	// Cached reports an answer (EventReplayed or EventKeyReused) from the
	// replay cache (Config.ReplayCacheBytes): no claim ran, Claim is 0.
	Cached bool
	// Claim is how long the claim statement took (0 when it did not run);
	// in the one-commit mode, with the wait for the key (OneCommitWait).
	Claim time.Duration
	// Handler is how long the handler (or Do's fn) ran; 0 when it did not.
	Handler time.Duration
	// Completion is how long recording the outcome took (completion and
	// COMMIT, a FAILED mark or a release); 0 when nothing was recorded.
	Completion time.Duration
	// Err is the cause behind EventStoreUnavailable, EventCompletionFailed
	// and EventLeaseLost (a *StoreError, ErrLeaseLost), behind a FAILED
	// EventExecuted recorded for a timeout or an aborted transaction
	// (ErrExecutionTimeout, ErrTxAborted), or the error Do's fn returned;
	// nil otherwise.
	Err error
}
