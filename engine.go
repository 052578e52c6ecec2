package idem

import (
	"context"
	"crypto/sha256"
	"errors"
	"fmt"
	"net/http"
	"sync/atomic"
	"time"

	"github.com/idemgo/idem/idemdriver"
	"github.com/idemgo/idem/seal"
)

// Engine runs the claim protocol of CONTRACT sections 3 to 6. Middleware is
// its HTTP front; Do runs it for other work.
type Engine struct {
	cfg   EngineConfig
	mode  mode
	waits *waitHub
	// renewer renews the leases of the executions in flight together; nil
	// when the store has no idemdriver.Renewer.
	renewer *renewer
	// inFlight counts the executions between admit and leave (MaxInFlight).
	inFlight atomic.Int64
}

// NewEngine validates cfg after WithDefaults; the error names every field.
func NewEngine(cfg EngineConfig) (*Engine, error) {
	cfg = cfg.WithDefaults()
	if err := invalid(cfg.validate()); err != nil {
		return nil, err
	}
	return newEngine(cfg), nil
}

func newEngine(cfg EngineConfig) *Engine {
	cfg.keyring, _ = seal.NewKeyring(cfg.SealKeys) // validated
	g := &Engine{cfg: cfg}
	g.waits = newWaitHub(&g.cfg)
	g.renewer = newRenewer(&g.cfg)
	if cfg.OneCommit {
		g.mode = newOneCommit(&g.cfg, g.waits)
	} else {
		g.mode = durable{g}
	}
	return g
}

// StoredKey is the key the store holds for a client's key: key itself, or
// seal.HashKey(KeyHashSecret, key) when EngineConfig.KeyHashSecret is set.
// Event.Key and idem's logs name records by it.
func (g *Engine) StoredKey(key string) string { return g.cfg.storedKey(key) }

// execute claims p's key (the stored one; clientKey is the client's),
// waiting up to wait for an execution in flight, runs j under a won claim
// and records the outcome; a panic in j is raised again after that.
func (g *Engine) execute(ctx context.Context, p idemdriver.ClaimParams, clientKey string, wait time.Duration, j job, ev *Event) verdict {
	ev.Method, ev.Scope, ev.Key = p.Method, p.Scope, p.Key
	if !g.admit() {
		ev.Kind = EventOverloaded
		return verdict{kind: answerOverloaded, err: ErrOverloaded}
	}
	defer g.leave()
	start := time.Now()
	c, v := g.mode.claim(ctx, p, wait)
	ev.Claim = time.Since(start)
	ev.Attempt = max(c.res.Record.Attempts, v.rec.Attempts)
	if v.kind != 0 {
		ev.Kind = v.event()
		if v.kind == answerClaimFailed {
			ev.Err = v.err
		}
		v.waited = c.waited
		return v
	}
	e := newExecution(&g.cfg, ctx, c, p, clientKey)
	if e.fence.Notify != "" {
		defer g.waits.wake(e.fence.Notify) // this process's waiters, at once
	}
	defer e.cancel(nil)
	defer g.mode.finish(e)
	stop := g.mode.start(e, c.sent)
	ran := time.Now()
	status, over, panicked, recovered := e.runJob(j)
	failed := over == overrideFailed
	ev.Handler = time.Since(ran)
	leaseRanOut := stop()

	recording := time.Now()
	executed := EventExecuted
	if c.res.TookOver {
		executed = EventTakenOver
	}
	end := func(kind EventKind, v verdict) verdict {
		ev.Completion = time.Since(recording)
		ev.Kind, ev.Err = kind, v.err
		v.status, v.waited = status, c.waited
		if v.rec.Key == "" { // else the record a lost COMMIT was answered from
			v.rec = c.res.Record
		}
		return v
	}
	outcome := g.cfg.Outcome(cmp0(status))
	switch {
	case e.released():
		outcome = Released
	case failed || panicked:
		outcome = Failed
	case over == overrideSucceeded:
		outcome = Succeeded
	}
	cause := context.Cause(e.ctx)
	lost, unreachable := errors.Is(cause, ErrLeaseLost), errors.Is(cause, ErrStoreUnavailable)
	// Past MaxExecution a used transaction may be gone (database/sql ends it
	// with its context) and a late outcome may expire unreplayed.
	timedOut := errors.Is(cause, ErrExecutionTimeout) && (e.txBegun() || leaseRanOut)
	switch {
	case lost:
		e.rollback()
		v = end(EventLeaseLost, verdict{kind: answerLeaseLost, err: cause})
	case unreachable:
		e.rollback()
		v = end(EventStoreUnavailable, verdict{kind: answerUnreachable, err: cause})
	case timedOut || outcome == Failed:
		e.rollback()
		if owned, err := g.mode.fail(e); !owned && err == nil {
			v = end(EventLeaseLost, verdict{kind: answerLeaseLost, err: ErrLeaseLost})
			break
		}
		ev.Outcome = Failed
		switch {
		case timedOut:
			v = end(executed, verdict{kind: answerTimedOut, err: cause})
		case failed:
			v = end(executed, verdict{kind: answerRan, err: errFnFailed})
		default:
			v = end(executed, verdict{kind: answerRan})
		}
	case outcome == Released:
		ev.Outcome = Released
		e.rollback()
		owned, err := g.mode.release(e)
		switch {
		case err != nil:
			// Mark FAILED so the same request runs again at once.
			_, _ = g.mode.fail(e)
			v = end(EventCompletionFailed, verdict{kind: answerReleaseFailed, err: err})
		case !owned:
			v = end(EventLeaseLost, verdict{kind: answerLeaseLost, err: ErrLeaseLost})
		default:
			v = end(EventReleased, verdict{kind: answerReleased})
		}
	default:
		resp := j.response()
		if n := g.cfg.KeepRequestBytes; n > 0 {
			resp.Request = seal.EncodeRequest(j.kept(n))
		}
		v = g.complete(e, resp, executed, end)
		if v.kind == answerTxAborted {
			ev.Outcome = Failed
		}
	}
	if panicked {
		ev.Status = 0
		g.observe(ctx, ev)
		panic(recovered)
	}
	return v
}

