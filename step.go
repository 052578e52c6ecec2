package idem

import (
	"context"
	"fmt"
	"time"

	"github.com/idemgo/idem/internal/protocol"
)

// UnknownError is ErrOutcomeUnknown as the execution that made its record
// UNKNOWN sees it: the step, the reason (idemdriver.ReasonStepUncertain,
// ReasonStepUnrecorded, ReasonStepResultUndecodable) and the cause.
type UnknownError = protocol.UnknownError

// StepError is a step's definite error (StepFinal), as recorded: Step
// returns it on the run that recorded it and on every re-execution. Its
// Step is the step's name and Message the error's text; Unwrap gives fn's
// own error on the run that recorded it, nil on a re-execution.
type StepError = protocol.StepError

// StepFinal marks err as a step's definite result (a decline, a refusal):
// it is recorded like a value, and Step returns it, as a *StepError with
// its message, on this run and on every re-execution, without running the
// step again. nil stays nil.
func StepFinal(err error) error { return protocol.StepFinal(err) }

// StepNotApplied marks err as a step that did nothing (the callee answered
// so, or the connection was refused before anything was sent): its start
// is cleared and a re-execution runs it again. nil stays nil.
func StepNotApplied(err error) error { return protocol.StepNotApplied(err) }

// StepOption is an option of Step: AtMostOnce, Reconcile, SettlesWithin.
type StepOption interface{ stepOption() }

type atMostOnce struct{}

func (atMostOnce) stepOption() {}

// AtMostOnce declares a step whose callee has no idempotency (a bank
// transfer file, an SMS, a provider that ignores keys): it never runs twice
// (docs/contract.md sections 11.2 and 11.3).
//
// Without a Reconcile function, a step whose fn returns an uncertain error
// (not StepFinal, not StepNotApplied: a timeout), or that a re-execution
// finds started without a result (its process died), makes the record
// UNKNOWN: Step returns an error matching ErrOutcomeUnknown, and every
// request of the key is answered 409 outcome-unknown, whatever the handler
// writes, until an operator resolves it (`idem resolve`).
//
// With a Reconcile function, such a step is held instead: the execution is
// recorded FAILED whatever the handler answers, and the next re-execution
// (the client's retry, or the completer's re-drive) asks Reconcile what
// became of it, never running fn while the callee cannot tell
// (ErrStepUnreconciled); the completer ends it UNKNOWN once its attempts
// are spent.
//
// fn is called after a renewal of the lease that the store confirms (one
// statement), and its context ends (cause ErrLeaseLost) once a whole lease
// has passed on this process's clock since the store last confirmed one: a
// process paused past its lease and resumed after another took the key
// over does not make the call (docs/contract.md section 11.2, "A stale owner
// does not make the call"). Before a call that takes no context, look at
// fn's own context (its Err reads the clock), not one derived from it
// earlier.
//
// A panic in fn leaves the step started, as an uncertain error does: the
// execution is recorded FAILED, and the next re-execution finds the start
// without a result (Reconcile, or UNKNOWN).
//
// The promise holds within the record's retention: a request after it
// starts a new life. So a completer (package completer) ends UNKNOWN a
// start it cannot re-drive (Do, gRPC) shortly before its record expires;
// without one, such a record expires as any other.
func AtMostOnce() StepOption { return atMostOnce{} }

type reconcile[T any] struct {
	f func(ctx context.Context, relayKey string) (T, error)
}

func (reconcile[T]) stepOption() {}

// Reconcile gives an at-most-once step (AtMostOnce) a function that asks
// the callee what became of an earlier start whose result was not
// recorded (a timeout, a crash), given the step's relayed key (the
// reference the first run sent): its result when the effect happened (a
// value, or StepFinal(err)), StepNotApplied(err) when it did not and no
// longer can (the step then runs; see SettlesWithin for a callee that may
// still act on a call its caller gave up on), or any other error while the
// callee cannot tell (Step returns ErrStepUnreconciled and a later
// re-execution asks again). T must be the step's result type. Without
// AtMostOnce it is never called.
func Reconcile[T any](f func(ctx context.Context, relayKey string) (T, error)) StepOption {
	return reconcile[T]{f}
}

