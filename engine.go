package idem

import (
	"context"
	"crypto/sha256"
	"errors"
	"fmt"
	"net/http"
	"time"

	"github.com/idemgo/idem/idemdriver"
)

// verdict is how an owned execution ended: what its caller must be told.
// run decides it, once, for both the HTTP middleware and Do.
type verdict int

const (
	// verdictSend: the outcome was recorded (Succeeded, Failed or
	// Released): send the handler's answer.
	verdictSend verdict = iota + 1
	// verdictLeaseLost: fenced out; nothing recorded.
	verdictLeaseLost
	// verdictTimedOut: past MaxExecution, recorded FAILED.
	verdictTimedOut
	// verdictUnreachable: the lease could not be renewed; nothing recorded.
	verdictUnreachable
	// verdictReleaseFailed: a release failed; marked FAILED if the store
	// answered.
	verdictReleaseFailed
	// verdictTxAborted: a 2xx in an aborted transaction, recorded FAILED.
	verdictTxAborted
	// verdictCompletionUnknown: the completion failed and so did the FAILED
	// mark: the record's state is unknown.
	verdictCompletionUnknown
	// verdictCompletionNotRecorded: the completion failed; recorded FAILED.
	verdictCompletionNotRecorded
	// verdictCompletionMovedOn: the completion reported an error, but the
	// record moved on (recorded after all, or taken over).
	verdictCompletionMovedOn
)

// finish is run's verdict and its cause.
type finish struct {
	verdict verdict
	err     error
}