// admit counts one more execution in flight, or reports false, counting
// nothing, when MaxInFlight are in flight already: the request is then
// refused before it claims (answerOverloaded).
func (g *Engine) admit() bool {
	if g.cfg.MaxInFlight <= 0 {
		return true
	}
	if g.inFlight.Add(1) > int64(g.cfg.MaxInFlight) {
		g.inFlight.Add(-1)
		return false
	}
	return true
}

// leave ends an execution admit counted.
func (g *Engine) leave() {
	if g.cfg.MaxInFlight > 0 {
		g.inFlight.Add(-1)
	}
}

// complete records resp, plain, sealed when SealKeys are set.
func (g *Engine) complete(e *execution, resp idemdriver.Response, executed EventKind, end func(EventKind, verdict) verdict) verdict {
	cp, err := g.cfg.completion(e.fence, resp)
	if err != nil {
		e.rollback()
		_, _ = g.mode.fail(e)
		return end(EventCompletionFailed, verdict{kind: answerCompletionNotRecorded, err: err})
	}
	tx := e.endTx()
	var ok bool
	if tx == nil {
		ok, err = e.completeAlone(cp)
	} else {
		ok, err = e.completeIn(tx, cp)
	}
	switch {
	case errors.Is(err, idemdriver.ErrTxDone):
		g.cfg.Logger.ErrorContext(e.parent, "idem: the handler committed or rolled back the claim's transaction itself; leave Commit and Rollback to idem",
			"scope", e.fence.Scope, "key", e.fence.Key)
		ok, err = e.completeAlone(cp)
	case errors.Is(err, idemdriver.ErrTxAborted):
		_ = e.rollbackTx(tx)
		if resp.Status >= 200 && resp.Status < 300 {
			g.cfg.Logger.ErrorContext(e.parent, "idem: the handler answered 2xx although a statement failed in the claim's transaction, which aborted; "+
				"its writes are gone: answer an error when a statement fails", "scope", e.fence.Scope, "key", e.fence.Key, "status", resp.Status)
			if owned, ferr := g.mode.fail(e); !owned && ferr == nil {
				return end(EventLeaseLost, verdict{kind: answerLeaseLost, err: ErrLeaseLost})
			}
			return end(executed, verdict{kind: answerTxAborted, err: ErrTxAborted})
		}
		ok, err = g.mode.recordAlone(e, resp)
	}
	switch {
	case err != nil:
		if tx != nil && !isCommitError(err) {
			_ = e.rollbackTx(tx)
		}
		v := g.mode.notCompleted(e, err)
		if errors.Is(v.err, ErrLeaseLost) {
			return end(EventLeaseLost, v)
		}
		return end(EventCompletionFailed, v)
	case !ok:
		if tx != nil {
			_ = e.rollbackTx(tx)
		}
		g.cfg.Logger.WarnContext(e.parent, "idem: completion fenced out", "scope", e.fence.Scope, "key", e.fence.Key, "fencing_token", e.fence.FencingToken)
		return end(EventLeaseLost, verdict{kind: answerLeaseLost, err: ErrLeaseLost})
	}
	resp.Request = nil // the committed outcome's waiters replay it: no request
	e.committed = &resp
	return end(executed, verdict{kind: answerRan})
}

