package idem

import (
	"errors"
	"fmt"
	"net/http"
	"time"

	"github.com/idemgo/idem/internal/protocol"
)

// kinds is the one table from what happened to a request (protocol.Kind)
// to its answer: the sentinel error that names its problem type
// (problemKinds gives its status and title), the observer's event, and the
// problem's detail. Do's error is the Answer's own Err (doJob.result). A
// kind added to the protocol is one row here (TestEveryKindHasARow).
var kinds = [protocol.Kinds]struct {
	err    error
	event  EventKind
	detail func(c *Config, v protocol.Answer) string
}{
	protocol.KindRan:      {nil, EventExecuted, nil},
	protocol.KindReleased: {nil, EventReleased, nil},
	protocol.KindReplay:   {nil, EventReplayed, nil},
	protocol.KindKeyReused: {ErrKeyReused, EventKeyReused, func(_ *Config, v protocol.Answer) string {
		return fmt.Sprintf("this %s was first used for %s %s; a key names one request", HeaderKey, v.Record.Method, v.Record.Path)
	}},
	protocol.KindInFlight: {ErrInFlight, EventInFlight, detailText("another request with this key is being processed; retry after the Retry-After delay to get its result")},
	protocol.KindClaimFailed: {ErrStoreUnavailable, EventStoreUnavailable,
		detailText("the idempotency store did not answer; the request was not processed, retry later with the same key")},
	protocol.KindUnstorable: {ErrScopeUnstorable, 0, detailText("the server could not scope this request")},
	protocol.KindLeaseLost: {ErrLeaseLost, EventLeaseLost, func(c *Config, _ protocol.Answer) string {
		if c.OneCommit { // no lease: the transaction lost a conflict (Galera: another node's commit of the key)
			return "this request's writes conflicted with another transaction committed first (on a database cluster, most often another request " +
				"with this key on another node), so they were rolled back and its result was not recorded; retry with the same key: " +
				"it gets that request's result, or runs again"
		}
		return "this request's lease ran out and another request took its key over; its result was not recorded; retry with the same key to get the new owner's result"
	}},
	protocol.KindTimedOut: {ErrStoreUnavailable, EventExecuted, func(c *Config, _ protocol.Answer) string {
		return fmt.Sprintf("the request ran past its time limit (%s) and its result was not recorded "+
			"(in transactional mode its writes were rolled back); retry with the same key: the request runs again", c.MaxExecution)
	}},
	protocol.KindUnreachable: {ErrStoreUnavailable, EventStoreUnavailable, func(c *Config, _ protocol.Answer) string {
		return fmt.Sprintf("the idempotency store stopped answering while the request ran, so its result was not recorded; "+
			"retry with the same key: once the store answers and the lease (%s) runs out, the request runs again", c.LeaseDuration)
	}},
	protocol.KindReleaseFailed: {ErrStoreUnavailable, EventCompletionFailed, func(_ *Config, v protocol.Answer) string {
		return fmt.Sprintf("the request was refused (status %d), but the idempotency store could not release its key; "+
			"retry the same request with the same key", v.Status)
	}},
	protocol.KindTxAborted: {ErrTxAborted, EventExecuted, func(_ *Config, v protocol.Answer) string {
		return fmt.Sprintf("the request failed: a statement in its transaction failed, so its writes were rolled back "+
			"(the server answered %d regardless); retry with the same key: the request runs again", v.Status)
	}},
	protocol.KindCompletionUnknown: {ErrStoreUnavailable, EventCompletionFailed, func(c *Config, _ protocol.Answer) string {
		return fmt.Sprintf("the idempotency store failed while recording the result; "+
			"retry with the same key: it gets the result if it was recorded, or runs again once the lease (%s) runs out", c.LeaseDuration)
	}},
	protocol.KindCompletionNotRecorded: {ErrStoreUnavailable, EventCompletionFailed, detailText("the idempotency store failed while recording the result, which was not recorded " +
		"(in transactional mode the request's writes were rolled back with it); retry with the same key: the request runs again")},
	protocol.KindCompletionMovedOn: {ErrStoreUnavailable, EventCompletionFailed, detailText("the idempotency store reported an error while recording the result, but the key's record " +
		"has moved on (the result was recorded after all, or another request took the key over); retry with the same key to get its result")},
	protocol.KindResponseMissing: {ErrResponseMissing, EventReplayed, detailText("the request with this key succeeded, but its stored response is missing from the idempotency store or damaged there; " +
		"it will not run again: ask the operator to release the key, or use a new key only if you know the first request had no effect")},
	protocol.KindSealKeyMissing: {ErrSealKeyMissing, EventReplayed, detailText("the request with this key succeeded, but its stored response is sealed with a key this server " +
		"does not hold; it will not run again: retry later with the same key, or ask the operator")},
	protocol.KindSealBroken: {ErrSealBroken, EventReplayed, detailText("the request with this key succeeded, but its stored response failed its integrity check; " +
		"it will not run again: ask the operator")},
	protocol.KindRecordDamaged: {ErrRecordDamaged, EventInFlight, detailText("the record of this key is damaged in the idempotency store (it is in progress but has no lease), " +
		"so whether the first request is still running cannot be told; it will not run again: ask the operator")},
	protocol.KindCommitFailed: {ErrStoreUnavailable, EventCompletionFailed, detailText("the idempotency store failed while committing the request's writes and result; " +
		"retry with the same key: it gets the result if the commit took effect, or the request runs again")},
	protocol.KindOverloaded: {ErrOverloaded, EventOverloaded, detailText("the server has as many requests in progress as it takes; this one was not processed " +
		"(nothing was claimed or run): retry after the Retry-After delay with the same key")},
}

func detailText(s string) func(*Config, protocol.Answer) string {
	return func(*Config, protocol.Answer) string { return s }
}

// sameOpReusedDetail is the detail of a 422 for the same method and path
// with another payload.
const sameOpReusedDetail = "this " + HeaderKey + " was first used with a different request (its body, query or media type differ); use a new key for a new request"

// eventOf is the observer's event of a: after the work ran, what became of
// the execution (recorded, released, lost, or its completion failed);
// otherwise its kind's.
func eventOf(a protocol.Answer) EventKind {
	k := kinds[a.Kind].event
	if !a.Ran {
		return k
	}
	switch a.Kind {
	case protocol.KindRan, protocol.KindTimedOut, protocol.KindTxAborted:
		if a.TookOver {
			return EventTakenOver
		}
		return EventExecuted
	case protocol.KindReleased, protocol.KindUnreachable:
		return k
	}
	// Not recorded: lost to another owner (also a one-commit COMMIT that
	// lost a conflict and was answered from the winner's record), or failed.
	if errors.Is(a.Err, ErrLeaseLost) {
		return EventLeaseLost
	}
	return EventCompletionFailed
}

// problemOf is the problem of a, which is neither a recorded nor a
// replayed answer.
func problemOf(a protocol.Answer, c *Config) Problem {
	row := kinds[a.Kind]
	detail := row.detail(c, a)
	if a.Kind == protocol.KindKeyReused && a.SameOp {
		detail = sameOpReusedDetail
	}
	p := ProblemFor(row.err, detail)
	switch {
	case a.Kind == protocol.KindInFlight:
		p.RetryAfter = a.RetryAfter
	case a.Kind == protocol.KindLeaseLost:
		p.RetryAfter = time.Second
	case p.Status == http.StatusServiceUnavailable:
		p.RetryAfter = c.StoreRetryAfter
	}
	return p
}
