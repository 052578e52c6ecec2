package idemgrpc

import (
	"context"
	"errors"
	"strconv"
	"strings"
	"time"

	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/idemgo/idem"
)

// DefaultOutcome is the default outcome policy (WithOutcome): the codes a
// retry may cure are recorded FAILED, so the retry runs again: Canceled,
// Unknown (a plain Go error), DeadlineExceeded, ResourceExhausted, Aborted,
// Unimplemented, Internal, Unavailable and DataLoss, the 5xx, 408 and 429 of
// CONTRACT section 5 in gRPC's words. Every other code, OK included, is an
// outcome: recorded SUCCEEDED and replayed. AlreadyExists is an outcome here,
// unlike with idemconnect.Outcome, which cannot tell it from Aborted (both
// are HTTP 409 in the Connect protocol).
func DefaultOutcome(code codes.Code) idem.Outcome {
	switch code {
	case codes.Canceled, codes.Unknown, codes.DeadlineExceeded, codes.ResourceExhausted, codes.Aborted,
		codes.Unimplemented, codes.Internal, codes.Unavailable, codes.DataLoss:
		return idem.Failed
	}
	return idem.Succeeded
}

// ErrorDomain is the domain of the google.rpc.ErrorInfo detail of idem's own
// answers.
const ErrorDomain = "idem"

// problemTrailer carries the idem problem type URI of an idem answer
// (docs/problems.md), as idemconnect's Idem-Problem-Type.
const problemTrailer = "idem-problem-type"

// pushbackTrailer is gRFC A6's server pushback, which grpc-go's retry
// policy honours: the milliseconds before the next attempt.
const pushbackTrailer = "grpc-retry-pushback-ms"

// retryAfterStore is the pushback of the answers that say the store failed
// (idem's StoreRetryAfter default) or the lease was lost.
const retryAfterStore = time.Second

// kind is one kind of idem answer: its gRPC code, its problem (the
// fragment of its type URI), whether a retry helps, and its message.
type kind struct {
	err     error
	code    codes.Code
	problem string
	retry   bool
	message string
}

// kinds maps Engine.Do's errors to gRPC codes, in the order errors.Is tries
// them: the one table of idem's answers (docs/adapters.md). The codes are
// adapters/idemconnect's where the two overlap.
var kinds = []kind{
	// First: its error may wrap the cause of an unknown outcome (a store
	// error among them), and the outcome is what the client must hear.
	{idem.ErrOutcomeUnknown, codes.FailedPrecondition, "outcome-unknown", false,
		"this call is held for an operator: it made a call whose outcome cannot be known (it may have taken effect), " +
			"or its work could not be finished after its attempts; it will not run again and retrying does not help; do not send it again under a new key either"},
	{idem.ErrMissingKey, codes.InvalidArgument, "missing-key", false,
		"an idempotency key is required for this method (the idempotency-key metadata)"},
	{idem.ErrInvalidKey, codes.InvalidArgument, "invalid-key", false,
		"invalid idempotency key: one value of 1 to 255 visible ASCII characters"},
	{idem.ErrMissingScope, codes.Unauthenticated, "missing-scope", false,
		"no scope for this call: the server could not tell who owns its key"},
	{idem.ErrScopeUnstorable, codes.Internal, "scope-unstorable", false,
		"the server could not scope this call"},
	{idem.ErrKeyReused, codes.FailedPrecondition, "key-reused", false,
		"this idempotency key was first used with a different request; use a new key for a new request"},
	{idem.ErrInFlight, codes.Unavailable, "request-in-flight", true,
		"another call with this idempotency key is being processed; retry after the pushback to get its result"},
	{idem.ErrLeaseLost, codes.Unavailable, "request-in-flight", true,
		"this call's lease ran out and another call took its key over; its result was not recorded; retry with the same key to get the new owner's result"},
	{idem.ErrExecutionTimeout, codes.Unavailable, "store-unavailable", true,
		"the call ran past its time limit and its result was not recorded (its transaction's writes were rolled back); retry with the same key: it runs again"},
	{idem.ErrStoreUnavailable, codes.Unavailable, "store-unavailable", true,
		"the idempotency store did not answer; retry with the same key"},
	{idem.ErrTxAborted, codes.Internal, "transaction-aborted", true,
		"a statement in the call's transaction failed, so its writes were rolled back; retry with the same key: it runs again"},
	{idem.ErrResponseNotStored, codes.AlreadyExists, "response-not-stored", false,
		"the call with this idempotency key succeeded, but its response was not stored; it will not run again"},
	{idem.ErrResponseMissing, codes.Internal, "response-missing", false,
		"the call with this idempotency key succeeded, but its stored response is missing or damaged; it will not run again: ask the operator"},
	{idem.ErrSealKeyMissing, codes.Internal, "seal-key-missing", true,
		"the call with this idempotency key succeeded, but its stored response is sealed with a key this server does not hold; it will not run again: retry later, or ask the operator"},
	{idem.ErrSealBroken, codes.Internal, "seal-broken", false,
		"the call with this idempotency key succeeded, but its stored response failed its integrity check; it will not run again: ask the operator"},
}