// run owns the execution of a won claim (CONTRACT sections 4 to 6): it
// starts the lease heartbeat, calls body on the execution's context, and
// records the outcome the policy names for body's status (or ReleaseKey),
// in the business transaction when body used one. response builds the
// stored response, only when it is recorded. It fills ev's Kind, Outcome,
// Err and durations; the caller sets Status and reports ev, except when
// body panicked: run then reports ev itself and raises the panic again.
//
// This is the one copy of the execution protocol: the HTTP middleware
// (execute) and Do are its users.
func (m *Middleware) run(ctx context.Context, res idemdriver.ClaimResult, p idemdriver.ClaimParams, claimSent time.Time, ev *Event,
	body func(ctx context.Context) (status int, panicked bool, recovered any), response func() idemdriver.Response) finish {
	rec := res.Record
	e := newExecution(m, ctx, rec, p)
	defer e.cancel(nil)
	hb := e.startHeartbeat(claimSent)

	ran := time.Now()
	status, panicked, recovered := body(e.ctx)
	ev.Handler = time.Since(ran)
	hb.stop()
	executed := EventExecuted
	if res.TookOver {
		executed = EventTakenOver
	}
	recording := time.Now()
	end := func(kind EventKind, v verdict, err error) finish {
		ev.Completion = time.Since(recording)
		ev.Kind, ev.Err = kind, err
		return finish{verdict: v, err: err}
	}

	cause := context.Cause(e.ctx)
	lost, unreachable := errors.Is(cause, ErrLeaseLost), errors.Is(cause, ErrStoreUnavailable)
	// Past MaxExecution a handler that used the claim's transaction cannot
	// be recorded as it answered: its context was cancelled, and
	// database/sql rolls a transaction back when the context it began on
	// ends (MySQL, SQLite), so its writes may be gone. Nor can a handler
	// that returned after its lease ran out: its record may expire before
	// anyone replays it (Config.Retention). Roll back and record FAILED
	// everywhere, so the retry runs again under the same relayed key.
	timedOut := errors.Is(cause, ErrExecutionTimeout) && (e.txBegun() || hb.leaseRanOut())
	if panicked {
		e.rollback()
		switch {
		case lost:
			end(EventLeaseLost, verdictLeaseLost, cause)
		case unreachable:
			end(EventStoreUnavailable, verdictUnreachable, cause)
		case !e.fail():
			end(EventLeaseLost, verdictLeaseLost, ErrLeaseLost)
		default:
			ev.Outcome = Failed
			end(executed, verdictSend, fmt.Errorf("idem: the handler panicked: %v", recovered))
		}
		ev.Status = 0
		m.observe(ctx, ev)
		panic(recovered)
	}
	switch {
	case lost:
		e.rollback()
		return end(EventLeaseLost, verdictLeaseLost, cause)
	case timedOut:
		e.rollback()
		if !e.fail() {
			return end(EventLeaseLost, verdictLeaseLost, ErrLeaseLost)
		}
		ev.Outcome = Failed
		return end(executed, verdictTimedOut, cause)
	case unreachable:
		// The lease could not be renewed: the outcome cannot be recorded as
		// ours. The record stays PROCESSING until its lease runs out.
		e.rollback()
		return end(EventStoreUnavailable, verdictUnreachable, cause)
	}
	outcome := e.outcome(status)
	ev.Outcome = outcome
	switch outcome {
	case Released:
		e.rollback()
		owned, err := e.release()
		switch {
		case err != nil:
			// The key could not be released: a corrected request would
			// meet key-reused. Mark it FAILED if the store answers, so the
			// same request runs again at once, and say so rather than send
			// an answer whose key stays burned.
			e.fail()
			return end(EventCompletionFailed, verdictReleaseFailed, err)
		case !owned:
			return end(EventLeaseLost, verdictLeaseLost, ErrLeaseLost)
		}
		return end(EventReleased, verdictSend, nil)
	case Failed:
		e.rollback()
		if !e.fail() {
			// another worker owns the key now: its answer counts
			return end(EventLeaseLost, verdictLeaseLost, ErrLeaseLost)
		}
		return end(executed, verdictSend, nil)
	}
	ok, err := e.complete(response())
	switch {
	case errors.Is(err, ErrTxAborted):
		m.cfg.Logger.ErrorContext(ctx, "idem: the handler answered 2xx although a statement failed in the claim's transaction, which aborted; "+
			"its writes are gone: answer an error when a statement fails", "scope", p.Scope, "key", p.Key, "status", status)
		e.rollback()
		if !e.fail() {
			return end(EventLeaseLost, verdictLeaseLost, ErrLeaseLost)
		}
		ev.Outcome = Failed
		return end(executed, verdictTxAborted, ErrTxAborted)
	case err != nil:
		// The completion (or the COMMIT that carries it) failed, perhaps
		// after it took effect. Fail is fenced on a PROCESSING record under
		// this execution's token, and waits for the row lock a transaction
		// still in flight holds: it marks the record FAILED only when the
		// outcome did not commit, so the retry runs at once instead of
		// waiting out the lease.
		owned, ferr := e.failed()
		switch {
		case !owned && e.takenOver():
			// The COMMIT failed because another request took the key over
			// (on Galera, a certification failure, 1213, against a takeover
			// on another node): the lease was lost, as on one server.
			return end(EventLeaseLost, verdictLeaseLost, ErrLeaseLost)
		case ferr != nil:
			return end(EventCompletionFailed, verdictCompletionUnknown, err)
		case owned:
			return end(EventCompletionFailed, verdictCompletionNotRecorded, err)
		}
		return end(EventCompletionFailed, verdictCompletionMovedOn, err)
	case !ok:
		m.cfg.Logger.WarnContext(ctx, "idem: completion fenced out", "scope", p.Scope, "key", p.Key, "fencing_token", rec.FencingToken)
		return end(EventLeaseLost, verdictLeaseLost, ErrLeaseLost)
	}
	return end(executed, verdictSend, nil)
}

// claim runs the claim statement, detached from the caller (a hang-up must
// not cancel a claim that the database may already have committed, which
// would leave the key PROCESSING with nobody running it for a whole lease)
// and bounded by ClaimTimeout. It returns when the statement was sent (the
// lease runs from the database's now, no earlier) and fills ev.Claim and
// ev.Attempt.
func (m *Middleware) claim(ctx context.Context, p idemdriver.ClaimParams, ev *Event) (idemdriver.ClaimResult, time.Time, error) {
	claimCtx, cancel := context.WithTimeout(context.WithoutCancel(ctx), m.cfg.ClaimTimeout)
	defer cancel()
	sent := time.Now()
	res, err := m.cfg.Store.Claim(claimCtx, p)
	ev.Claim = time.Since(sent)
	if err == nil {
		ev.Attempt = res.Record.Attempts
	}
	return res, sent, err
}

