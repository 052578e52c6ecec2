package idem

import (
	"errors"
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/idemgo/idem/internal/httpwrite"
	"github.com/idemgo/idem/internal/protocol"
)

// respond writes the answer to rq, a read request: its refusal, or a, what
// the protocol answered. What to answer is decided first, from the table
// below; then it is written (internal/httpwrite) and observed. A panic of
// the handler is logged and answered 500, or raised again once observed
// under an adapter that recovers it (httpwrite.RaisePanics), its stack left there.
func (m *Middleware) respond(w http.ResponseWriter, r *http.Request, rq request, a protocol.Answer) {
	var pr Problem // of a refusal, or of an answer that is neither recorded nor replayed
	var isProblem bool
	var ev Event // none for a refusal
	if rq.refusal != nil {
		pr, isProblem = ProblemFor(rq.refusal.kind, rq.refusal.detail), true
	} else {
		route := rq.job.route // the handler's, once it ran
		if route == "" {
			route = m.route(r, nil, rq.job.next)
		}
		pr, isProblem = m.problem(r, &a)
		ev = m.eng.event(a, rq.p, route)
	}

	h := w.Header()
	if rq.refusal == nil {
		h.Set(HeaderKey, rq.echo)
		if !a.Record.ExpiresAt.IsZero() && a.Kind != protocol.KindReleased {
			h[HeaderKeyExpires] = []string{m.dates.Format(a.Record.ExpiresAt)}
		}
	}
	var applied http.Header // never stored nor replayed
	if rq.asked && a.Waited {
		applied = http.Header{HeaderPreferenceApplied: {"wait=" + strconv.FormatInt(httpwrite.RetryAfterSeconds(rq.wait), 10)}}
		h[HeaderPreferenceApplied] = applied[HeaderPreferenceApplied]
	}
	if a.Kind == protocol.KindReplay { // the stored response, or its 410
		resp := a.Record.Response
		for k, v := range resp.Header {
			if !resp.BodyStored && (k == "Content-Type" || k == "Content-Encoding" || strings.HasPrefix(k, http.TrailerPrefix)) {
				continue // the body's, which is not replayed
			}
			h[k] = v // the record's own (the replay cache hands out copies)
		}
		h.Set(HeaderReplayed, "true")
	}
	var raised *httpwrite.Raised // an adapter's, which answers a panic itself
	if a.Panic != nil {
		raised = httpwrite.RaisedOf(r.Context())
	}
	raise := raised != nil
	switch {
	case raise: // an adapter's recovery answers it, in its framework's way, and logs this stack
		raised.Stack = a.Panic.Stack
	case a.Panic != nil:
		// Answered, not left to net/http: a dropped connection makes Go's
		// Transport resend a POST with an Idempotency-Key by itself, and
		// the FAILED record runs again for one client call.
		if a.Panic.Value != http.ErrAbortHandler {
			m.o.Engine.Logger.ErrorContext(r.Context(), "idem: the handler panicked; recorded FAILED, answered 500",
				"panic", fmt.Sprint(a.Panic.Value), "stack", string(a.Panic.Stack))
		}
		ev.Status = m.writeProblem(w, r, Problem{Type: "about:blank", Title: http.StatusText(http.StatusInternalServerError),
			Status: http.StatusInternalServerError})
	case isProblem:
		ev.Status = m.writeProblem(w, r, pr)
	case a.Kind == protocol.KindReplay:
		httpwrite.WriteResponse(w, a.Record.Response.Status, a.Record.Response.Body)
		ev.Status = a.Record.Response.Status
	default: // ran, or released
		rq.job.cw.Send(applied)
		ev.Status = rq.job.cw.Status()
	}
	if ev.Kind != 0 {
		m.eng.observer.Observe(r.Context(), ev)
	}
	if raise {
		panic(a.Panic.Value)
	}
}

// problem is the problem that answers a, or false for a recorded,
// released or replayed answer. A replay of a status no response may end
// with becomes a response-missing (a changed with it).
func (m *Middleware) problem(r *http.Request, a *protocol.Answer) (Problem, bool) {
	switch a.Kind {
	case protocol.KindRan, protocol.KindReleased:
		return Problem{}, false
	case protocol.KindReplay:
		resp := a.Record.Response
		if !httpwrite.FinalStatus(resp.Status) {
			// Damaged: net/http would panic sending it, dropping the connection on every retry.
			m.o.Engine.Logger.ErrorContext(r.Context(), "idem: a SUCCEEDED record holds a status outside 200-599; answering 500 response-missing, it is not run again",
				"scope", a.Record.Scope, "key", a.Record.Key, "status", resp.Status)
			*a = protocol.Answer{Kind: protocol.KindResponseMissing, Record: a.Record, Err: ErrResponseMissing}
			break
		}
		if resp.BodyStored {
			return Problem{}, false
		}
		p := ProblemFor(ErrResponseNotStored, fmt.Sprintf(
			"the request with this key succeeded with status %d, but its response (a %d-byte body) was too large to store, "+
				"for the replay limit or for what the store takes in one write, and was not kept; it will not run again",
			resp.Status, resp.BodySize))
		p.Extra = map[string]any{"original_status": resp.Status}
		return p, true
	}
	p := problemOf(*a, &m.o.Engine)
	// A failed claim logged its own cause; a refusal (MaxInFlight) is load,
	// counted by the observer, not a failure.
	if p.Status == http.StatusServiceUnavailable && a.Kind != protocol.KindClaimFailed && a.Kind != protocol.KindOverloaded && a.Kind != protocol.KindStepHeld {
		m.o.Engine.Logger.ErrorContext(r.Context(), "idem: outcome not recorded", "err", a.Err)
	}
	return p, true
}

