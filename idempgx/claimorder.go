package idempgx

import "sync/atomic"

// ClaimOrder is the order of a claim's first two statements on a plain
// table (Options.ClaimOrder): the read of the record (a plain SELECT by
// primary key) and the INSERT of a new PROCESSING record (INSERT ... ON
// CONFLICT DO NOTHING). Either order decides the same way: a new key is
// claimed by the INSERT, a record that may not be claimed is answered from
// the read (a replay, 409 or 422), and anything else (a record that may be
// claimed, a key written or removed between the two statements) goes to the
// claim statement, which decides atomically. What the order changes is the
// cost:
//
//   - read first: an existing key is one SELECT, the cheapest statement
//     PostgreSQL answers; a new key is the SELECT, which finds nothing, and
//     the INSERT, one statement and one round trip more than it needs;
//   - INSERT first: a new key is the INSERT alone, as a hand-written claim
//     would be; an existing key is the INSERT, which inserts nothing (no
//     transaction id, no WAL, but about 1.5 times a SELECT's cost to the
//     server), and the SELECT.
//
// So each order is the cheaper one for one kind of traffic: new keys
// (a service's normal traffic, where retries are a few percent) or existing
// ones (a retry storm after an outage, a consumer of redelivered messages).
// docs/benchmarks.md has the measurements.
//
// The partitioned table (NewPartitioned) has one claim shape and ignores
// the order.
type ClaimOrder int

const (
	// ClaimAdaptive, the default, follows the driver's recent claims: read
	// first while most of them met an existing record, INSERT first
	// otherwise (a majority of about the last 16 claims of the driver,
	// all scopes together; a new driver starts INSERT first). It costs an
	// atomic counter per claim, and a statement more on the claims that
	// go against the majority.
	ClaimAdaptive ClaimOrder = iota
	// ClaimReadFirst always reads first: a replay, 409 or 422 is one
	// statement, a new key two (three with the completion), whatever the
	// traffic.
	ClaimReadFirst
	// ClaimInsertFirst always sends the INSERT first: a new key is one
	// statement (two with the completion), a replay, 409 or 422 two.
	ClaimInsertFirst
)

// orderWindow bounds claimOrder's score: about how many recent claims
// ClaimAdaptive weighs, and how many claims against the majority it takes
// to change the order after a long run of one kind.
const orderWindow = 16

// claimOrder is a driver's ClaimOrder, with ClaimAdaptive's score.
type claimOrder struct {
	pinned ClaimOrder
	// score is +1 for each claim that met an existing record, -1 for each
	// that inserted a new one, kept within ±orderWindow.
	score atomic.Int32
}

// readFirst reports whether the next claim reads first.
func (o *claimOrder) readFirst() bool {
	switch o.pinned {
	case ClaimReadFirst:
		return true
	case ClaimInsertFirst:
		return false
	}
	return o.score.Load() > 0
}

// met counts a claim's first statements: existing when they met a record of
// the key (read, or in the way of the INSERT), not when the INSERT wrote
// it.
func (o *claimOrder) met(existing bool) {
	if o.pinned != ClaimAdaptive {
		return
	}
	step := int32(-1)
	if existing {
		step = 1
	}
	for {
		s := o.score.Load()
		n := s + step
		if n > orderWindow || n < -orderWindow || o.score.CompareAndSwap(s, n) {
			return
		}
	}
}
