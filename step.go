package idem

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"

	"github.com/idemgo/idem/internal/protocol"
)

// The errors of Step (docs/contract.md section 11).
var (
	// ErrStepNotAllowed: Step cannot run here, before fn ran: in one-commit
	// mode, on SQLite once the claim's transaction was begun (idem.Tx), or
	// on a store that keeps no steps (idempgx on a partitioned table).
	ErrStepNotAllowed = protocol.ErrStepNotAllowed
	// ErrStepRepeated: a step name met twice in one execution.
	ErrStepRepeated = protocol.ErrStepRepeated
	// ErrStepName: a step name that is not 1 to 128 bytes of visible ASCII.
	ErrStepName = protocol.ErrStepName
	// ErrStepStarted is ReleaseKey's error once a step of the record's life
	// has started: a released key starts a new life, which relays a new
	// key, and the callee would apply the effect twice.
	ErrStepStarted = protocol.ErrStepStarted
	// ErrStepNotRecorded: fn returned, its result could not be recorded (the
	// store failed). The step stays started: answer a 5xx, and the retry
	// runs it again under the same relayed key.
	ErrStepNotRecorded = protocol.ErrStepNotRecorded
	// ErrStepResultUndecodable: the recorded result does not decode into
	// the step's type (it changed incompatibly between deploys). The step
	// is never run again for it: answer a 5xx; an operator decides.
	ErrStepResultUndecodable = errors.New("idem: the step's recorded result does not decode into its type")
)

// stepVersion versions the encoding of a recorded result.
const stepVersion = 1

// stepRecord is a recorded result: a value, or a definite error's message.
type stepRecord struct {
	V     int             `json:"v"`
	Value json.RawMessage `json:"value,omitempty"`
	Error *string         `json:"error,omitempty"`
}

// StepError is a step's definite error (StepFinal), as recorded: Step
// returns it on the run that recorded it and on every re-execution.
type StepError struct {
	Step    string // the step's name
	Message string // the error's text, as recorded
	err     error  // fn's error, on the run that recorded it only
}

func (e *StepError) Error() string { return e.Message }

// Unwrap returns fn's own error on the run that recorded it; nil on a
// re-execution, which has only the recorded message.
func (e *StepError) Unwrap() error { return e.err }

// stepEnd marks fn's error with how the step ended.
type stepEnd struct {
	err error
	end protocol.StepEnd
}

func (e *stepEnd) Error() string { return e.err.Error() }
func (e *stepEnd) Unwrap() error { return e.err }

// StepFinal marks err as a step's definite result (a decline, a refusal):
// it is recorded like a value, and Step returns it, as a *StepError with
// its message, on this run and on every re-execution, without running the
// step again. nil stays nil.
func StepFinal(err error) error {
	if err == nil {
		return nil
	}
	return &stepEnd{err: err, end: protocol.StepDone}
}

// StepNotApplied marks err as a step that did nothing (the callee answered
// so, or the connection was refused before anything was sent): its start
// is cleared and a re-execution runs it again. nil stays nil.
func StepNotApplied(err error) error {
	if err == nil {
		return nil
	}
	return &stepEnd{err: err, end: protocol.StepNotApplied}
}

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
// relayed key, for the callee to deduplicate.
//
// name is 1 to 128 bytes of visible ASCII, stable across deploys and unique
// within the execution (a step in a loop carries its index or item's id:
// "refund/3"). The code between steps must be deterministic for one
// request. T is recorded as JSON (encoding/json), sealed with the record's
// keys when sealing is on.
//
// Errors besides fn's: ErrNoExecution, ErrStepName, ErrStepNotAllowed,
// ErrStepRepeated, ErrExecutionEnded, ErrLeaseLost (another worker owns the
// record), ErrStepNotRecorded, ErrStepResultUndecodable, ErrSealKeyMissing,
// ErrSealBroken, a *StoreError; a result fn returns that JSON cannot encode
// is an error too, and the step stays started.
func Step[T any](ctx context.Context, name string, fn func(context.Context) (T, error)) (T, error) {
	var zero T
	e, ok := protocol.FromContext(ctx)
	if !ok {
		return zero, ErrNoExecution
	}
	relay, err := RelayKey(ctx, name)
	if err != nil {
		return zero, err
	}
	var fnErr error
	stored, err := e.Step(name, relay, func(ctx context.Context) ([]byte, protocol.StepEnd, error) {
		v, err := fn(ctx)
		var marked *stepEnd
		switch {
		case errors.As(err, &marked) && marked.end == protocol.StepDone:
			fnErr = marked.err
			msg := marked.err.Error()
			b, jerr := json.Marshal(stepRecord{V: stepVersion, Error: &msg})
			return b, protocol.StepDone, jerr
		case errors.As(err, &marked):
			return nil, marked.end, marked.err
		case err != nil:
			return nil, protocol.StepUncertain, err
		}
		value, err := json.Marshal(v)
		if err != nil {
			return nil, protocol.StepUncertain, fmt.Errorf("idem: step %q: its result does not encode as JSON: %w", name, err)
		}
		b, err := json.Marshal(stepRecord{V: stepVersion, Value: value})
		return b, protocol.StepDone, err
	})
	if err != nil {
		return zero, err
	}
	return decodeStep[T](name, stored, fnErr)
}

// decodeStep decodes a recorded result; fnErr is fn's definite error when
// this run recorded it.
func decodeStep[T any](name string, stored []byte, fnErr error) (T, error) {
	var zero T
	var rec stepRecord
	if err := json.Unmarshal(stored, &rec); err != nil || rec.V != stepVersion {
		return zero, fmt.Errorf("%w: step %q: encoding version %d: %v", ErrStepResultUndecodable, name, rec.V, err)
	}
	if rec.Error != nil {
		if fnErr != nil && fnErr.Error() != *rec.Error {
			fnErr = nil // another writer's result was kept
		}
		return zero, &StepError{Step: name, Message: *rec.Error, err: fnErr}
	}
	var v T
	if err := json.Unmarshal(rec.Value, &v); err != nil {
		return zero, fmt.Errorf("%w: step %q: %w", ErrStepResultUndecodable, name, err)
	}
	return v, nil
}