// route is the request's route for Event.Route: the ServeMux pattern's
// path template (hr is the request the handler saw, nil when it did not
// run), else Options.Route's.
func (m *Middleware) route(r, hr *http.Request, next http.Handler) string {
	pattern := r.Pattern
	if hr != nil && hr.Pattern != "" {
		pattern = hr.Pattern
	}
	if mux, ok := next.(*http.ServeMux); ok && pattern == "" {
		_, pattern = mux.Handler(r) // wrapping the mux itself: a replay never reaches it
	}
	switch {
	case pattern != "":
		// http.route is the path template: the pattern without its method
		// and host (OpenTelemetry's HTTP semantic conventions).
		if i := strings.IndexByte(pattern, '/'); i >= 0 {
			return pattern[i:]
		}
		return pattern
	case m.o.Route != nil:
		return m.o.Route(r)
	}
	return ""
}

// writeProblem writes pr through Options.ProblemWriter, or as RFC 9457
// problem details; it returns the status sent. For a ProblemWriter, the
// answer's Retry-After (pr.RetryAfter) and Cache-Control: no-store are set
// first: the writer sends them unless it removes them.
func (m *Middleware) writeProblem(w http.ResponseWriter, r *http.Request, pr Problem) int {
	if m.o.ProblemWriter == nil {
		httpwrite.Problem(pr).Write(w)
		return pr.Status
	}
	h := w.Header()
	h.Set("Cache-Control", "no-store")
	if pr.RetryAfter > 0 {
		h.Set("Retry-After", strconv.FormatInt(httpwrite.RetryAfterSeconds(pr.RetryAfter), 10))
	}
	return httpwrite.StatusOf(w, func(w http.ResponseWriter) { m.o.ProblemWriter(w, r, pr) })
}

// ProblemFor returns the problem of the idem kind that kind matches
// (errors.Is), or a 500 about:blank. Its NewKeySafe is the kind's, false
// where kind itself says a new key is not safe (NewKeySafe).
func ProblemFor(kind error, detail string) Problem {
	for _, k := range problemKinds {
		if kind != nil && errors.Is(kind, k.err) {
			return Problem{Type: k.typeURI, Title: k.title, Status: k.status, Detail: detail, NewKeySafe: k.newKeySafe && !saysKeyUnsafe(kind)}
		}
	}
	return Problem{Type: "about:blank", Title: http.StatusText(http.StatusInternalServerError), Status: http.StatusInternalServerError, Detail: detail}
}

