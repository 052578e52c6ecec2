package protocol

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
)

// ErrStepResultUndecodable: a recorded result does not decode into the
// step's type (idem.ErrStepResultUndecodable).
var ErrStepResultUndecodable = errors.New("idem: the step's recorded result does not decode into its type")

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
// (idem.Step documents both).
func RunStep[T any](e *Execution, name, relay string, fn func(context.Context) (T, error)) (T, error) {
	var fnErr error
	stored, err := e.step(name, relay, func(ctx context.Context) ([]byte, stepEnd, error) {
		v, err := fn(ctx)
		var marked *endedError
		switch {
		case errors.As(err, &marked) && marked.end == stepDone:
			fnErr = marked.err
			msg := marked.err.Error()
			b, jerr := json.Marshal(stepRecord{V: stepVersion, Error: &msg})
			return b, stepDone, jerr
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
	})
	if err != nil {
		var zero T
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