func (g *Engine) observe(ctx context.Context, e *Event) {
	if g.cfg.Observer != nil {
		g.cfg.Observer.Observe(ctx, *e)
	}
}

// DoParams names one execution of Do.
type DoParams struct {
	// Scope names the key's owner: valid UTF-8, at most MaxScopeLength bytes, no
	// NUL. Default: none (required).
	Scope string
	// Key is 1 to MaxKeyLength visible ASCII characters. Default: none (required).
	Key string
	// Method and Route are the record's method and path (Route at most
	// MaxPathLength bytes); a retry naming others gets ErrKeyReused. Default:
	// "DO" and "".
	Method, Route string
	// Fingerprint is a 32-byte SHA-256; a retry with another gets ErrKeyReused.
	// Default: the SHA-256 of Payload.
	Fingerprint []byte
	Payload     []byte
	// Wait is how long a call that finds the same work in flight waits for
	// its outcome (EngineConfig.Wait), at most EngineConfig.MaxWait; negative
	// for none. Default: EngineConfig.Wait.
	Wait time.Duration
}

// Result is Do's recorded answer, replayed byte-exact. Status 0 counts as
// 200 for Outcome and is replayed as 0.
type Result struct {
	Status int
	Header map[string][]string
	Body   []byte
}

// InFlightError is Do's ErrInFlight; RetryAfter is bounded as for HTTP.
type InFlightError struct {
	RetryAfter time.Duration
}

func (e *InFlightError) Error() string {
	return fmt.Sprintf("idem: another execution with this key is in flight; retry after %s", e.RetryAfter)
}

// Is reports true for ErrInFlight.
func (e *InFlightError) Is(target error) bool { return target == ErrInFlight }

// ErrReleased is returned by Do, with fn's Result, when nothing was recorded.
var ErrReleased = errors.New("idem: the execution was released; nothing was recorded")

// ErrOutcomeFailed is returned by Do, with fn's Result, when its status was
// recorded Failed (EngineConfig.Outcome: a 5xx, 408, 425 or 429 by
// default): nothing is replayed and the next call runs fn again.
var ErrOutcomeFailed = errors.New("idem: the outcome was recorded FAILED; the next call runs fn again")

var errFnFailed = errors.New("idem: fn failed")