// lostTo decides, with idemdriver.Decide (the one decision table), how a
// request that did not win the claim is answered from the record it lost
// to: DecisionReplay, DecisionKeyReused, or DecisionInFlight (also for a
// record that changed between the claim and its answer: ask to come back).
func lostTo(rec idemdriver.Record, p idemdriver.ClaimParams) idemdriver.Decision {
	// A record a claim lost to is never expired and claimable (Decide's
	// doc), so expired is false.
	switch d := idemdriver.Decide(&rec, false, p); d {
	case idemdriver.DecisionReplay, idemdriver.DecisionKeyReused:
		return d
	}
	return idemdriver.DecisionInFlight
}

// Engine runs the claim protocol without net/http: the same claim, lease,
// heartbeat, fencing, outcome policy and replay as the middleware, for
// message consumers, webhooks and jobs (Do). Create it with NewEngine, or
// take a Middleware's with Middleware.Engine.
type Engine struct {
	m *Middleware
}

// NewEngine validates cfg (after WithDefaults) as New does, except that
// Scope is not required (Do's caller names the scope), and returns the
// engine. Fields that only HTTP reads (Scope, Methods, KeyOptional,
// MaxRequestBytes, ReplayHeaders, ReplayCacheBytes, ReplayCacheTTL,
// Fingerprint, Route) are ignored.
func NewEngine(cfg Config) (*Engine, error) {
	m, err := newMiddleware(cfg, false)
	if err != nil {
		return nil, err
	}
	return &Engine{m: m}, nil
}

// Engine returns the engine behind m: Do with m's store and Config.
func (m *Middleware) Engine() *Engine { return &Engine{m: m} }

// DoParams name one execution of Do.
type DoParams struct {
	// Scope names who owns the key (a tenant, a stream, a queue); the rules
	// of ScopeFunc apply (valid UTF-8, at most MaxScopeLength bytes, no
	// NUL). Required.
	Scope string
	// Key names the logical operation (a message id, a webhook's event id):
	// 1 to MaxKeyLength visible ASCII characters, as an Idempotency-Key.
	// Required.
	Key string
	// Method and Route name the operation (recorded as the record's method
	// and path, reported as Event.Method and Event.Route): a retry must name
	// the same ones, or it gets ErrKeyReused. Default Method: "DO"; Route:
	// "". Route is at most MaxPathLength bytes.
	Method, Route string
	// Fingerprint is the operation's payload fingerprint: 32 bytes (a
	// SHA-256). When nil, it is the SHA-256 of Payload (nil Payload: of
	// nothing). A retry whose fingerprint differs gets ErrKeyReused.
	Fingerprint []byte
	Payload     []byte
}

// Result is what an execution of Do answers, recorded and replayed
// byte-exact. Status is optional (0 counts as 200 for Config.Outcome and is
// replayed as 0); Header is stored whole (Config.ReplayHeaders does not
// apply).
type Result struct {
	Status int
	Header map[string][]string
	Body   []byte
}

// InFlightError is the error of Do for an operation that another execution
// owns under a live lease: errors.Is(err, ErrInFlight). RetryAfter is the
// delay to wait before trying again (Config.InFlightRetryAfter, never
// beyond the lease left, at least 1 s).
type InFlightError struct {
	RetryAfter time.Duration
}

func (e *InFlightError) Error() string {
	return fmt.Sprintf("idem: another execution with this key is in flight; retry after %s", e.RetryAfter)
}

// Is reports true for ErrInFlight.
func (e *InFlightError) Is(target error) bool { return target == ErrInFlight }