type settlesWithin time.Duration

func (settlesWithin) stepOption() {}

// SettlesWithin says that the step's callee may still act on a call up to
// d after it was sent, its caller gone (a bank that queues a transfer
// before it shows up): a Reconcile function's not-applied answer is then
// believed only once the earlier start is at least d old, on the
// database's clock at this execution's claim; before that it counts as
// "cannot tell" (ErrStepUnreconciled: the step is held, never run, and a
// later re-execution asks again). An applied answer is believed at once.
// Held re-executions count towards the completer's MaxAttempts: size it
// and its Grace to outlast d (docs/contract.md section 11.2). Not
// negative. Default: 0 (a not-applied answer is believed at once).
func SettlesWithin(d time.Duration) StepOption { return settlesWithin(d) }

// Step runs fn as the external step name of the execution under ctx (a
// handler's or Do's fn's context) and returns its result (docs/contract.md
// section 11.1):
//   - before fn runs, a start marker is committed for (record life, name),
//     fenced by the execution's token and carrying the step's relayed key;
//   - fn runs on ctx; RelayKey(ctx, name) is the key to send the callee;
//   - the result is committed as soon as fn returns (first writer wins), and
//     a re-execution of the record's life (a retry after FAILED, a takeover)
//     gets it back without running fn.
//
// fn's error says what happened: StepFinal(err) is a definite result,
// recorded (returned as a *StepError); StepNotApplied(err) clears the start,
// and fn may run again; any other error leaves the step started: the effect
// may have happened, and a re-execution runs fn again under the same
// relayed key, for the callee to deduplicate. An AtMostOnce step is never
// run again: see AtMostOnce and Reconcile.
//
// name is 1 to 128 bytes of visible ASCII, stable across deploys and unique
// within the execution (a step in a loop carries its index or item's id:
// "refund/3"). The code between steps must be deterministic for one
// request. T is recorded as JSON (encoding/json), sealed with the record's
// keys when sealing is on.
//
// Errors besides fn's: ErrNoExecution, ErrStepName, ErrStepNotAllowed (also
// when the store's schema predates steps: apply its migrations),
// ErrStepRepeated, ErrExecutionEnded, ErrLeaseLost (another worker owns the
// record), ErrStepNotRecorded, ErrStepUnreconciled, ErrOutcomeUnknown (the record is UNKNOWN
// now; a result that no longer decodes makes it so too, and matches
// ErrStepResultUndecodable), ErrSealKeyMissing, ErrSealBroken, a
// *StoreError; a result fn returns that JSON cannot encode is an error too,
// and the step stays started.
func Step[T any](ctx context.Context, name string, fn func(context.Context) (T, error), opts ...StepOption) (T, error) {
	var zero T
	e, ok := protocol.FromContext(ctx)
	if !ok {
		return zero, ErrNoExecution
	}
	relay, err := RelayKey(ctx, name)
	if err != nil {
		return zero, err
	}
	var once bool
	var check func(context.Context) (T, error)
	var settle time.Duration
	for _, o := range opts {
		switch o := o.(type) {
		case atMostOnce:
			once = true
		case reconcile[T]:
			check = func(ctx context.Context) (T, error) { return o.f(ctx, relay) }
		case settlesWithin:
			if o < 0 {
				return zero, fmt.Errorf("idem: step %q: SettlesWithin %s is negative", name, time.Duration(o))
			}
			settle = time.Duration(o)
		default:
			return zero, fmt.Errorf("idem: step %q: %T is not an option of a step of %T (Reconcile's type must be the step's)", name, o, zero)
		}
	}
	return protocol.RunStep(e, name, relay, fn, check, once, settle)
}

// EncodeStepResult encodes v, a step's result, as Step records it: JSON in
// a versioned envelope. An operator's resolution of an UNKNOWN record
// (`idem resolve --applied`, idemdriver.Stepper.ResolveStep) records it,
// sealed with the record's keys when sealing is on (seal.Keyring.SealStep).
// Errors: encoding/json's.
func EncodeStepResult(v any) ([]byte, error) { return protocol.EncodeStepResult(v) }