// Do runs fn at most once to a recorded outcome for (p.Scope, p.Key)
// (CONTRACT sections 3 to 6). fn runs on a context detached from ctx, where
// Tx, ReleaseKey, RelayKey and ExecutionFromContext work as in a handler. An
// error from fn is recorded Failed and returned; a later call returns the
// stored Result without running fn. A panic in fn is recorded Failed and
// raised again.
//
// Errors (errors.Is): ErrInvalidKey, ErrMissingScope, ErrPathTooLong,
// ErrScopeUnstorable, ErrInFlight (*InFlightError), ErrKeyReused,
// ErrOverloaded (EngineConfig.MaxInFlight; fn did not run),
// ErrStoreUnavailable (*StoreError), ErrLeaseLost, ErrExecutionTimeout,
// ErrTxAborted, ErrReleased and ErrOutcomeFailed (with fn's Result),
// ErrResponseNotStored, ErrResponseMissing, ErrRecordDamaged (a
// PROCESSING record without a lease bound: fn does not run), ErrSealKeyMissing or
// ErrSealBroken (a sealed record this engine cannot open: fn does not run),
// or fn's own. A nil error means the Result is recorded and will be
// replayed.
func (g *Engine) Do(ctx context.Context, p DoParams, fn func(ctx context.Context) (Result, error)) (Result, error) {
	cp, err := g.doParams(p)
	if err != nil {
		return Result{}, err
	}
	ev := Event{Route: cp.Path}
	j := &doJob{g: g, fn: fn, payload: p.Payload}
	wait := g.cfg.Wait
	switch {
	case p.Wait < 0:
		wait = 0
	case p.Wait > 0:
		wait = min(p.Wait, g.cfg.MaxWait)
	}
	v := g.execute(ctx, cp, p.Key, wait, j, &ev)
	out, err := v.result(j)
	ev.Status = out.Status
	if errors.Is(ev.Err, errFnFailed) {
		ev.Err = j.err
	}
	g.observe(ctx, &ev)
	switch {
	case errors.Is(err, errFnFailed):
		return out, j.err
	case j.err != nil:
		return out, errors.Join(err, j.err)
	case err == nil && v.kind == answerRan && ev.Outcome == Failed:
		return out, fmt.Errorf("%w (status %d)", ErrOutcomeFailed, cmp0(out.Status))
	}
	return out, err
}

func (v verdict) result(j *doJob) (Result, error) {
	switch v.kind {
	case answerRan:
		return j.out, v.err
	case answerReleased:
		return j.out, ErrReleased
	case answerReplay:
		resp := v.rec.Response
		out := Result{Status: resp.Status, Header: resp.Header}
		if !resp.BodyStored {
			return out, fmt.Errorf("%w: its %d-byte result exceeded MaxResponseBytes", ErrResponseNotStored, resp.BodySize)
		}
		out.Body = resp.Body
		return out, nil
	case answerLeaseLost:
		return Result{}, fmt.Errorf("%w: the outcome was not recorded", ErrLeaseLost)
	case answerTimedOut:
		return Result{}, fmt.Errorf("idem: the execution ran past MaxExecution and was recorded FAILED: %w", ErrExecutionTimeout)
	case answerTxAborted:
		return Result{}, ErrTxAborted
	}
	return Result{}, v.err
}

type doJob struct {
	g       *Engine
	fn      func(ctx context.Context) (Result, error)
	payload []byte
	out     Result
	err     error
}

func (j *doJob) kept(limit int64) seal.Request { return keptRequest(j.payload, limit, "", "") }

// keptRequest is the request kept of body (KeepRequestBytes = limit).
func keptRequest(body []byte, limit int64, contentType, query string) seal.Request {
	r := seal.Request{ContentType: contentType, Query: query, Size: int64(len(body)), Body: body}
	if r.Size > limit {
		r.Body, r.Truncated = body[:limit], true
	}
	return r
}

func (j *doJob) run(ctx context.Context) (int, override) {
	j.out, j.err = j.fn(ctx)
	if j.err != nil {
		return http.StatusInternalServerError, overrideFailed
	}
	return j.out.Status, byPolicy
}

func (j *doJob) response() idemdriver.Response {
	resp := idemdriver.Response{Status: j.out.Status, Header: map[string][]string{}, BodySize: int64(len(j.out.Body))}
	for k, v := range j.out.Header {
		resp.Header[k] = append([]string(nil), v...)
	}
	if resp.BodySize <= j.g.cfg.MaxResponseBytes {
		resp.Body, resp.BodyStored = j.out.Body, true
	}
	return resp
}

func cmp0(status int) int {
	if status == 0 {
		return http.StatusOK
	}
	return status
}

