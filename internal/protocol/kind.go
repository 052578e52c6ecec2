package protocol

import (
	"time"

	"github.com/idemgo/idem/idemdriver"
)

// Kind says what happened to a request: the one enumeration of outcomes.
// The front's table maps each to its HTTP problem, observer event and Do
// error; a kind that changes the state machine is also a case of
// idemdriver.Decide.
type Kind int

const (
	KindRan      Kind = iota + 1 // the outcome was recorded: the work's answer
	KindReleased                 // the record was removed: the work's answer
	KindReplay                   // the stored response
	KindKeyReused
	KindInFlight
	KindClaimFailed // the claim had no answer from the store: nothing ran
	KindUnstorable  // the store cannot hold the scope
	KindLeaseLost
	KindTimedOut    // ran past MaxExecution, recorded FAILED
	KindUnreachable // the store stopped answering while the work ran
	KindReleaseFailed
	KindTxAborted
	KindCompletionUnknown
	KindCompletionNotRecorded
	KindCompletionMovedOn
	KindCommitFailed
	KindResponseMissing // a SUCCEEDED record without its response
	KindSealKeyMissing  // a SUCCEEDED record sealed under a key not configured
	KindSealBroken      // a SUCCEEDED record whose sealed response does not authenticate
	KindRecordDamaged   // a record that cannot be a valid one (idemdriver.DecisionDamaged)
	KindOverloaded      // refused before the claim: MaxInFlight executions in flight
	KindOutcomeUnknown  // an UNKNOWN record, or this run made it one (docs/contract.md section 11.3)
	KindStepHeld        // an at-most-once step is held unreconciled: recorded FAILED whatever the work answered (section 11.2)
	kindEnd
)

// Kinds is the number of kinds plus one: a table indexed by Kind has this
// length.
const Kinds = int(kindEnd)

// Outcome is how a finished execution is recorded.
type Outcome int

const (
	// Succeeded records SUCCEEDED with the response.
	Succeeded Outcome = iota
	// Failed records FAILED: the next request with the payload runs again.
	Failed
	// Released records nothing: the record is removed.
	Released
)

// String returns SUCCEEDED, FAILED or RELEASED.
func (o Outcome) String() string {
	switch o {
	case Succeeded:
		return "SUCCEEDED"
	case Released:
		return "RELEASED"
	}
	return "FAILED"
}

// Answer is what happened to one request, the one value Engine.Run
// returns.
type Answer struct {
	Kind       Kind
	Record     idemdriver.Record // the record a lost claim was answered from, or the claimed one
	Err        error             // the cause; Do's error
	RetryAfter time.Duration     // KindInFlight
	SameOp     bool              // KindKeyReused: the same method and path, another payload
	// Cached reports an answer from the replay cache, without a statement.
	Cached bool
	// Waited reports that the request waited for another execution of its
	// key to be answered (its wait).
	Waited bool
	// Ran reports that the job ran under the claim; Status is its status,
	// TookOver that the claim took an expired lease over, Outcome how its
	// outcome was recorded.
	Ran      bool
	Status   int
	TookOver bool
	Outcome  Outcome
	// Attempt is the record's attempts after this claim (for a lost claim,
	// the record's); 0 when the claim failed.
	Attempt int
	// Claim, Handler and Completion are how long each phase took.
	Claim, Handler, Completion time.Duration
	// Panic is the job's panic, nil when it did not panic: its outcome
	// was recorded Failed, and the front answers or raises it.
	Panic *Panic
}

// Panic is a job's panic: the value recovered and the stack of the
// goroutine that panicked (runtime/debug.Stack).
type Panic struct {
	Value any
	Stack []byte
}
