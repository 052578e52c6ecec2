package idem

import (
	"context"
	"crypto/sha256"
	"errors"
	"fmt"
	"net/http"
	"strings"
	"time"

	"github.com/idemgo/idem/idemdriver"
	"github.com/idemgo/idem/internal/protocol"
	"github.com/idemgo/idem/seal"
)

// Engine runs the claim protocol of CONTRACT sections 3 to 6 (the
// internal/protocol package). Middleware is its HTTP front; Do runs it for
// other work.
type Engine struct {
	o        EngineOptions // defaulted
	proto    *protocol.Engine
	observer Observer // EngineOptions.Observer, or one that does nothing
}

// newEngine is the engine of store and o, validated, with the replay
// cache of cache (none when its Bytes are 0).
func newEngine(store Store, o EngineOptions, cache ReplayCacheOptions) *Engine {
	keyring, _ := seal.NewKeyring(o.Sealing.Keys) // validated
	observer := o.Observer
	if observer == nil {
		observer = ObserverFunc(func(context.Context, Event) {})
	}
	return &Engine{o: o, observer: observer, proto: protocol.New(protocol.Config{
		Store: store, LeaseDuration: o.Lease.Duration, Retention: o.Retention, Owner: o.Lease.Owner,
		Outcome:            o.Response.Outcome,
		InFlightRetryAfter: o.RetryAfter.InFlight, ClaimTimeout: o.Timeouts.Claim, CompleteTimeout: o.Timeouts.Complete,
		MaxExecution: o.Lease.MaxExecution, MaxInFlight: o.Admission.MaxInFlight, OneCommit: o.OneCommit.Enabled, OneCommitWait: o.OneCommit.Wait,
		Notify: o.Waiting.Max > 0, MaxWaiters: o.Waiting.MaxWaiters, WaitPoll: o.Waiting.Poll, Logger: o.Logger,
		Keyring: keyring, ReplayPlain: o.Sealing.ReplayPlain, KeepRequestBytes: o.Sealing.KeepRequestBytes, RelaySecret: o.RelaySecret,
		KeyHashSecret: o.Sealing.KeyHashSecret, ReplayCacheBytes: cache.Bytes, ReplayCacheTTL: cache.TTL,
	})}
}

// StoredKey is the key the store holds for a client's key: key itself, or
// seal.HashKey(KeyHashSecret, key) when EngineOptions.Sealing.KeyHashSecret is set.
// Event.Key and idem's logs name records by it.
func (eng *Engine) StoredKey(key string) string { return eng.proto.StoredKey(key) }

// Close stops the wait mode's listener (EngineOptions.Waiting.Wait: PostgreSQL's
// LISTEN connection, which otherwise ends 5 s after the last waiter left),
// and starts none again: the engine still serves, and its waiters poll. Call
// it when the engine is no longer used, as a test does. It returns nil.
func (eng *Engine) Close() error { return eng.proto.Close() }

// Waiters returns the number of requests (and Do calls) of this process
// waiting for another execution of their key: with EngineOptions.Waiting.Wait, and
// in one-commit mode those behind this process's own execution of the key.
func (eng *Engine) Waiters() int { return eng.proto.Waiters() }

// event is the observer's Event of a, an answer to a request of p.
func (eng *Engine) event(a protocol.Answer, p idemdriver.ClaimParams, route string) Event {
	ev := Event{Kind: eventOf(a), Route: route, Method: p.Method, Scope: p.Scope, Key: p.Key, Attempt: a.Attempt,
		Outcome: a.Outcome, Cached: a.Cached, Claim: a.Claim, Handler: a.Handler, Completion: a.Completion}
	if a.Ran || a.Kind == protocol.KindClaimFailed {
		ev.Err = a.Err
	}
	return ev
}

// DoParams names one execution of Do.
type DoParams struct {
	// Scope names the key's owner: valid UTF-8, at most MaxScopeLength bytes, no
	// NUL. Default: none (required).
	Scope string
	// Key is 1 to MaxKeyLength visible ASCII characters, as an Idempotency-Key
	// header carries it bare (no leading '"', no ','). Default: none (required).
	Key string
	// Method and Route are the record's method and path (Method at most
	// MaxMethodLength bytes, Route at most MaxPathLength); a retry naming
	// others gets ErrKeyReused. Default: "DO" and "".
	Method, Route string
	// Fingerprint is a 32-byte SHA-256; a retry with another gets ErrKeyReused.
	// Default: the SHA-256 of Payload.
	Fingerprint []byte
	Payload     []byte
	// Wait is how long a call that finds the same work in flight waits for
	// its outcome (EngineOptions.Waiting.Wait), at most Waiting.Max; negative
	// for none. Default: EngineOptions.Waiting.Wait.
	Wait time.Duration
}

