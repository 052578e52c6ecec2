package protocol

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/idemgo/idem/idemdriver"
)

// stepVersion versions the encoding of a recorded result.
const stepVersion = 1

// stepRecord is a recorded result: a value, or a definite error's message.
type stepRecord struct {
	V     int             `json:"v"`
	Value json.RawMessage `json:"value,omitempty"`
	Error *string         `json:"error,omitempty"`
}

// StepError is a step's definite error as recorded (idem.StepError).
type StepError struct {
	Step    string // the step's name
	Message string // the error's text, as recorded
	err     error  // fn's error, on the run that recorded it only
}

func (e *StepError) Error() string { return e.Message }

// Unwrap returns fn's own error on the run that recorded it; nil on a
// re-execution, which has only the recorded message.
func (e *StepError) Unwrap() error { return e.err }

// endedError marks fn's error with how the step ended.
type endedError struct {
	err error
	end stepEnd
}

func (e *endedError) Error() string { return e.err.Error() }
func (e *endedError) Unwrap() error { return e.err }

// StepFinal marks err as a definite result (idem.StepFinal); nil stays nil.
func StepFinal(err error) error { return ended(err, stepDone) }

// StepNotApplied marks err as a step that did nothing
// (idem.StepNotApplied); nil stays nil.
func StepNotApplied(err error) error { return ended(err, stepNotApplied) }

func ended(err error, end stepEnd) error {
	if err == nil {
		return nil
	}
	return &endedError{err: err, end: end}
}

// RunStep runs fn as the step name of e (Execution.step) with T recorded
// as JSON in a versioned envelope, and returns the recorded T or error
// (idem.Step documents both). An at-most-once step (atMostOnce) asks
// reconcile (nil: none) what became of an earlier start, and believes a
// not-applied answer only about a start at least settle old; a recorded
// result that no longer decodes makes the record UNKNOWN.
func RunStep[T any](e *Execution, name, relay string, fn, reconcile func(context.Context) (T, error), atMostOnce bool, settle time.Duration) (T, error) {
	var zero T
	var fnErr error // a definite error (StepFinal) recorded by this run
	o := StepOptions{AtMostOnce: atMostOnce, Settle: settle}
	if reconcile != nil && atMostOnce {
		o.Reconcile = encodeStep(name, reconcile, &fnErr)
	}
	stored, err := e.step(name, relay, encodeStep(name, fn, &fnErr), o)
	if err != nil {
		return zero, err
	}
	v, err := decodeStep[T](name, stored, fnErr)
	if errors.Is(err, ErrStepResultUndecodable) {
		st, _ := e.cfg.Store.(idemdriver.Stepper) // step ran: the store has steps
		if uerr := e.markUnknown(st, e.stepParams(name), idemdriver.ReasonStepResultUndecodable, err); !errors.Is(uerr, ErrOutcomeUnknown) {
			return zero, fmt.Errorf("%w (%w)", err, uerr)
		}
		return zero, &UnknownError{Step: name, Reason: idemdriver.ReasonStepResultUndecodable, Err: err}
	}
	return v, err
}

// encodeStep runs f and encodes how it ended: a value or a definite error
// (StepFinal, whose own error goes to *final) is a result to record;
// StepNotApplied and any other error are not.
func encodeStep[T any](name string, f func(context.Context) (T, error), final *error) stepFunc {
	return func(ctx context.Context) ([]byte, stepEnd, error) {
		v, err := f(ctx)
		var marked *endedError
		switch {
		case errors.As(err, &marked) && marked.end == stepDone:
			msg := marked.err.Error()
			b, jerr := json.Marshal(stepRecord{V: stepVersion, Error: &msg})
			if jerr != nil {
				return nil, stepUncertain, jerr
			}
			*final = marked.err
			return b, stepDone, nil
		case errors.As(err, &marked):
			return nil, marked.end, marked.err
		case err != nil:
			return nil, stepUncertain, err
		}
		value, err := json.Marshal(v)
		if err != nil {
			return nil, stepUncertain, fmt.Errorf("idem: step %q: its result does not encode as JSON: %w", name, err)
		}
		b, err := json.Marshal(stepRecord{V: stepVersion, Value: value})
		return b, stepDone, err
	}
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

// EncodeStepResult encodes v as a step's recorded result (idem.EncodeStepResult).
func EncodeStepResult(v any) ([]byte, error) {
	value, err := json.Marshal(v)
	if err != nil {
		return nil, err
	}
	return json.Marshal(stepRecord{V: stepVersion, Value: value})
}