func (g *Engine) doParams(p DoParams) (idemdriver.ClaimParams, error) {
	if k, err := ParseKey([]string{p.Key}); err != nil || k != p.Key { // as sent: no quotes, no spaces
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
	return g.claimParams(p.Scope, p.Key, method, p.Route, fp), nil
}

func (g *Engine) claimParams(scope, key, method, path string, fp []byte) idemdriver.ClaimParams {
	return idemdriver.ClaimParams{Scope: scope, Key: g.cfg.storedKey(key), Method: method, Path: path, Fingerprint: fp,
		LeaseDuration: g.cfg.LeaseDuration, Retention: g.cfg.Retention, Owner: g.cfg.Owner}
}

// mode is where durable and oneCommit differ (CONTRACT section 6).
type mode interface {
	// claim waits up to wait for an execution of p's key in flight.
	claim(ctx context.Context, p idemdriver.ClaimParams, wait time.Duration) (claimed, verdict)
	// stop reports whether the lease may have run out.
	start(e *execution, sent time.Time) (stop func() bool)
	fail(e *execution) (owned bool, err error)
	release(e *execution) (owned bool, err error)
	// recordAlone records resp, plain, outside the claim's transaction,
	// which aborted: sealed for the record it writes.
	recordAlone(e *execution, resp idemdriver.Response) (bool, error)
	notCompleted(e *execution, err error) verdict
	finish(e *execution)
}

type durable struct{ g *Engine }

func (d durable) claim(ctx context.Context, p idemdriver.ClaimParams, wait time.Duration) (claimed, verdict) {
	c, v := d.claimOnce(ctx, p)
	if v.kind != answerInFlight || wait <= 0 {
		return c, v
	}
	return d.g.waits.await(ctx, p, wait, v, func() (claimed, verdict) { return d.claimOnce(ctx, p) })
}

func (d durable) claimOnce(ctx context.Context, p idemdriver.ClaimParams) (claimed, verdict) {
	// Detached: a hang-up must not cancel a claim the database may commit.
	cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), d.g.cfg.ClaimTimeout)
	defer cancel()
	sent := time.Now()
	res, err := d.g.cfg.Store.Claim(cctx, p)
	switch {
	case err != nil:
		return claimed{}, d.g.cfg.claimFailed(ctx, err)
	case !res.Claimed:
		return claimed{res: res}, d.g.cfg.answerFrom(ctx, res.Record, p)
	}
	return claimed{res: res, sent: sent}, verdict{}
}

func (d durable) start(e *execution, sent time.Time) func() bool {
	hb := e.startHeartbeat(sent, d.g.renewer)
	return func() bool {
		hb.stop()
		return hb.leaseRanOut()
	}
}

func (durable) fail(e *execution) (bool, error) { return e.storeFail() }

func (d durable) release(e *execution) (bool, error) {
	ctx, cancel := e.detached()
	defer cancel()
	owned, err := d.g.cfg.Store.Release(ctx, e.fence)
	if err != nil {
		return false, &StoreError{Op: "release", Err: err}
	}
	return owned, nil
}

func (d durable) recordAlone(e *execution, resp idemdriver.Response) (bool, error) {
	cp, err := d.g.cfg.completion(e.fence, resp)
	if err != nil {
		return false, err
	}
	return e.completeAlone(cp)
}

// completion is the completion of resp by the execution fenced by f: resp
// sealed for f's record (its scope, key and life) when SealKeys are set,
// plain otherwise.
func (c *EngineConfig) completion(f idemdriver.FenceParams, resp idemdriver.Response) (idemdriver.CompleteParams, error) {
	stored, err := c.keyring.SealResponse(seal.Life{Scope: f.Scope, Key: f.Key, Created: f.CreatedAt}, resp)
	return idemdriver.CompleteParams{FenceParams: f, Response: stored}, err
}

func (durable) notCompleted(e *execution, err error) verdict {
	// Fail waits for an in-flight COMMIT's row lock: it marks FAILED only if
	// the outcome did not commit.
	owned, ferr := e.storeFail()
	switch {
	case !owned && e.takenOver():
		// On Galera, a certification failure against another node's takeover.
		return verdict{kind: answerLeaseLost, err: ErrLeaseLost}
	case ferr != nil:
		return verdict{kind: answerCompletionUnknown, err: err}
	case owned:
		return verdict{kind: answerCompletionNotRecorded, err: err}
	}
	return verdict{kind: answerCompletionMovedOn, err: err}
}

func (durable) finish(*execution) {}
