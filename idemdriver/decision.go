package idemdriver

import (
	"bytes"
	"fmt"
)

// Decision is what a claim decides for one request and the record it finds:
// a row of the decision table of CONTRACT section 3. Decide states the whole
// table once. A driver's claim statement decides in SQL, atomically; the
// conformance suite (idemdrivertest) drives every driver through every row
// and checks that the driver's ClaimResult is the one Decide names, and the
// core answers a request that did not win from Decide on the record it lost
// to.
type Decision int

const (
	// DecisionNew: no record for (scope, key). The claim writes a new
	// PROCESSING record: attempts 1, created_at now. Claimed.
	DecisionNew Decision = iota + 1
	// DecisionReplay: the same request, SUCCEEDED and not expired. Not
	// claimed; the core replays the stored response (CONTRACT section 5).
	DecisionReplay
	// DecisionInFlight: the same request, PROCESSING under a live lease
	// (expired or not: its handler still runs). Not claimed; the core
	// answers 409 request-in-flight with Retry-After.
	DecisionInFlight
	// DecisionKeyReused: another request (method, path or fingerprint
	// differs) under the key, and the record cannot be taken: not expired,
	// or PROCESSING under a live lease. Not claimed; the core answers 422
	// key-reused.
	DecisionKeyReused
	// DecisionTakeOver: the same request, PROCESSING past its lease (its
	// worker died or stalled), expired or not. Claimed; the record's life
	// continues: created_at (and so the relayed key, CONTRACT section 7)
	// kept, attempts+1.
	DecisionTakeOver
	// DecisionReclaim: the same request, FAILED (retryable), expired or not.
	// Claimed; the record's life continues as with DecisionTakeOver.
	DecisionReclaim
	// DecisionNewLife: an expired record (expires_at <= now) that no live
	// lease holds and that is not the same unfinished request: SUCCEEDED,
	// or another request's. Claimed; a new life starts: created_at now,
	// attempts 1, the stored response cleared.
	DecisionNewLife
	// DecisionDamaged: a record that cannot be a valid one (Record.Damaged:
	// PROCESSING without a lease bound), for any request, expired or not.
	// Whether its execution still runs cannot be told, so it is never
	// claimed: not claimed; the core answers 500 record-damaged, logs it,
	// and never runs the request; Inspector.Stuck lists it for an operator,
	// who releases the key once they know what its execution did.
	DecisionDamaged
	// DecisionUnknown: the same request, UNKNOWN (CONTRACT section 11.3:
	// an at-most-once step started and its outcome cannot be known),
	// expired or not. Not claimed; the core answers 409 outcome-unknown,
	// without Retry-After. Another request under the key is
	// DecisionKeyReused.
	DecisionUnknown
)

var decisionNames = [...]string{"", "new", "replay", "in-flight", "key-reused", "take-over", "reclaim", "new-life", "damaged", "unknown"}

// String returns the decision's name, as the docs and logs spell it
// ("new", "replay", "in-flight", "key-reused", "take-over", "reclaim",
// "new-life", "damaged", "unknown").
func (d Decision) String() string {
	if d <= 0 || int(d) >= len(decisionNames) {
		return fmt.Sprintf("Decision(%d)", int(d))
	}
	return decisionNames[d]
}

// Claims reports whether the decision claims the record: the caller owns
// the execution under a new fencing token (DecisionNew, DecisionTakeOver,
// DecisionReclaim, DecisionNewLife).
func (d Decision) Claims() bool {
	return d == DecisionNew || d == DecisionTakeOver || d == DecisionReclaim || d == DecisionNewLife
}

// Continues reports whether the claim continues the record's life: the
// record keeps created_at and counts one more attempt (DecisionTakeOver,
// DecisionReclaim). Every other claim writes created_at now and attempts 1.
// Every claim sets expires_at to now + retention and locked_until to now +
// lease.
func (d Decision) Continues() bool { return d == DecisionTakeOver || d == DecisionReclaim }

// Decide is the decision table of CONTRACT section 3 for a claim by p of
// rec, read with the database's now (rec.LeaseLeft measured against it);
// rec is nil when there is no record, and expired is expires_at <= now.
//
// In order: no record is DecisionNew, and a damaged one (Record.Damaged)
// DecisionDamaged, whatever the request. An UNKNOWN record is never claimed,
// expired or not: DecisionUnknown for the same request, DecisionKeyReused
// for another. A live lease (PROCESSING with
// LeaseLeft > 0) is never taken, expired or not: DecisionInFlight for the
// same request, DecisionKeyReused for another. The same request unfinished
// continues the record's life, expired or not: DecisionReclaim (FAILED) or
// DecisionTakeOver (PROCESSING past its lease). Otherwise an expired record
// starts a new life (DecisionNewLife); one that has not expired is
// DecisionReplay (the same request, SUCCEEDED) or DecisionKeyReused.
//
// The same request is the same method, path and fingerprint (CONTRACT
// section 4). A record a claim lost to (ClaimResult.Claimed false) is never
// expired and claimable, so the core may decide its answer with expired
// false.
func Decide(rec *Record, expired bool, p ClaimParams) Decision {
	if rec == nil {
		return DecisionNew
	}
	if rec.Damaged() {
		return DecisionDamaged
	}
	same := rec.Method == p.Method && rec.Path == p.Path && bytes.Equal(rec.Fingerprint, p.Fingerprint)
	switch {
	case rec.State == StateUnknown && same:
		return DecisionUnknown
	case rec.State == StateUnknown:
		return DecisionKeyReused
	case rec.State == StateProcessing && rec.LeaseLeft > 0 && same:
		return DecisionInFlight
	case rec.State == StateProcessing && rec.LeaseLeft > 0:
		return DecisionKeyReused
	case same && rec.State == StateFailed:
		return DecisionReclaim
	case same && rec.State == StateProcessing:
		return DecisionTakeOver
	case expired:
		return DecisionNewLife
	case same && rec.State == StateSucceeded:
		return DecisionReplay
	default:
		return DecisionKeyReused
	}
}

// Damaged reports whether r cannot be a valid record: PROCESSING without a
// lease bound (LockedUntil nil, locked_until NULL). Every claim and every
// heartbeat of a PROCESSING record writes its lease, and every write that
// clears it (Complete, Fail) leaves the state; only a hand edit or a
// partial restore leaves one, and no claim can tell whether its execution
// still runs (DecisionDamaged). A driver must set Record.LockedUntil on
// every record it reads.
func (r *Record) Damaged() bool { return r.State == StateProcessing && r.LockedUntil == nil }