// ErrReleased is returned by Do, with fn's Result, when the execution was
// released (ReleaseKey, or the Released outcome): nothing was recorded, and
// the next call with the key runs fn again.
var ErrReleased = errors.New("idem: the execution was released; nothing was recorded")

// Do runs fn at most once to a recorded outcome for (p.Scope, p.Key), the
// engine of the middleware without net/http (CONTRACT sections 3 to 6):
//
//   - the first call claims the key, runs fn under a lease renewed by a
//     heartbeat (ctx passed to fn is detached from the caller's and
//     cancelled when the lease is lost, with context.Cause ErrLeaseLost),
//     and records the outcome Config.Outcome names for the Result's status
//     (200 when 0): Succeeded stores the Result, Failed lets the next call
//     run again. An error from fn is recorded Failed and returned as is.
//     In fn the drivers' Tx functions (idempgx.Tx, idemsqlite.Tx, ...)
//     return the claim's business transaction, committed with the outcome;
//     ReleaseKey and ExecutionFromContext work as in a handler.
//   - a later call with the same operation returns the stored Result
//     (replayed, fn not run), or an *InFlightError (ErrInFlight) while
//     another execution owns the key; one with another Method, Route or
//     fingerprint returns ErrKeyReused.
//
// Errors, for errors.Is: ErrInvalidKey and ErrScopeUnstorable (bad
// DoParams), ErrInFlight (*InFlightError), ErrKeyReused, ErrStoreUnavailable
// (a *StoreError: the claim failed and fn did not run, or the outcome could
// not be recorded), ErrLeaseLost (fenced out: fn's outcome was not
// recorded), ErrExecutionTimeout (recorded Failed), ErrTxAborted,
// ErrReleased (with fn's Result), ErrResponseNotStored (the recorded body
// exceeded MaxResponseBytes), ErrResponseMissing; or fn's own error. When
// fn panics, the record is marked FAILED and the panic raised again.
func (g *Engine) Do(ctx context.Context, p DoParams, fn func(ctx context.Context) (Result, error)) (Result, error) {
	m := g.m
	cp, err := m.doParams(p)
	if err != nil {
		return Result{}, err
	}
	ev := Event{Method: cp.Method, Route: cp.Path, Scope: cp.Scope, Key: cp.Key}
	res, claimSent, err := m.claim(ctx, cp, &ev)
	if err != nil {
		var kind error = &StoreError{Op: "claim", Err: err}
		if errors.Is(err, idemdriver.ErrUnstorable) {
			kind = fmt.Errorf("%w: %w", ErrScopeUnstorable, err)
		} else {
			m.cfg.Logger.ErrorContext(ctx, "idem: store unavailable", "err", err)
			ev.Kind, ev.Err = EventStoreUnavailable, kind
			m.observe(ctx, &ev)
		}
		return Result{}, kind
	}
	if !res.Claimed {
		out, err := m.doAnswer(ctx, res.Record, cp, &ev)
		m.observe(ctx, &ev)
		return out, err
	}
	var (
		out   Result
		fnErr error
	)
	fin := m.run(ctx, res, cp, claimSent, &ev, func(ectx context.Context) (status int, panicked bool, recovered any) {
		panicked = true
		defer func() {
			if panicked {
				recovered = recover() // run records FAILED and raises it again
			}
		}()
		out, fnErr = fn(ectx)
		panicked = false
		if fnErr != nil {
			return http.StatusInternalServerError, false, nil
		}
		return cmp0(out.Status), false, nil
	}, func() idemdriver.Response { return m.doResponse(out) })
	ev.Status = out.Status
	m.observe(ctx, &ev)
	switch fin.verdict {
	case verdictSend:
		switch {
		case fnErr != nil:
			return out, fnErr
		case ev.Kind == EventReleased:
			return out, ErrReleased
		}
		return out, nil
	case verdictTxAborted:
		return Result{}, ErrTxAborted
	case verdictLeaseLost:
		return Result{}, fmt.Errorf("%w: the outcome was not recorded", ErrLeaseLost)
	case verdictTimedOut:
		return Result{}, fmt.Errorf("idem: the execution ran past MaxExecution (%s) and was recorded FAILED: %w", m.cfg.MaxExecution, ErrExecutionTimeout)
	}
	if fnErr != nil {
		return out, errors.Join(fin.err, fnErr)
	}
	return out, fin.err
}