// kinds is the one table from what happened to a request (protocol.Kind)
// to its answer: the sentinel error that names its problem type
// (problemKinds gives its status and title), the observer's event, and the
// problem's detail. Do's error is the Answer's own Err (doJob.result). A
// kind added to the protocol is one row here (TestEveryKindHasARow).
var kinds = [protocol.Kinds]struct {
	err    error
	event  EventKind
	detail func(c *EngineOptions, v protocol.Answer) string
}{
	protocol.KindRan:      {nil, EventExecuted, nil},
	protocol.KindReleased: {nil, EventReleased, nil},
	protocol.KindReplay:   {nil, EventReplayed, nil},
	protocol.KindKeyReused: {ErrKeyReused, EventKeyReused, func(_ *EngineOptions, v protocol.Answer) string {
		return fmt.Sprintf("this %s was first used for %s %s; a key names one request", HeaderKey, v.Record.Method, v.Record.Path)
	}},
	protocol.KindInFlight: {ErrInFlight, EventInFlight, detailText("another request with this key is being processed; retry after the Retry-After delay to get its result")},
	protocol.KindClaimFailed: {ErrStoreUnavailable, EventStoreUnavailable,
		detailText("the idempotency store did not answer; the request was not processed, retry later with the same key")},
	protocol.KindUnstorable: {ErrScopeUnstorable, 0, detailText("the server could not scope this request")},
	protocol.KindLeaseLost: {ErrLeaseLost, EventLeaseLost, func(c *EngineOptions, _ protocol.Answer) string {
		if c.OneCommit.Enabled { // no lease: the transaction lost a conflict (Galera: another node's commit of the key)
			return "this request's writes conflicted with another transaction committed first (on a database cluster, most often another request " +
				"with this key on another node), so they were rolled back and its result was not recorded; retry with the same key: " +
				"it gets that request's result, or runs again"
		}
		return "this request's lease ran out and another request took its key over; its result was not recorded; retry with the same key to get the new owner's result"
	}},
	protocol.KindTimedOut: {ErrStoreUnavailable, EventExecuted, func(c *EngineOptions, _ protocol.Answer) string {
		return fmt.Sprintf("the request ran past its time limit (%s) and its result was not recorded "+
			"(its transaction's writes were rolled back); retry with the same key: the request runs again", c.Lease.MaxExecution)
	}},
	protocol.KindUnreachable: {ErrStoreUnavailable, EventStoreUnavailable, func(c *EngineOptions, _ protocol.Answer) string {
		return fmt.Sprintf("the idempotency store stopped answering while the request ran, so its result was not recorded; "+
			"retry with the same key: once the store answers and the lease (%s) runs out, the request runs again", c.Lease.Duration)
	}},
	protocol.KindReleaseFailed: {ErrStoreUnavailable, EventCompletionFailed, func(_ *EngineOptions, v protocol.Answer) string {
		return fmt.Sprintf("the request was refused (status %d), but the idempotency store could not release its key; "+
			"retry the same request with the same key", v.Status)
	}},
	protocol.KindTxAborted: {ErrTxAborted, EventExecuted, func(_ *EngineOptions, v protocol.Answer) string {
		return fmt.Sprintf("the request failed: a statement in its transaction failed, so its writes were rolled back "+
			"(the server answered %d regardless); retry with the same key: the request runs again", v.Status)
	}},
	protocol.KindCompletionUnknown: {ErrStoreUnavailable, EventCompletionFailed, func(c *EngineOptions, _ protocol.Answer) string {
		return fmt.Sprintf("the idempotency store failed while recording the result; "+
			"retry with the same key: it gets the result if it was recorded, or runs again once the lease (%s) runs out", c.Lease.Duration)
	}},
	protocol.KindCompletionNotRecorded: {ErrStoreUnavailable, EventCompletionFailed, detailText("the idempotency store failed while recording the result, which was not recorded " +
		"(the writes of the request's transaction were rolled back with it); retry with the same key: the request runs again")},
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
	protocol.KindOutcomeUnknown: {ErrOutcomeUnknown, EventOutcomeUnknown, detailText("the request with this key is held for an operator: it made a call whose outcome cannot be known " +
		"(it may have taken effect), or its work could not be finished after its attempts; it will not run again, and retrying does not help; " +
		"do not send it again under a new key either, as that could apply its effect twice")},
	// Recorded FAILED whatever the handler answered: its answer (a 2xx that
	// ignored ErrStepUnreconciled) must not tell the client it is done.
	protocol.KindStepHeld: {ErrStepUnreconciled, EventExecuted, detailText("an at-most-once step of this request was started, and whether it took " +
		"effect cannot be told yet; it is not run again until the callee tells: retry after the Retry-After delay with the same key")},
	protocol.KindOverloaded: {ErrOverloaded, EventOverloaded, detailText("the server has as many requests in progress as it takes; this one was not processed " +
		"(nothing was claimed or run): retry after the Retry-After delay with the same key")},
}

func detailText(s string) func(*EngineOptions, protocol.Answer) string {
	return func(*EngineOptions, protocol.Answer) string { return s }
}

// sameOpReusedDetail is the detail of a 422 for the same method and path
// with another payload.
const sameOpReusedDetail = "this " + HeaderKey + " was first used with a different request (its body, query or media type differ); " +
	"a retry must send the first request unchanged, and a new request needs a new key"

// eventOf is the observer's event of a: after the work ran, what became of
// the execution (recorded, released, lost, or its completion failed);
// otherwise its kind's.
func eventOf(a protocol.Answer) EventKind {
	k := kinds[a.Kind].event
	if !a.Ran {
		return k
	}
	switch a.Kind {
	case protocol.KindRan, protocol.KindTimedOut, protocol.KindTxAborted, protocol.KindStepHeld:
		if a.TookOver {
			return EventTakenOver
		}
		return EventExecuted
	case protocol.KindReleased, protocol.KindUnreachable, protocol.KindOutcomeUnknown:
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
func problemOf(a protocol.Answer, c *EngineOptions) Problem {
	row := kinds[a.Kind]
	detail := row.detail(c, a)
	p := ProblemFor(row.err, detail)
	p.NewKeySafe = p.NewKeySafe && !saysKeyUnsafe(a.Err) // a 422 of the same method and path
	if a.Kind == protocol.KindKeyReused && a.SameOp {
		p.Detail = sameOpReusedDetail
	}
	switch {
	case a.Kind == protocol.KindInFlight:
		p.RetryAfter = a.RetryAfter
	case a.Kind == protocol.KindLeaseLost:
		p.RetryAfter = time.Second
	case p.Status == http.StatusServiceUnavailable:
		p.RetryAfter = c.RetryAfter.Store
	}
	return p
}