// kindOf returns err's kind; an error of no kind (false) is Internal.
func kindOf(err error) (kind, bool) {
	for _, k := range kinds {
		if errors.Is(err, k.err) {
			return k, true
		}
	}
	return kind{code: codes.Internal, message: "the server could not decide this call"}, false
}

// refusal is an error of one of the kinds whose answer says the case at
// hand (the key field's name, the two keys that differ) instead of the
// kind's message.
type refusal struct {
	err     error // of the kind
	message string
}

func (r *refusal) Error() string { return r.message }
func (r *refusal) Unwrap() error { return r.err }

// keysSent is the invalid key of a call that sent a key field and metadata
// that differ, or a field and metadata that is no key, as a client that
// changes one of them on a retry sends:
// its first attempt may have run under one of them, so its answer's
// new_key_safe is false (idem.NewKeySafe reads NewKeySafe). Metadata
// repeated or a list is marked so by idem.ParseKey itself.
type keysSent struct{ error }

func (k keysSent) Unwrap() error    { return k.error }
func (k keysSent) NewKeySafe() bool { return false }

// Code returns the gRPC code idemgrpc answers for an error of Engine.Do
// (errors.Is: idem.ErrInFlight, idem.ErrKeyReused, ...), and whether a retry
// with the same key helps (then the answer carries RetryInfo and
// grpc-retry-pushback-ms).
func Code(err error) (code codes.Code, retry bool) {
	k, _ := kindOf(err)
	return k.code, k.retry
}

// answer returns idem's answer to a call for err, and sets its trailers on
// ctx's stream: idem-problem-type, and grpc-retry-pushback-ms when a retry
// helps. It sets no header, so the response is trailers-only and grpc-go's
// retry policy can retry it.
func answer(ctx context.Context, err error) error {
	k, _ := kindOf(err)
	if r := (*refusal)(nil); errors.As(err, &r) {
		k.message = r.message
	}
	if k.problem == "" {
		return status.Error(k.code, k.message)
	}
	info := &errdetails.ErrorInfo{Reason: strings.ToUpper(strings.ReplaceAll(k.problem, "-", "_")), Domain: ErrorDomain,
		Metadata: map[string]string{"type": idem.ProblemTypeBase + k.problem, "new_key_safe": strconv.FormatBool(idem.NewKeySafe(err))}}
	trailer := metadata.Pairs(problemTrailer, idem.ProblemTypeBase+k.problem)
	st := status.New(k.code, k.message)
	if k.retry {
		delay := retryAfterStore
		if ife := (*idem.InFlightError)(nil); errors.As(err, &ife) {
			delay = ife.RetryAfter
		}
		trailer.Set(pushbackTrailer, strconv.FormatInt(delay.Milliseconds(), 10))
		if with, derr := st.WithDetails(info, &errdetails.RetryInfo{RetryDelay: durationpb.New(delay)}); derr == nil {
			st = with
		}
	} else if with, derr := st.WithDetails(info); derr == nil {
		st = with
	}
	_ = grpc.SetTrailer(ctx, trailer) // outside a call (no stream): nothing to set
	return st.Err()
}

// unreconciled is the answer to a call whose handler met
// idem.ErrStepUnreconciled: Unavailable, with RetryInfo and the pushback
// (retryAfterStore), and ErrorInfo reason STEP_UNRECONCILED,
// new_key_safe false. The record is FAILED; a retry with the same key asks
// the step's reconcile function again, and never runs the step.
func unreconciled(ctx context.Context) error {
	delay := retryAfterStore
	st := status.New(codes.Unavailable, "an earlier attempt of this call made a call whose outcome is not known yet; "+
		"retry with the same key after the pushback: it is asked again, never made twice")
	info := &errdetails.ErrorInfo{Reason: "STEP_UNRECONCILED", Domain: ErrorDomain, Metadata: map[string]string{"new_key_safe": "false"}}
	if with, err := st.WithDetails(info, &errdetails.RetryInfo{RetryDelay: durationpb.New(delay)}); err == nil {
		st = with
	}
	_ = grpc.SetTrailer(ctx, metadata.Pairs(pushbackTrailer, strconv.FormatInt(delay.Milliseconds(), 10)))
	return st.Err()
}