// Result is Do's recorded answer, replayed byte-exact. Status 0 counts as
// 200 for Outcome and is replayed as 0.
type Result struct {
	Status int
	Header map[string][]string
	Body   []byte
}

// InFlightError is Do's ErrInFlight; RetryAfter is bounded as for HTTP
// (errors.Is(err, ErrInFlight) holds).
type InFlightError = protocol.InFlightError

// ErrReleased is returned by Do, with fn's Result, when nothing was recorded.
var ErrReleased = errors.New("idem: the execution was released; nothing was recorded")

// ErrOutcomeFailed is returned by Do, with fn's Result, when its status was
// recorded Failed (EngineOptions.Response.Outcome: a 5xx, 408, 425 or 429 by
// default): nothing is replayed and the next call runs fn again. It wraps
// ErrStepUnreconciled when an at-most-once step was held whatever fn
// returned (docs/contract.md section 11.2).
var ErrOutcomeFailed = errors.New("idem: the outcome was recorded FAILED; the next call runs fn again")

// Do runs fn at most once to a recorded outcome for (p.Scope, p.Key)
// (CONTRACT sections 3 to 6). fn runs on a context detached from ctx, where
// Tx, ReleaseKey, RelayKey and ExecutionFromContext work as in a handler. An
// error from fn is recorded Failed and returned; a later call returns the
// stored Result without running fn. A panic in fn is recorded Failed and
// raised again.
//
// Errors (errors.Is): ErrInvalidKey, ErrMissingScope, ErrPathTooLong,
// ErrScopeUnstorable, ErrInFlight (*InFlightError), ErrKeyReused,
// ErrOverloaded (EngineOptions.Admission.MaxInFlight; fn did not run),
// ErrStoreUnavailable (*StoreError), ErrLeaseLost, ErrExecutionTimeout,
// ErrTxAborted, ErrReleased and ErrOutcomeFailed (with fn's Result),
// ErrResponseNotStored, ErrResponseMissing, ErrRecordDamaged (a
// PROCESSING record without a lease bound: fn does not run), ErrSealKeyMissing or
// ErrSealBroken (a sealed record this engine cannot open: fn does not run),
// or fn's own. A nil error means the Result is recorded and will be
// replayed.
func (eng *Engine) Do(ctx context.Context, p DoParams, fn func(ctx context.Context) (Result, error)) (Result, error) {
	rep, err := eng.DoReport(ctx, p, fn)
	return rep.Result, err
}

// Report is what DoReport did: the Result and where it came from.
type Report struct {
	// Result is Do's: fn's, or the stored one.
	Result Result
	// Replayed is true when Result (or, with ErrResponseNotStored, its
	// status and headers) is the stored outcome of an earlier call: fn did
	// not run in this call, or ran and lost a one-commit conflict to that
	// call, its writes rolled back. The same as an HTTP answer's
	// Idempotent-Replayed: true (CONTRACT section 11.5).
	Replayed bool
	// NewKeySafe is true when sending the work again under a new key is
	// safe: fn did not run in this call and the error says nothing of it
	// ran under the key (NewKeySafe of the error; never for fn's own).
	NewKeySafe bool
}

// DoReport is Do, saying in its Report whether the Result was replayed;
// fn's own Result is never changed to say it. Errors: Do's.
func (eng *Engine) DoReport(ctx context.Context, p DoParams, fn func(ctx context.Context) (Result, error)) (Report, error) {
	if fn == nil {
		return Report{}, errors.New("idem: Do needs a function to run; nothing was claimed")
	}
	cp, err := eng.doParams(p)
	if err != nil {
		return Report{NewKeySafe: NewKeySafe(err)}, err
	}
	j := &doJob{eng: eng, fn: fn, payload: p.Payload}
	wait := eng.o.Waiting.Wait
	switch {
	case p.Wait < 0:
		wait = 0
	case p.Wait > 0:
		wait = min(p.Wait, eng.o.Waiting.Max)
	}
	a := eng.proto.Run(ctx, cp, p.Key, wait, j)
	ev := eng.event(a, cp, cp.Path)
	out, err := j.result(a)
	ev.Status = out.Status
	if errors.Is(ev.Err, protocol.ErrFnFailed) {
		ev.Err = j.err
	}
	eng.observer.Observe(ctx, ev)
	rep := Report{Result: out, Replayed: a.Kind == protocol.KindReplay, NewKeySafe: !a.Ran && NewKeySafe(err)}
	switch {
	case a.Panic != nil:
		panic(a.Panic.Value)
	case errors.Is(err, protocol.ErrFnFailed):
		return rep, j.err
	case j.err != nil && errors.Is(j.err, err): // fn returned what happened (Step's UNKNOWN)
		return rep, j.err
	case j.err != nil:
		return rep, errors.Join(err, j.err)
	case err == nil && a.Kind == protocol.KindRan && a.Outcome == protocol.Failed:
		return rep, fmt.Errorf("%w (status %d)", ErrOutcomeFailed, protocol.OrOK(out.Status))
	case a.Kind == protocol.KindStepHeld: // fn ignored ErrStepUnreconciled
		return rep, fmt.Errorf("%w (status %d): %w", ErrOutcomeFailed, protocol.OrOK(out.Status), err)
	}
	return rep, err
}