// cmp0 is status, or 200 when it is 0.
func cmp0(status int) int {
	if status == 0 {
		return http.StatusOK
	}
	return status
}

// doParams checks p and turns it into the claim's parameters.
func (m *Middleware) doParams(p DoParams) (idemdriver.ClaimParams, error) {
	if _, err := ParseKey([]string{p.Key}); err != nil || p.Key == "" || p.Key[0] == '"' {
		return idemdriver.ClaimParams{}, fmt.Errorf("%w: a key is 1 to %d visible ASCII characters", ErrInvalidKey, MaxKeyLength)
	}
	if p.Scope == "" {
		return idemdriver.ClaimParams{}, fmt.Errorf("%w: DoParams.Scope is required", ErrMissingScope)
	}
	if why := unstorableScope(p.Scope); why != "" {
		return idemdriver.ClaimParams{}, fmt.Errorf("%w: the scope is %s", ErrScopeUnstorable, why)
	}
	if len(p.Route) > MaxPathLength {
		return idemdriver.ClaimParams{}, fmt.Errorf("%w: DoParams.Route is longer than %d bytes", ErrPathTooLong, MaxPathLength)
	}
	fp := p.Fingerprint
	if fp == nil {
		sum := sha256.Sum256(p.Payload)
		fp = sum[:]
	} else if len(fp) != sha256.Size {
		return idemdriver.ClaimParams{}, fmt.Errorf("idem: DoParams.Fingerprint is %d bytes; it must be a %d-byte SHA-256", len(fp), sha256.Size)
	}
	method := p.Method
	if method == "" {
		method = "DO"
	}
	return idemdriver.ClaimParams{Scope: p.Scope, Key: p.Key, Method: method, Path: p.Route, Fingerprint: fp,
		LeaseDuration: m.cfg.LeaseDuration, Retention: m.cfg.Retention, Owner: m.cfg.Owner}, nil
}

// doResponse is the stored form of a Do Result.
func (m *Middleware) doResponse(out Result) idemdriver.Response {
	resp := idemdriver.Response{Status: out.Status, Header: map[string][]string{}, BodySize: int64(len(out.Body))}
	for k, v := range out.Header {
		resp.Header[k] = append([]string(nil), v...)
	}
	if resp.BodySize <= m.cfg.MaxResponseBytes {
		resp.Body, resp.BodyStored = out.Body, true
	}
	return resp
}

// doAnswer is answer for Do: the replayed Result, or the error of the
// decision; it fills ev's Kind and Status.
func (m *Middleware) doAnswer(ctx context.Context, rec idemdriver.Record, p idemdriver.ClaimParams, ev *Event) (Result, error) {
	switch lostTo(rec, p) {
	case idemdriver.DecisionKeyReused:
		ev.Kind = EventKeyReused
		return Result{}, fmt.Errorf("%w: the key was first used for %s %q with another payload or operation", ErrKeyReused, rec.Method, rec.Path)
	case idemdriver.DecisionReplay:
		ev.Kind = EventReplayed
		if rec.Response == nil {
			m.cfg.Logger.ErrorContext(ctx, "idem: a SUCCEEDED record holds no response", "scope", p.Scope, "key", p.Key)
			return Result{}, ErrResponseMissing
		}
		ev.Status = rec.Response.Status
		out := Result{Status: rec.Response.Status, Header: rec.Response.Header}
		if !rec.Response.BodyStored {
			return out, fmt.Errorf("%w: its %d-byte result exceeded MaxResponseBytes", ErrResponseNotStored, rec.Response.BodySize)
		}
		out.Body = rec.Response.Body
		return out, nil
	}
	ev.Kind = EventInFlight
	return Result{}, &InFlightError{RetryAfter: m.inFlightRetryAfter(rec.LeaseLeft)}
}