// result is Do's answer of a: fn's Result, or the stored one, and the error
// (kinds's) of what happened.
func (j *doJob) result(a protocol.Answer) (Result, error) {
	switch a.Kind {
	case protocol.KindRan, protocol.KindStepHeld:
		return j.out, a.Err
	case protocol.KindReleased:
		return j.out, ErrReleased
	case protocol.KindReplay:
		resp := a.Record.Response
		out := Result{Status: resp.Status, Header: resp.Header}
		if !resp.BodyStored {
			return out, fmt.Errorf("%w: its %d-byte result exceeded Response.MaxBytes", ErrResponseNotStored, resp.BodySize)
		}
		out.Body = resp.Body
		return out, nil
	case protocol.KindLeaseLost:
		return Result{}, fmt.Errorf("%w: the outcome was not recorded", ErrLeaseLost)
	case protocol.KindTimedOut:
		return Result{}, fmt.Errorf("idem: the execution ran past Lease.MaxExecution and was recorded FAILED: %w", ErrExecutionTimeout)
	case protocol.KindTxAborted:
		return Result{}, ErrTxAborted
	}
	return Result{}, a.Err
}

type doJob struct {
	eng     *Engine
	fn      func(ctx context.Context) (Result, error)
	payload []byte
	out     Result
	err     error
}

func (j *doJob) Kept(limit int64) seal.Request { return keptRequest(j.payload, limit, "", "") }

// Redrive: Do keeps nothing to re-drive; a queue's redelivery re-drives
// its work (docs/contract.md section 11.4).
func (j *doJob) Redrive() (seal.Request, bool) { return seal.Request{}, false }

// keptRequest is the request kept of body (KeepRequestBytes = limit).
func keptRequest(body []byte, limit int64, contentType, query string) seal.Request {
	r := seal.Request{ContentType: contentType, Query: query, Size: int64(len(body)), Body: body}
	if r.Size > limit {
		r.Body, r.Truncated = body[:limit], true
	}
	return r
}

func (j *doJob) Run(ctx context.Context) (int, protocol.Override) {
	j.out, j.err = j.fn(ctx)
	if j.err != nil {
		return http.StatusInternalServerError, protocol.OverrideFailed
	}
	return j.out.Status, protocol.ByPolicy
}

func (j *doJob) Response() idemdriver.Response {
	resp := idemdriver.Response{Status: j.out.Status, Header: map[string][]string{}, BodySize: int64(len(j.out.Body))}
	for k, v := range j.out.Header {
		resp.Header[k] = append([]string(nil), v...)
	}
	if resp.BodySize <= j.eng.o.Response.MaxBytes {
		resp.Body, resp.BodyStored = j.out.Body, true
	}
	return resp
}

func (eng *Engine) doParams(p DoParams) (idemdriver.ClaimParams, error) {
	// The key as its header carries it bare: ParseKey would unquote a
	// leading '"' and refuse a ','.
	if protocol.CheckKey(p.Key) != nil || strings.HasPrefix(p.Key, `"`) || strings.Contains(p.Key, ",") {
		return idemdriver.ClaimParams{}, fmt.Errorf("%w: a key is 1 to %d visible ASCII characters, without a leading '\"' or a ','", ErrInvalidKey, MaxKeyLength)
	}
	if p.Scope == "" {
		return idemdriver.ClaimParams{}, fmt.Errorf("%w: DoParams.Scope is required", ErrMissingScope)
	}
	if why := protocol.UnstorableScope(p.Scope); why != "" {
		return idemdriver.ClaimParams{}, fmt.Errorf("%w: the scope %s", ErrScopeUnstorable, why)
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
	} else if len(method) > MaxMethodLength {
		return idemdriver.ClaimParams{}, fmt.Errorf("idem: DoParams.Method is %d bytes; at most MaxMethodLength (%d)", len(method), MaxMethodLength)
	}
	return eng.proto.Params(p.Scope, p.Key, method, p.Route, fp), nil
}
